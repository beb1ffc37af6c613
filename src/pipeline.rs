//! The hot path to Redis: one pipelined connection per primary.
//!
//! DEDUCT and REVERT are one EVALSHA each. Sent through the redis crate's
//! cluster client, every call crosses two channels, two tasks and two
//! oneshots, builds a `Cmd` and a `Value` tree, and arms its own timer:
//! about 20 µs of stockgate's CPU per request (measured with perf and
//! benches/side_by_side), against ~1 µs of its own work. Here instead:
//!
//! - a **node pipe** per primary owns one connection, and a queue that
//!   callers write into directly: a caller encodes its EVALSHA straight
//!   into the pipe's next batch and leaves a [`Completion`] beside it, all
//!   under one short lock, with no channel, task hop or allocation per
//!   request. The pipe's task writes everything queued in one write, so
//!   many clients' requests to one node become one upstream pipeline (which
//!   also costs Redis less per command), and matches replies in order;
//! - a reply is handed over as its raw bytes ([`crate::answer`]) to the
//!   caller's [`Completion`]: a connection's [`Mailbox`] (one per client
//!   connection, many replies per wake) or, for the HTTP face and the
//!   operators' commands, a oneshot;
//! - one deadline timer per pipe: when the oldest request passes its
//!   deadline it is answered with a timeout, and its reply, if it ever
//!   comes, is dropped. Every I/O phase waits in one `select!` with that
//!   timer, so a node that stops reading (its window shut) can't hold a
//!   request past its deadline;
//! - a connection on which a request timed out with its bytes sent (its
//!   reply, or its batch's WAIT, unread) or not all written is given up
//!   at once: reset, its other requests failed over to the slow path, and
//!   a new one opened. Its bytes may be stuck
//!   for good (a black-holed flow: a dropped conntrack or NAT entry, a
//!   firewall that silently discards), where only a new connection is
//!   served, and nothing on a connection tells a stuck flow from a slow
//!   node; client libraries close a connection after a timeout for the same
//!   reason. The first new connection is opened at once; while new ones die
//!   the same way before any reply, the pipe waits [`RECONNECT_FIRST`],
//!   doubling to [`RECONNECT_MOST`], before the next (its calls take the
//!   slow path meanwhile). Each connection has TCP keepalive
//!   ([`crate::net::upstream_keepalive`]), which finds a dropped flow that
//!   carries no request;
//! - the slot table maps each of the 16384 slots to its primary's pipe; it
//!   is read without a lock and rebuilt from CLUSTER SLOTS by the health
//!   loop and after a redirect;
//! - with `--wait-replicas`, each batch ends with one `WAIT`: WAIT covers
//!   every earlier write on its connection, so one per batch confirms the
//!   whole batch (a group commit), and the batch's replies are held until it
//!   answers. Sent per request on a shared connection instead, each WAIT
//!   would block every request behind it for the whole wait timeout when a
//!   replica is gone (the fault suite measured 82 of 86 requests timing out);
//! - requests that may share one call (a hot SKU's DEDUCTs,
//!   [`Pipelines::submit_joinable`]) gather in the queue while they wait:
//!   each joins the call of those before it with the same join key, and
//!   the pipe writes the gathered call once ([`Join`]). While an earlier
//!   call of that key is still in Redis, the gathered one stays queued and
//!   keeps gathering: Redis would run it only after that call anyway, and
//!   one call of n deductions costs it far less than n calls. Each member
//!   keeps its own completion: the call's array reply is split into one
//!   reply per member, in order, and an error of the whole call goes to
//!   each of them.
//!
//! Anything out of the ordinary (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
//! NOSCRIPT, READONLY, a connection lost mid-request) is not handled here:
//! the request goes again through the redis crate (see
//! [`crate::upstream`]), which owns redirects, retries and reconnection.
//! Sending it again is safe because the scripts are idempotent by
//! request_id, and a resend of the same call answers as the first did.

use crate::answer::{self, Shape};
use crate::config::Durability;
use crate::keys::SLOTS;
use crate::reply::encode_command;
use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Requests one pipe holds before it has taken them into a batch. Past it,
/// a caller is refused at once: a node that stopped reading must not
/// queue requests without bound (measured before this bound: 2.8 MB
/// queued after 10 s of a zero-window node under load).
const MAX_WAITING: usize = 16 * 1024;

/// After a failed connect, or a connection given up before it answered
/// anything, the pipe refuses calls (they take the slow path) for a while
/// before it tries again: from this, doubling each time...
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
/// ...up to this.
const RECONNECT_MOST: Duration = Duration::from_secs(2);

/// How the node pipes log in.
#[derive(Debug, Clone, Default)]
pub struct Login {
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

/// Why a call through a pipe got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeError {
    /// The deadline passed; the request may or may not have run.
    Timeout,
    /// No connection, or it was lost; the request may or may not have run.
    Lost,
    /// The pipe already holds [`MAX_WAITING`] requests: the node is not
    /// keeping up. This request was not sent.
    Overloaded,
}

/// Requests gathered into one call ([`Pipelines::submit_joinable`]), as the
/// [`Join`] that writes the call gets them.
#[derive(Default)]
pub struct Gathered {
    /// What the members share, written by the first one's `shared`.
    pub shared: BytesMut,
    /// Each member's parts, one after the other.
    pub parts: BytesMut,
    /// Places in `parts` the encoders marked, in order: as many per member
    /// as its [`Join`] asks for (a member's parts end at its last mark).
    pub marks: Vec<usize>,
    /// How many members.
    pub members: usize,
}

/// How requests that may share one call are written into a batch.
pub trait Join: Send + Sync {
    /// Most members one call may have.
    fn most(&self) -> usize;
    /// Writes the call of `gathered`'s members into `out`: one member's own
    /// call when it has one member, else one call of them all.
    fn write(&self, gathered: &Gathered, out: &mut BytesMut);

    /// The reply of a call of `members` (two or more), as each member's
    /// reply, in order; `None` when it is not what the call answers (an
    /// error of the whole call), which then is each member's answer. By
    /// default the reply is an array of the members' replies.
    fn split(&self, frame: &Bytes, members: usize) -> Option<Vec<Bytes>> {
        Some(answer::elements(frame, members)?.collect())
    }
}

/// A reply, and with `--wait-replicas` how many replicas confirmed the
/// batch it was in (-1 when WAIT itself failed).
#[derive(Debug)]
pub struct Answer {
    /// The reply's bytes, as Redis sent them (see [`crate::answer`]).
    pub frame: Bytes,
    pub replicas: Option<i64>,
}

/// What a call's answer, or its failure, is handed to.
pub enum Completion {
    /// A oneshot one caller awaits.
    Oneshot(oneshot::Sender<Result<Answer, PipeError>>),
    /// A client connection's mailbox, under the request's ticket.
    Mailbox(Arc<Mailbox>, u64),
}

impl Completion {
    fn complete(self, result: Result<Answer, PipeError>) {
        match self {
            Completion::Oneshot(reply) => {
                let _ = reply.send(result);
            }
            Completion::Mailbox(mailbox, ticket) => mailbox.deliver(ticket, result),
        }
    }
}

/// Where a client connection's answers arrive from the pipes, in any order,
/// each under the ticket it was sent with; one wake for however many
/// arrived meanwhile.
#[derive(Default)]
pub struct Mailbox {
    arrived: Mutex<Vec<(u64, Result<Answer, PipeError>)>>,
    waker: AtomicWaker,
}

impl Mailbox {
    fn deliver(&self, ticket: u64, result: Result<Answer, PipeError>) {
        lock(&self.arrived).push((ticket, result));
        self.waker.wake();
    }

    /// Swaps what has arrived into `into` (empty), without waiting; false
    /// when nothing has.
    pub fn take(&self, into: &mut Vec<(u64, Result<Answer, PipeError>)>) -> bool {
        let mut arrived = lock(&self.arrived);
        if arrived.is_empty() {
            return false;
        }
        std::mem::swap(&mut *arrived, into);
        true
    }

    /// Ready when something has arrived; registers the task to be woken
    /// when something does otherwise. ([`Mailbox::take`] collects it.)
    pub fn poll_wake(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        if lock(&self.arrived).is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// A wake-up flag for one task: raised by any number of callers, lowered by
/// the task when it looks. Cheaper than a `Notify` on the hot path: the
/// pipe's task waits on it every time round its loop, and a `Notified`
/// future enlists in a locked waiter list each time (callgrind: about 400
/// instructions per request).
#[derive(Default)]
struct Signal {
    raised: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Ready (and lowered) once raised.
    fn poll_lower(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.raised.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Raised between the check and the registration: don't sleep on it.
        if self.raised.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// A lock that a panic elsewhere doesn't poison for good: what it guards
/// (queues of bytes and completions) stays consistent at every await.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A request queued for the pipe's next batch, its bytes in the queue's
/// `output` up to `end`, after the previous waiter's.
struct Waiter {
    /// `None` once answered (a timeout before it was sent).
    completion: Option<Completion>,
    deadline: Instant,
    end: usize,
    part: Part,
}

/// A waiter's share of the call its bytes are part of.
#[derive(Clone)]
enum Part {
    /// A call of its own.
    Own,
    /// The first of the `members` of a gathered call (1: a joinable request
    /// that had no company) of join key hash `join`.
    Lead {
        members: usize,
        join: u64,
        writer: Arc<dyn Join>,
    },
    /// A later member of the call its lead heads.
    Member,
}

/// The gathered call still open to new members: the queue's last
/// `gathered.members` waiters, from `first`, whose bytes are not in
/// `output` yet.
#[derive(Default)]
struct Open {
    join: Option<Arc<dyn Join>>,
    key: Vec<u8>,
    hash: u64,
    first: usize,
    gathered: Gathered,
}

impl Open {
    fn is_open(&self) -> bool {
        self.gathered.members > 0
    }

    fn takes(&self, join: &Arc<dyn Join>, key: &[u8]) -> bool {
        self.is_open()
            && self.key == key
            && self.join.as_ref().is_some_and(|j| Arc::ptr_eq(j, join))
            && !self.full()
    }

    fn full(&self) -> bool {
        self.join
            .as_ref()
            .is_some_and(|j| self.gathered.members >= j.most())
    }

    fn clear(&mut self) {
        self.join = None;
        self.key.clear();
        self.gathered.shared.clear();
        self.gathered.parts.clear();
        self.gathered.marks.clear();
        self.gathered.members = 0;
    }
}

/// The hash a gathered call is held by: two keys that share one only hold
/// each other's call back a little, never join (joining compares the keys).
fn join_hash(key: &[u8]) -> u64 {
    // FNV-1a: a few instructions per byte, no setup.
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What callers and the pipe's task share.
struct Queue {
    /// Encoded requests the task has not taken yet.
    output: BytesMut,
    waiting: VecDeque<Waiter>,
    /// After a failed connect, calls are refused until then.
    refuse_until: Option<Instant>,
    /// The pipe left the slot table: finish what is in flight, then stop.
    retired: bool,
    /// The gathered call still taking members, if any.
    open: Open,
    /// The task left the open call queued (an earlier call of its key is
    /// in Redis): a request that doesn't join it must wake the task.
    holding: bool,
}

impl Queue {
    /// Writes the open gathered call into `output`: from now on it is bytes
    /// like any other request's.
    fn close_open(&mut self) {
        if !self.open.is_open() {
            return;
        }
        // The call's writer moves to its lead, which splits the reply.
        let Some(join) = self.open.join.take() else {
            return;
        };
        join.write(&self.open.gathered, &mut self.output);
        let end = self.output.len();
        let members = self.open.gathered.members;
        let first = self.open.first;
        debug_assert_eq!(self.waiting.len() - first, members);
        let hash = self.open.hash;
        let mut writer = Some(join);
        for waiter in self.waiting.range_mut(first..) {
            waiter.end = end;
            waiter.part = match writer.take() {
                Some(writer) => Part::Lead {
                    members,
                    join: hash,
                    writer,
                },
                None => Part::Member,
            };
        }
        self.open.clear();
    }
}

/// How a pipe's connection behaves.
#[derive(Debug, Clone)]
struct PipeSettings {
    login: Login,
    connect_timeout: Duration,
    /// The `WAIT` that ends each batch, with `--wait-replicas`.
    wait: Option<Bytes>,
}

struct PipeInner {
    addr: String,
    queue: Mutex<Queue>,
    /// Wakes the task: work was queued, or the pipe was retired.
    work: Signal,
}

/// One primary's pipelined connection, served by its own task; dropping
/// the last handle (the slot table no longer names it) retires the task.
pub struct NodePipe {
    inner: Arc<PipeInner>,
}

impl Drop for NodePipe {
    fn drop(&mut self) {
        lock(&self.inner.queue).retired = true;
        self.inner.work.raise();
    }
}

impl NodePipe {
    fn start(addr: String, settings: PipeSettings) -> Arc<NodePipe> {
        let inner = Arc::new(PipeInner {
            addr,
            queue: Mutex::new(Queue {
                output: BytesMut::new(),
                waiting: VecDeque::new(),
                refuse_until: None,
                retired: false,
                open: Open::default(),
                holding: false,
            }),
            work: Signal::default(),
        });
        tokio::spawn(run(inner.clone(), settings));
        Arc::new(NodePipe { inner })
    }

    fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Queues one request: `encode` writes it at the end of the next batch.
    fn submit(
        &self,
        deadline: Instant,
        completion: Completion,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<(), (PipeError, Completion)> {
        let mut queue = lock(&self.inner.queue);
        if let Err(refused) = admit(&mut queue) {
            return Err((refused, completion));
        }
        // Whatever gathered before it goes first: a client's requests to one
        // node are sent in the order it sent them.
        queue.close_open();
        encode(&mut queue.output);
        let end = queue.output.len();
        queue.waiting.push_back(Waiter {
            completion: Some(completion),
            deadline,
            end,
            part: Part::Own,
        });
        let wake = queue.waiting.len() == 1 || queue.holding;
        drop(queue);
        if wake {
            // The task takes everything queued when it wakes; one wake for
            // the batch. (The signal stays raised for a task not waiting yet.)
            self.inner.work.raise();
        }
        Ok(())
    }

    /// Queues one request that may share a call: it joins the open gathered
    /// call when that has the same `key` and `join` and room left, or opens
    /// one (`shared` writes what its members share). `member` writes its own
    /// parts either way.
    fn submit_joinable(
        &self,
        deadline: Instant,
        completion: Completion,
        joinable: Joinable<'_>,
        shared: impl FnOnce(&mut Gathered),
        member: impl FnOnce(&mut Gathered),
    ) -> Result<(), (PipeError, Completion)> {
        let mut queue = lock(&self.inner.queue);
        if let Err(refused) = admit(&mut queue) {
            return Err((refused, completion));
        }
        let joins = queue.open.takes(joinable.join, joinable.key);
        if !joins {
            queue.close_open();
            let first = queue.waiting.len();
            let open = &mut queue.open;
            open.join = Some(joinable.join.clone());
            open.key.extend_from_slice(joinable.key);
            open.hash = join_hash(joinable.key);
            open.first = first;
            shared(&mut open.gathered);
        }
        member(&mut queue.open.gathered);
        queue.open.gathered.members += 1;
        queue.waiting.push_back(Waiter {
            completion: Some(completion),
            deadline,
            // Set when the call is written.
            end: 0,
            part: Part::Own,
        });
        // A member joining a call the task holds back goes with it, once
        // the call before it answers; anything else wakes the task.
        let wake = queue.waiting.len() == 1 || (queue.holding && !joins) || queue.open.full();
        drop(queue);
        if wake {
            self.inner.work.raise();
        }
        Ok(())
    }
}

/// Whether the pipe takes one more request now.
fn admit(queue: &mut Queue) -> Result<(), PipeError> {
    if queue.retired {
        return Err(PipeError::Lost);
    }
    if let Some(until) = queue.refuse_until {
        if Instant::now() < until {
            return Err(PipeError::Lost);
        }
        queue.refuse_until = None;
    }
    if queue.waiting.len() >= MAX_WAITING {
        return Err(PipeError::Overloaded);
    }
    Ok(())
}

/// A request's claim to share a call ([`Pipelines::submit_joinable`]).
pub struct Joinable<'a> {
    /// Requests join only with the same key (a DEDUCT's: its stock key)...
    pub key: &'a [u8],
    /// ...and the same writer.
    pub join: &'a Arc<dyn Join>,
}

/// Which pipe serves each slot.
struct Routes {
    /// Index into `pipes` per slot; `u16::MAX` where no primary is known.
    owners: Vec<u16>,
    pipes: Vec<Arc<NodePipe>>,
}

/// The pipes and the slot table.
pub struct Pipelines {
    routes: ArcSwap<Routes>,
    settings: PipeSettings,
    /// Set when a reply said the slot table is stale.
    stale: AtomicBool,
}

impl Pipelines {
    pub fn new(
        login: Login,
        connect_timeout: Duration,
        durability: Option<Durability>,
    ) -> Pipelines {
        let wait = durability.map(|d| {
            encode_command(&[
                b"WAIT",
                d.replicas.to_string().as_bytes(),
                d.timeout.as_millis().to_string().as_bytes(),
            ])
        });
        Pipelines {
            routes: ArcSwap::from_pointee(Routes {
                owners: Vec::new(),
                pipes: Vec::new(),
            }),
            settings: PipeSettings {
                login,
                connect_timeout,
                wait,
            },
            stale: AtomicBool::new(false),
        }
    }

    /// Replaces the slot table. `ranges` are `(first, last, "host:port")`
    /// of each primary's slots; a standalone Redis is one range over all
    /// slots. Pipes to nodes that stay are kept, connection and all.
    pub fn set_routes(&self, ranges: &[(u16, u16, String)]) {
        let current = self.routes.load();
        let mut by_addr: HashMap<&str, usize> = HashMap::new();
        let mut pipes: Vec<Arc<NodePipe>> = Vec::new();
        let mut owners = vec![u16::MAX; SLOTS as usize];
        for (first, last, addr) in ranges {
            let index = *by_addr.entry(addr.as_str()).or_insert_with(|| {
                let pipe = current
                    .pipes
                    .iter()
                    .find(|p| p.addr() == *addr)
                    .cloned()
                    .unwrap_or_else(|| NodePipe::start(addr.clone(), self.settings.clone()));
                pipes.push(pipe);
                pipes.len() - 1
            });
            for slot in *first..=(*last).min(SLOTS - 1) {
                owners[slot as usize] = index as u16;
            }
        }
        self.routes.store(Arc::new(Routes { owners, pipes }));
        self.stale.store(false, Ordering::Relaxed);
    }

    /// Marks the slot table stale (a MOVED said so); the health loop
    /// rebuilds it soon.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Queues a request for the primary of `slot`: `encode` writes it into
    /// that pipe's next batch, and its answer goes to `completion`. Refused
    /// at once (the completion handed back) when no pipe serves the slot,
    /// the pipe is reconnecting, or it holds too many requests already.
    pub fn submit(
        &self,
        slot: u16,
        deadline: Instant,
        completion: Completion,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<(), (PipeError, Completion)> {
        let routes = self.routes.load();
        match routes.owners.get(slot as usize) {
            Some(&index) if index != u16::MAX => {
                routes.pipes[index as usize].submit(deadline, completion, encode)
            }
            _ => Err((PipeError::Lost, completion)),
        }
    }

    /// [`Pipelines::submit`] of a request that may share one call with
    /// others of the same join key queued on the same pipe at the same
    /// time (see the module's notes). `shared` writes what a call's members
    /// share (run for the first), `member` each one's own parts; the
    /// [`Join`] writes the call from them.
    pub fn submit_joinable(
        &self,
        slot: u16,
        deadline: Instant,
        completion: Completion,
        joinable: Joinable<'_>,
        shared: impl FnOnce(&mut Gathered),
        member: impl FnOnce(&mut Gathered),
    ) -> Result<(), (PipeError, Completion)> {
        let routes = self.routes.load();
        match routes.owners.get(slot as usize) {
            Some(&index) if index != u16::MAX => routes.pipes[index as usize]
                .submit_joinable(deadline, completion, joinable, shared, member),
            _ => Err((PipeError::Lost, completion)),
        }
    }

    /// [`Pipelines::submit`], then waits for the answer, never past
    /// `deadline`: the pipe answers a timeout itself, and this wait is
    /// bounded too, so a pipe that cannot run never holds a caller.
    pub async fn call(
        &self,
        slot: u16,
        deadline: Instant,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<Answer, PipeError> {
        let (reply, answer) = oneshot::channel();
        if let Err((refused, _)) = self.submit(slot, deadline, Completion::Oneshot(reply), encode) {
            return Err(refused);
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(answer) => answer.unwrap_or(Err(PipeError::Lost)),
            Err(_) => Err(PipeError::Timeout),
        }
    }
}

/// What the connection owes, in order.
enum InFlight {
    /// A request; `completion` is `None` once answered with a timeout, and
    /// its late reply is then dropped.
    Call {
        completion: Option<Completion>,
        deadline: Instant,
    },
    /// The WAIT closing a batch.
    Wait,
    /// The reply of the next `members` calls is one (an array, one reply
    /// per member; or an error for all): the head of a gathered call of
    /// join key hash `join`.
    Joined {
        members: usize,
        join: u64,
        writer: Arc<dyn Join>,
    },
}

/// A reply waiting for its batch's WAIT.
struct Held {
    completion: Option<Completion>,
    deadline: Instant,
    frame: Bytes,
}

/// A pipe's task: connect when there is work, serve until the connection
/// fails, fail what was in flight, and start over. A failed connect makes
/// the pipe refuse calls for a backoff (they take the slow path at once)
/// instead of trying again for every request; so does a connection given
/// up (a request timed out on it) that never answered anything, as a new
/// connection to a node whose every flow sticks would be.
async fn run(pipe: Arc<PipeInner>, settings: PipeSettings) {
    let mut backoff = RECONNECT_FIRST;
    loop {
        let (retired, idle) = {
            let queue = lock(&pipe.queue);
            (queue.retired, queue.waiting.is_empty())
        };
        if retired && idle {
            return;
        }
        if idle {
            std::future::poll_fn(|cx| pipe.work.poll_lower(cx)).await;
            continue;
        }
        let connect = connect(&pipe.addr, &settings.login);
        let stream = match tokio::time::timeout(settings.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            outcome => {
                tracing::debug!(addr = %pipe.addr, ?outcome, ?backoff, "node pipe cannot connect");
                refuse_for(&pipe, backoff);
                backoff = (backoff * 2).min(RECONNECT_MOST);
                continue;
            }
        };
        match serve(stream, &pipe, &settings).await {
            Served::Dead { answered } => {
                // A reconnect at once may find the node well and only the
                // flow stuck; a connection that died before it answered
                // anything says the node (or every flow to it) is stuck,
                // and the next one waits longer.
                if answered {
                    backoff = RECONNECT_FIRST;
                    tracing::warn!(addr = %pipe.addr, "node pipe gave up a connection on which a request timed out; reconnecting");
                } else {
                    tracing::debug!(addr = %pipe.addr, ?backoff, "node pipe gave up a new connection that answered nothing");
                    refuse_for(&pipe, backoff);
                    backoff = (backoff * 2).min(RECONNECT_MOST);
                }
            }
            Served::Ended(result) => {
                backoff = RECONNECT_FIRST;
                if let Err(err) = result {
                    tracing::debug!(addr = %pipe.addr, %err, "node pipe connection ended");
                }
            }
        }
    }
}

/// Fails everything waiting over to the slow path, and refuses what comes
/// (it takes the slow path too) for `backoff`.
fn refuse_for(pipe: &PipeInner, backoff: Duration) {
    let failed = {
        let mut queue = lock(&pipe.queue);
        queue.refuse_until = Some(Instant::now() + backoff);
        queue.output.clear();
        queue.open.clear();
        queue.holding = false;
        std::mem::take(&mut queue.waiting)
    };
    for waiter in failed {
        if let Some(completion) = waiter.completion {
            completion.complete(Err(PipeError::Lost));
        }
    }
}

async fn connect(addr: &str, login: &Login) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    crate::net::keep_alive(&stream)?;
    let mut hello: Vec<Bytes> = Vec::new();
    if let Some(password) = &login.password {
        hello.push(match &login.username {
            Some(user) => encode_command(&[b"AUTH", user.as_bytes(), password.as_bytes()]),
            None => encode_command(&[b"AUTH", password.as_bytes()]),
        });
    }
    if login.db != 0 {
        hello.push(encode_command(&[
            b"SELECT",
            login.db.to_string().as_bytes(),
        ]));
    }
    if hello.is_empty() {
        return Ok(stream);
    }
    for command in &hello {
        stream.write_all(command).await?;
    }
    let mut buf = BytesMut::with_capacity(256);
    let mut answered = 0;
    while answered < hello.len() {
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        while let Some(len) = answer::frame_len(&buf).map_err(std::io::Error::other)? {
            let frame = buf.split_to(len).freeze();
            if matches!(answer::shape(&frame), Shape::Error(_)) {
                return Err(std::io::Error::other("AUTH or SELECT refused"));
            }
            answered += 1;
        }
    }
    Ok(stream)
}

/// One connection's life: batches out, replies in, deadlines kept.
struct Conversation<'a> {
    in_flight: VecDeque<InFlight>,
    held: Vec<Held>,
    /// The batch being written now (ended by its WAIT, if any).
    writing: BytesMut,
    /// Requests queued since the last WAIT.
    unconfirmed: usize,
    /// A WAIT written and not yet answered. While one is, the next batch
    /// stays queued: Redis would run its WAIT only after this one anyway,
    /// and everything arriving meanwhile joins it.
    waiting: bool,
    /// The join key hashes of the gathered calls in Redis now, one per call,
    /// in the order they were sent (so answered): an open call of one of
    /// them stays queued, gathering.
    joins_in_flight: VecDeque<u64>,
    settings: &'a PipeSettings,
}

impl Conversation<'_> {
    /// Takes what callers queued into the next batch, once the last batch
    /// is written (and its WAIT answered): their bytes in one move, their
    /// completions in order behind the ones already in flight.
    ///
    /// Requests already past their deadline are answered with a timeout
    /// and not sent at all: after a node stalled, the queue is full of
    /// requests nobody waits for any more, and sending them would have the
    /// node run them all before anything new (and a load that keeps the
    /// queue full would never be served in time again).
    fn take_batch(&mut self, queue: &mut Queue, now: Instant) {
        if !self.writing.is_empty() || self.waiting || queue.waiting.is_empty() {
            return;
        }
        // An open gathered call whose key has a call in Redis stays queued:
        // Redis would run it only after that one anyway, and what arrives
        // meanwhile joins it. Everything queued before it goes now.
        let hold = queue.open.is_open()
            && !queue.open.full()
            && self.joins_in_flight.contains(&queue.open.hash);
        queue.holding = hold;
        if !hold {
            queue.close_open();
        }
        let take = if hold {
            queue.open.first
        } else {
            queue.waiting.len()
        };
        if take == 0 {
            return;
        }
        // Requests are queued in arrival order with one --timeout: when the
        // first is still owed and in time, so are (near enough) the rest.
        let front_live = queue
            .waiting
            .front()
            .is_some_and(|w| w.completion.is_some() && w.deadline > now);
        if front_live {
            // A swap: the queue gets the emptied buffer of the last batch,
            // so a busy pipe allocates none. (An open call's bytes are not
            // in it yet.)
            std::mem::swap(&mut self.writing, &mut queue.output);
            for waiter in queue.waiting.drain(..take) {
                self.push_call(waiter.part, waiter.completion, waiter.deadline);
            }
        } else {
            // Rare (after a stall): copy only the live requests' bytes; a
            // gathered call goes when any of its members is live.
            let waiters: Vec<Waiter> = queue.waiting.drain(..take).collect();
            let mut waiters = waiters.into_iter();
            let mut start = 0;
            while let Some(lead) = waiters.next() {
                let members = match lead.part {
                    Part::Lead { members, .. } => members,
                    Part::Own | Part::Member => 1,
                };
                let mut call = Vec::with_capacity(members);
                call.push(lead);
                call.extend(waiters.by_ref().take(members - 1));
                let end = call.last().map_or(start, |w| w.end);
                let live = call
                    .iter()
                    .any(|w| w.completion.is_some() && w.deadline > now);
                if live {
                    self.writing.extend_from_slice(&queue.output[start..end]);
                }
                for waiter in call {
                    let completion = match waiter.completion {
                        Some(completion) if waiter.deadline > now => Some(completion),
                        Some(late) => {
                            late.complete(Err(PipeError::Timeout));
                            None
                        }
                        None => None,
                    };
                    if live {
                        self.push_call(waiter.part, completion, waiter.deadline);
                    }
                }
                start = end;
            }
            queue.output.clear();
        }
        if hold {
            queue.open.first -= take;
        }
        if let Some(wait) = &self.settings.wait
            && self.unconfirmed > 0
        {
            self.writing.extend_from_slice(wait);
            self.in_flight.push_back(InFlight::Wait);
            self.unconfirmed = 0;
            self.waiting = true;
        }
    }

    /// One call taken into the batch, as what the connection owes.
    fn push_call(&mut self, part: Part, completion: Option<Completion>, deadline: Instant) {
        if let Part::Lead {
            members,
            join,
            writer,
        } = part
        {
            self.in_flight.push_back(InFlight::Joined {
                members,
                join,
                writer,
            });
            self.joins_in_flight.push_back(join);
        }
        self.in_flight.push_back(InFlight::Call {
            completion,
            deadline,
        });
        self.unconfirmed += 1;
    }

    /// Matches one reply to what it answers. `Err` when nothing was owed.
    fn answer(&mut self, frame: Bytes) -> Result<(), ()> {
        match self.in_flight.pop_front().ok_or(())? {
            InFlight::Call {
                completion,
                deadline,
            } => self.settle(completion, deadline, frame),
            InFlight::Wait => {
                self.waiting = false;
                let replicas = match answer::shape(&frame) {
                    Shape::Integer(n) => n,
                    _ => -1,
                };
                for held in self.held.drain(..) {
                    if let Some(completion) = held.completion {
                        completion.complete(Ok(Answer {
                            frame: held.frame,
                            replicas: Some(replicas),
                        }));
                    }
                }
            }
            InFlight::Joined {
                members,
                join,
                writer,
            } => {
                // Replies come in the order calls went: this is the oldest.
                let oldest = self.joins_in_flight.pop_front();
                debug_assert_eq!(oldest, Some(join));
                // One reply per member when the call answered as it should;
                // anything else (an error of the whole call) is each
                // member's answer. A call of one member is its own call.
                let parts = if members == 1 {
                    None
                } else {
                    writer.split(&frame, members)
                };
                let mut parts = parts.map(Vec::into_iter);
                for _ in 0..members {
                    let Some(InFlight::Call {
                        completion,
                        deadline,
                    }) = self.in_flight.pop_front()
                    else {
                        return Err(());
                    };
                    let part = parts
                        .as_mut()
                        .and_then(Iterator::next)
                        .unwrap_or_else(|| frame.clone());
                    self.settle(completion, deadline, part);
                }
            }
        }
        Ok(())
    }

    /// One call's reply, to its caller (or held for the batch's WAIT).
    fn settle(&mut self, completion: Option<Completion>, deadline: Instant, frame: Bytes) {
        if self.settings.wait.is_some() {
            self.held.push(Held {
                completion,
                deadline,
                frame,
            });
        } else if let Some(completion) = completion {
            completion.complete(Ok(Answer {
                frame,
                replicas: None,
            }));
        }
    }

    /// The earliest deadline of a request still owed an answer.
    fn next_deadline(&self, queue: &Queue) -> Option<Instant> {
        let calls = self.in_flight.iter().filter_map(|f| match f {
            InFlight::Call {
                completion: Some(_),
                deadline,
            } => Some(*deadline),
            _ => None,
        });
        let held = self
            .held
            .iter()
            .filter(|h| h.completion.is_some())
            .map(|h| h.deadline);
        // Requests are queued in arrival order with one --timeout, so the
        // first still owed is the earliest.
        let queued = queue
            .waiting
            .iter()
            .find(|w| w.completion.is_some())
            .map(|w| w.deadline);
        calls.chain(held).chain(queued).min()
    }

    /// Answers every request past its deadline with a timeout, queued ones
    /// included (their bytes still go out with their batch). True when one
    /// of them was on the connection: its bytes taken into a batch, and its
    /// reply (or its batch's WAIT) not read, or its bytes not all written.
    /// The connection is then given up ([`serve`]).
    fn expire(&mut self, queue: &mut Queue, now: Instant) -> bool {
        let calls = self.in_flight.iter_mut().filter_map(|f| match f {
            InFlight::Call {
                completion,
                deadline,
            } => Some((completion, *deadline)),
            InFlight::Wait | InFlight::Joined { .. } => None,
        });
        let held = self
            .held
            .iter_mut()
            .map(|h| (&mut h.completion, h.deadline));
        let mut on_connection = false;
        for (completion, deadline) in calls.chain(held) {
            if deadline <= now
                && let Some(completion) = completion.take()
            {
                completion.complete(Err(PipeError::Timeout));
                on_connection = true;
            }
        }
        for waiter in &mut queue.waiting {
            if waiter.deadline <= now
                && let Some(completion) = waiter.completion.take()
            {
                completion.complete(Err(PipeError::Timeout));
            }
        }
        on_connection
    }

    /// Answers everything still owed: its outcome is unknown.
    fn fail(self) {
        let calls = self.in_flight.into_iter().filter_map(|f| match f {
            InFlight::Call { completion, .. } => completion,
            InFlight::Wait | InFlight::Joined { .. } => None,
        });
        for completion in calls.chain(self.held.into_iter().filter_map(|h| h.completion)) {
            completion.complete(Err(PipeError::Lost));
        }
    }
}

/// How a connection's service ended.
enum Served {
    /// A request timed out on it ([`Conversation::expire`]): it was reset,
    /// and the next connection may be opened at once if this one had
    /// `answered` anything.
    Dead { answered: bool },
    /// It failed, or the pipe retired.
    Ended(std::io::Result<()>),
}

async fn serve(mut stream: TcpStream, pipe: &PipeInner, settings: &PipeSettings) -> Served {
    let (reader, mut writer) = stream.split();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut talk = Conversation {
        in_flight: VecDeque::new(),
        held: Vec::new(),
        writing: BytesMut::new(),
        unconfirmed: 0,
        waiting: false,
        joins_in_flight: VecDeque::new(),
        settings,
    };
    // Whether any reply came on this connection, and whether it is given up.
    let mut answered = false;
    let mut given_up = false;
    // One timer for the connection's life, moved only when the earliest
    // deadline does: a fresh sleep each time round the loop was a timer
    // registered and cancelled per batch.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    let result = loop {
        let (next_deadline, retired) = {
            let mut queue = lock(&pipe.queue);
            talk.take_batch(&mut queue, Instant::now());
            let retired = queue.retired && queue.waiting.is_empty();
            (talk.next_deadline(&queue), retired)
        };
        if retired && talk.in_flight.is_empty() {
            break Ok(());
        }
        if let Some(deadline) = next_deadline {
            // Due already (a busy pipe whose read is always ready would
            // otherwise never reach the timer's branch below).
            let now = Instant::now();
            if deadline <= now {
                if talk.expire(&mut lock(&pipe.queue), now) {
                    given_up = true;
                    break Ok(());
                }
                continue;
            }
            if armed != Some(deadline) {
                timer.as_mut().reset(deadline);
                armed = Some(deadline);
            }
        }
        // Every phase waits in this one select, with the deadline timer:
        // a node that stops reading (its window shut, a frozen host) blocks
        // the write, and requests must still time out on the dot.
        // Biased: polled in this order, with no RNG call per select.
        tokio::select! {
            biased;
            written = writer.write_buf(&mut talk.writing), if !talk.writing.is_empty() => {
                match written {
                    Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(err) => break Err(err),
                }
            }
            // New requests queued (or the pipe retired): go round and take
            // them. Only while the writer is free: otherwise the end of the
            // write goes round anyway.
            _ = std::future::poll_fn(|cx| pipe.work.poll_lower(cx)), if talk.writing.is_empty() && !talk.waiting => {}
            read = crate::net::read(reader.as_ref(), &mut input), if !talk.in_flight.is_empty() => {
                match read {
                    Ok(0) => break Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(_) => answered = true,
                    Err(err) => break Err(err),
                }
                if input.capacity() - input.len() < 4096 {
                    input.reserve(16 * 1024);
                }
                let mut broken = None;
                loop {
                    match answer::frame_len(&input) {
                        Ok(Some(len)) => {
                            if talk.answer(input.split_to(len).freeze()).is_err() {
                                broken = Some(std::io::Error::other("a reply no request asked for"));
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(err) => {
                            broken = Some(std::io::Error::other(err.to_string()));
                            break;
                        }
                    }
                }
                if let Some(err) = broken {
                    break Err(err);
                }
            }
            () = &mut timer, if next_deadline.is_some() => {
                armed = None;
                // A request timed out with its bytes on this connection:
                // the flow may be stuck for good (a dropped conntrack or
                // NAT entry, a firewall that discards), where nothing
                // moves again and only a new connection is served; the
                // node may as well be only slow, which no connection can
                // tell apart. Give it up either way, as client libraries
                // do.
                if talk.expire(&mut lock(&pipe.queue), Instant::now()) {
                    given_up = true;
                    break Ok(());
                }
            }
        }
    };
    talk.fail();
    if given_up {
        // Given up: reset the connection rather than close it, so the
        // kernel drops the requests it still holds instead of delivering
        // them once the node reads again. Their callers were already told
        // the outcome is unknown; a node that wakes up to a backlog of
        // stale requests serves nothing new until it has run them all.
        // (A zero linger never blocks, which is why tokio deprecates the
        // call in general.)
        #[allow(deprecated)]
        let _ = stream.set_linger(Some(Duration::ZERO));
        return Served::Dead { answered };
    }
    Served::Ended(result)
}

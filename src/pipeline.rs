//! The hot path to Redis: one pipelined connection per primary.
//!
//! DEDUCT and REVERT are one EVALSHA each. Sent through the redis crate's
//! cluster client, every call crosses two channels, two tasks and two
//! oneshots, builds a `Cmd` and a `Value` tree, and arms its own timer:
//! about 20 µs of stockgate's CPU per request (measured with perf and
//! benches/side_by_side), against ~1 µs of its own work. Here instead:
//!
//! - a **node pipe** per primary owns one connection. Callers hand it an
//!   encoded request; it writes everything waiting in one write, so many
//!   clients' requests to one node become one upstream pipeline (which also
//!   costs Redis less per command), and matches replies in order;
//! - replies are decoded with redis-protocol, without copying;
//! - one deadline timer per pipe: when the oldest request passes its
//!   deadline it is answered with a timeout, and its reply, if it ever
//!   comes, is dropped;
//! - the slot table maps each of the 16384 slots to its primary's pipe; it
//!   is read without a lock and rebuilt from CLUSTER SLOTS on every health
//!   check and after a redirect;
//! - with `--wait-replicas`, each batch ends with one `WAIT`: WAIT covers
//!   every earlier write on its connection, so one per batch confirms the
//!   whole batch (a group commit), and the batch's replies are held until it
//!   answers. Sent per request on a shared connection instead, each WAIT
//!   would block every request behind it for the whole wait timeout when a
//!   replica is gone (the fault suite measured 82 of 86 requests timing out).
//!
//! Anything out of the ordinary (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
//! NOSCRIPT, READONLY, a connection lost mid-request) is not handled here:
//! the request goes again through the redis crate (see
//! [`crate::upstream`]), which owns redirects, retries and reconnection.
//! Sending it again is safe because the scripts are idempotent by
//! request_id: one that already ran answers 1.

use crate::config::Durability;
use crate::keys::SLOTS;
use crate::reply::encode_command;
use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use crate::answer::{self, Shape};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Most bytes one write carries; more waits for the next.
const MAX_BATCH: usize = 256 * 1024;

/// Requests one pipe holds before it has taken them into a batch. Past it,
/// a caller is refused at once: a node that stopped reading must not
/// queue requests without bound (measured before this bound: 2.8 MB
/// queued after 10 s of a zero-window node under load).
const MAX_WAITING: usize = 16 * 1024;

/// After a failed connect, the pipe refuses calls (they take the slow path)
/// for a while before it tries again: from this, doubling each time...
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

/// A reply, and with `--wait-replicas` how many replicas confirmed the
/// batch it was in (-1 when WAIT itself failed).
#[derive(Debug)]
pub struct Answer {
    /// The reply's bytes, as Redis sent them (see [`crate::answer`]).
    pub frame: Bytes,
    pub replicas: Option<i64>,
}

type Reply = oneshot::Sender<Result<Answer, PipeError>>;

struct Call {
    request: Bytes,
    deadline: Instant,
    reply: Reply,
}

/// How a pipe's connection behaves.
#[derive(Debug, Clone)]
struct PipeSettings {
    login: Login,
    connect_timeout: Duration,
    /// A connection that answers nothing for this long while requests wait
    /// is given up (a black-holed or stuck node).
    stuck_after: Duration,
    /// The `WAIT` that ends each batch, with `--wait-replicas`.
    wait: Option<Bytes>,
}

/// One primary's pipelined connection, served by its own task.
pub struct NodePipe {
    addr: String,
    calls: mpsc::Sender<Call>,
}

impl NodePipe {
    fn start(addr: String, settings: PipeSettings) -> Arc<NodePipe> {
        let (calls, inbox) = mpsc::channel(MAX_WAITING);
        tokio::spawn(run(addr.clone(), settings, inbox));
        Arc::new(NodePipe { addr, calls })
    }

    /// Hands `request` to the pipe and waits for its answer, never past
    /// `deadline`: the pipe answers a timeout itself, and this wait is
    /// bounded too, so a pipe that cannot run never holds a caller.
    async fn call(&self, request: Bytes, deadline: Instant) -> Result<Answer, PipeError> {
        let (reply, answer) = oneshot::channel();
        let call = Call {
            request,
            deadline,
            reply,
        };
        match self.calls.try_send(call) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => return Err(PipeError::Overloaded),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(PipeError::Lost),
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(answer) => answer.unwrap_or(Err(PipeError::Lost)),
            Err(_) => Err(PipeError::Timeout),
        }
    }
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
        timeout: Duration,
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
                stuck_after: timeout + Duration::from_secs(1),
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
                    .find(|p| p.addr == *addr)
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

    /// Marks the slot table stale (a MOVED said so); the next health check
    /// rebuilds it, or the caller does now.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Sends `request` to the primary of `slot` and waits for its reply, at
    /// most until `deadline`. `Err(Lost)` when no pipe serves the slot yet.
    pub async fn call(
        &self,
        slot: u16,
        request: Bytes,
        deadline: Instant,
    ) -> Result<Answer, PipeError> {
        let pipe = {
            let routes = self.routes.load();
            match routes.owners.get(slot as usize) {
                Some(&index) if index != u16::MAX => routes.pipes[index as usize].clone(),
                _ => return Err(PipeError::Lost),
            }
        };
        pipe.call(request, deadline).await
    }
}

/// What the connection owes, in order.
enum InFlight {
    /// A request; `reply` is `None` once answered with a timeout, and its
    /// late reply is then dropped.
    Call {
        reply: Option<Reply>,
        deadline: Instant,
    },
    /// The WAIT closing a batch.
    Wait,
}

/// A reply waiting for its batch's WAIT.
struct Held {
    reply: Option<Reply>,
    deadline: Instant,
    frame: Bytes,
}

/// A pipe's task: connect when there is work, serve until the connection
/// fails, fail what was in flight, and start over. A failed connect makes
/// the pipe refuse calls for a backoff (they take the slow path at once)
/// instead of trying again for every request.
async fn run(addr: String, settings: PipeSettings, mut inbox: mpsc::Receiver<Call>) {
    let mut backoff = RECONNECT_FIRST;
    let mut retry_at: Option<Instant> = None;
    while let Some(first) = inbox.recv().await {
        if retry_at.is_some_and(|at| Instant::now() < at) {
            let _ = first.reply.send(Err(PipeError::Lost));
            continue;
        }
        let connect = connect(&addr, &settings.login);
        let stream = match tokio::time::timeout(settings.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            outcome => {
                tracing::debug!(%addr, ?outcome, ?backoff, "node pipe cannot connect");
                retry_at = Some(Instant::now() + backoff);
                backoff = (backoff * 2).min(RECONNECT_MOST);
                // Everything waiting now fails over to the slow path.
                let _ = first.reply.send(Err(PipeError::Lost));
                while let Ok(call) = inbox.try_recv() {
                    let _ = call.reply.send(Err(PipeError::Lost));
                }
                continue;
            }
        };
        backoff = RECONNECT_FIRST;
        retry_at = None;
        if let Err(err) = serve(stream, first, &mut inbox, &settings).await {
            tracing::debug!(%addr, %err, "node pipe connection ended");
        }
    }
}

async fn connect(addr: &str, login: &Login) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
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
    /// Requests queued behind it, for the next batch.
    output: BytesMut,
    /// Requests queued since the last WAIT.
    unconfirmed: usize,
    /// A WAIT written and not yet answered. While one is, the next batch
    /// stays unwritten: Redis would run its WAIT only after this one anyway,
    /// and everything arriving meanwhile joins it.
    waiting: bool,
    settings: &'a PipeSettings,
}

impl Conversation<'_> {
    fn queue(&mut self, call: Call) {
        if call.deadline <= Instant::now() {
            // Past its deadline before it was sent: answer it, send nothing.
            let _ = call.reply.send(Err(PipeError::Timeout));
            return;
        }
        self.output.extend_from_slice(&call.request);
        self.in_flight.push_back(InFlight::Call {
            reply: Some(call.reply),
            deadline: call.deadline,
        });
        self.unconfirmed += 1;
    }

    /// Ends the batch with its WAIT, when asked for.
    fn close_batch(&mut self) {
        if let Some(wait) = &self.settings.wait
            && self.unconfirmed > 0
        {
            self.output.extend_from_slice(wait);
            self.in_flight.push_back(InFlight::Wait);
            self.unconfirmed = 0;
            self.waiting = true;
        }
    }

    /// Starts the next batch when the last one is written, and unless a
    /// batch's WAIT is outstanding.
    fn next_batch(&mut self) {
        if self.writing.is_empty() && !self.waiting {
            self.close_batch();
            std::mem::swap(&mut self.writing, &mut self.output);
        }
    }

    /// Matches one reply to what it answers. `Err` when nothing was owed.
    fn answer(&mut self, frame: Bytes) -> Result<(), ()> {
        match self.in_flight.pop_front().ok_or(())? {
            InFlight::Call { reply, deadline } => {
                if self.settings.wait.is_some() {
                    self.held.push(Held {
                        reply,
                        deadline,
                        frame,
                    });
                } else if let Some(reply) = reply {
                    let _ = reply.send(Ok(Answer {
                        frame,
                        replicas: None,
                    }));
                }
            }
            InFlight::Wait => {
                self.waiting = false;
                let replicas = match answer::shape(&frame) {
                    Shape::Integer(n) => n,
                    _ => -1,
                };
                for held in self.held.drain(..) {
                    if let Some(reply) = held.reply {
                        let _ = reply.send(Ok(Answer {
                            frame: held.frame,
                            replicas: Some(replicas),
                        }));
                    }
                }
            }
        }
        Ok(())
    }

    /// The earliest deadline of a request still owed an answer.
    fn next_deadline(&self) -> Option<Instant> {
        let calls = self.in_flight.iter().filter_map(|f| match f {
            InFlight::Call {
                reply: Some(_),
                deadline,
            } => Some(*deadline),
            _ => None,
        });
        let held = self
            .held
            .iter()
            .filter(|h| h.reply.is_some())
            .map(|h| h.deadline);
        calls.chain(held).min()
    }

    /// Answers every request past its deadline with a timeout.
    fn expire(&mut self, now: Instant) {
        for call in &mut self.in_flight {
            if let InFlight::Call { reply, deadline } = call
                && *deadline <= now
                && let Some(reply) = reply.take()
            {
                let _ = reply.send(Err(PipeError::Timeout));
            }
        }
        for held in &mut self.held {
            if held.deadline <= now
                && let Some(reply) = held.reply.take()
            {
                let _ = reply.send(Err(PipeError::Timeout));
            }
        }
    }

    /// Answers everything still owed: its outcome is unknown.
    fn fail(self) {
        let calls = self.in_flight.into_iter().filter_map(|f| match f {
            InFlight::Call { reply, .. } => reply,
            InFlight::Wait => None,
        });
        for reply in calls.chain(self.held.into_iter().filter_map(|h| h.reply)) {
            let _ = reply.send(Err(PipeError::Lost));
        }
    }
}

async fn serve(
    mut stream: TcpStream,
    first: Call,
    inbox: &mut mpsc::Receiver<Call>,
    settings: &PipeSettings,
) -> std::io::Result<()> {
    let (reader, mut writer) = stream.split();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut talk = Conversation {
        in_flight: VecDeque::new(),
        held: Vec::new(),
        writing: BytesMut::new(),
        output: BytesMut::new(),
        unconfirmed: 0,
        waiting: false,
        settings,
    };
    talk.queue(first);
    // The inbox closes when the pipe leaves the slot table; what is in
    // flight is still answered.
    let mut closed = false;
    // When the node last showed life: a reply read, or bytes it accepted.
    let mut last_heard = Instant::now();
    let result = loop {
        // Everything that arrived meanwhile goes out in the next write.
        while talk.output.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(call) => talk.queue(call),
                Err(_) => break,
            }
        }
        talk.next_batch();
        if closed && talk.in_flight.is_empty() {
            break Ok(());
        }
        let next_deadline = talk.next_deadline();
        // Every phase waits in this one select, with the deadline timer:
        // a node that stops reading (its window shut, a frozen host) blocks
        // the write, and requests must still time out on the dot.
        tokio::select! {
            written = writer.write_buf(&mut talk.writing), if !talk.writing.is_empty() => {
                match written {
                    Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                    Ok(_) => last_heard = Instant::now(),
                    Err(err) => break Err(err),
                }
            }
            call = inbox.recv(), if !closed && talk.output.len() < MAX_BATCH => match call {
                Some(call) => talk.queue(call),
                None => closed = true,
            },
            read = crate::net::read(reader.as_ref(), &mut input), if !talk.in_flight.is_empty() => {
                match read {
                    Ok(0) => break Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(_) => last_heard = Instant::now(),
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
            _ = tokio::time::sleep_until(next_deadline.unwrap_or_else(Instant::now)), if next_deadline.is_some() => {
                let now = Instant::now();
                talk.expire(now);
                // A node that neither answers nor takes bytes for longer
                // than a request may wait is gone (black-holed, stuck, its
                // window shut): start a fresh connection.
                if !talk.in_flight.is_empty() && now.duration_since(last_heard) > settings.stuck_after {
                    break Err(std::io::ErrorKind::TimedOut.into());
                }
            }
        }
    };
    talk.fail();
    if result
        .as_ref()
        .is_err_and(|err| err.kind() == std::io::ErrorKind::TimedOut)
    {
        // A stuck node: reset the connection rather than close it, so the
        // kernel drops the requests it still holds instead of delivering
        // them once the node reads again. Their callers were already told
        // the outcome is unknown; a node that wakes up to a backlog of
        // stale requests serves nothing new until it has run them all.
        // (A zero linger never blocks, which is why tokio deprecates the
        // call in general.)
        #[allow(deprecated)]
        let _ = stream.set_linger(Some(Duration::ZERO));
    }
    result
}

//! The conversation with one node: connect, write batches, read replies
//! in order and hand each to its completion, keep every deadline, and
//! give up a connection that stopped answering.

use super::completion::{Answer, Completion};
use super::join::{Join, Part};
use super::queue::{PipeInner, PipeSettings, Queue, Waiter};
use super::{Login, PipeError, lock};
use crate::answer::{self, Shape};
use crate::reply::encode_command;
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// After a failed connect, or a connection given up before it answered
/// anything, the pipe refuses calls (they take the slow path) for a while
/// before it tries again: from this, doubling each time...
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
/// ...up to this.
const RECONNECT_MOST: Duration = Duration::from_secs(2);

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
pub(super) async fn run(pipe: Arc<PipeInner>, settings: PipeSettings) {
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
        if hold {
            // Its bytes stay queued; the output before them goes.
            queue.gather_lone();
        } else {
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
        let now = Instant::now();
        let (next_deadline, retired) = {
            let mut queue = lock(&pipe.queue);
            talk.take_batch(&mut queue, now);
            let retired = queue.retired && queue.waiting.is_empty();
            (talk.next_deadline(&queue), retired)
        };
        if retired && talk.in_flight.is_empty() {
            break Ok(());
        }
        if let Some(deadline) = next_deadline {
            // Due already (a busy pipe whose read is always ready would
            // otherwise never reach the timer's branch below).
            if deadline <= now {
                if talk.expire(&mut lock(&pipe.queue), now) {
                    given_up = true;
                    break Ok(());
                }
                continue;
            }
            // Moved only to an earlier deadline: a timer that fires before
            // the earliest deadline only has the pipe look, and re-armed
            // per batch it cost a timer-wheel update per request at depth 1
            // (the earliest deadline moves with every answer).
            if armed.is_none_or(|at| deadline < at) {
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
            () = &mut timer, if armed.is_some() => {
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

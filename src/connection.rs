//! One client connection: requests in, replies out, in order.
//!
//! Pipelined requests run concurrently: every DEDUCT read from the socket
//! goes upstream at once, without waiting for the one before, and the
//! replies are written back in request order. Replies that are ready
//! together leave in one write, never one flush per reply.
//!
//! Yet each takes effect after every request sent before it, as Redis
//! promises for one connection: a request waits only for an unfinished
//! earlier one that touches the same SKU (or spans several: an order), and
//! not even then when both are script calls on that SKU's node pipe, which
//! keeps them in order itself ([`Replies::must_wait`]). A fallback to the
//! redis crate waits for the earlier ones of its SKU; a sold-out read
//! whose answer would overtake an earlier request's effect is answered by
//! the script after it instead ([`settle`]).
//!
//! DEDUCT and REVERT cost no future, task or channel of their own: each is
//! checked, then written straight into its node pipe's next batch
//! ([`crate::pipeline`]) with this connection's [`Mailbox`] and its place
//! in the reply order as the completion, and the answers that arrived come
//! back in one wake. Only what needs the redis crate (a redirect, a lost
//! connection, the operators' commands) runs as a future.
//!
//! Bounds: one request is at most `--max-request-bytes`; at most
//! `--max-pipeline` requests are in flight; and once `MAX_OUTPUT` bytes of
//! replies wait for a client that doesn't read, stockgate stops reading
//! from it until it does. Memory per connection stays bounded whatever the
//! client sends.

use crate::command::{self, Action};
use crate::frame::RequestDecoder;
use crate::pipeline::{Answer, Completion, Mailbox, PipeError};
use crate::reply::{Protocol, Reply};
use crate::session::Session;
use crate::state::Shared;
use crate::stock::{Caller, Concluded, Prepared, StockCall, StockCommand, StockResult, Touches};
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::ReadHalf;
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;

/// Replies buffered for a client before stockgate stops reading from it.
const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 4 * 1024;
/// How long a connection sits idle (nothing in, nothing owed) before it
/// gives its buffers back. Most of a sidecar's connections sit in a pool
/// doing nothing, and 4 KiB each adds up to tens of MB at 10,000
/// connections (measured); but a busy connection is idle between every
/// request at depth 1, and freeing and allocating its buffers each time
/// cost about a tenth of its instructions per request (callgrind).
const IDLE_RELEASE: Duration = Duration::from_millis(500);
/// How far past its deadline an answer may be late before the connection
/// answers the request itself: the pipe answers every request by its
/// deadline, and this only guards against a pipe that can't run.
const ANSWER_GRACE: Duration = Duration::from_millis(500);
/// How long a closing connection waits for the client to close too, reading
/// and dropping what it still sends (see [`crate::net::discard_input`]).
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Serves one connection until the client leaves, sends QUIT or malformed
/// RESP, or the server drains.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    shared.clients.fetch_add(1, Ordering::Relaxed);
    shared.metrics.client_connected();
    let id = shared.next_client_id();
    tracing::debug!(%peer, client = id, "client connected");
    if let Err(err) = run(stream, peer, id, &shared, &drain).await {
        // A client vanishing mid-request is routine; its in-flight requests
        // still complete upstream (the script is atomic), only the replies
        // are lost, and a retry with the same request_id gets code 1.
        tracing::debug!(%peer, client = id, %err, "connection ended with an I/O error");
    }
    tracing::debug!(%peer, client = id, "client disconnected");
    shared.metrics.client_disconnected();
    shared.clients.fetch_sub(1, Ordering::Relaxed);
}

async fn run(
    mut stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shared: &Shared,
    drain: &CancellationToken,
) -> std::io::Result<()> {
    let (reader, mut writer) = stream.split();
    let config = &shared.config;
    let mut decoder = RequestDecoder::new(config.max_request_bytes);
    let mut session = Session::new(id, shared.config.password.is_none());
    session.peer = Some(peer);
    let mut input = BytesMut::new();
    let mut output = BytesMut::new();
    let mut replies = Replies::default();
    let mailbox = Arc::new(Mailbox::default());
    let mut arrived_answers = Vec::new();
    let mut running: FuturesUnordered<BoxFuture<'_, (u64, Reply)>> = FuturesUnordered::new();
    // Reading from the socket: stops at EOF, and once a drain has taken in
    // what the client had already sent.
    let mut reading = true;
    // The client closed its side (a read returned 0).
    let mut closed_by_client = false;
    let mut draining = false;
    let idle_timeout = config.idle_timeout;
    let mut last_read = tokio::time::Instant::now();
    let mut janitor =
        tokio::time::interval_at(tokio::time::Instant::now() + IDLE_RELEASE, IDLE_RELEASE);
    janitor.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Taking requests from the buffer: stops after QUIT or a protocol error.
    let mut accepting = true;
    // One future for the connection's life: made afresh each time round
    // the loop, it enlisted in the token's waiter list every time.
    let drained = drain.cancelled();
    tokio::pin!(drained);

    loop {
        // Turn buffered bytes into requests while the pipeline has room.
        while accepting && replies.len() < config.max_pipeline {
            let request = match decoder.decode(&mut input) {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(err) => {
                    tracing::debug!(client = id, %err, "malformed request; closing");
                    replies.push(Reply::Error(format!("ERR {err}")), session.protocol);
                    accepting = false;
                    reading = false;
                    break;
                }
            };
            let arrived = Instant::now();
            let action = command::execute(request, &mut session, shared);
            // After the command ran: HELLO's own reply is in the protocol
            // it chose.
            let protocol = session.protocol;
            match action {
                Action::Reply(reply) => replies.push(reply, protocol),
                Action::Close(reply) => {
                    accepting = false;
                    reading = false;
                    replies.push(reply, protocol);
                }
                Action::Stock(command, args) => {
                    // The operators' commands, which only their audit log
                    // names the sender of, carry who sent them.
                    let caller = match command {
                        StockCommand::Set | StockCommand::Add => Some(Box::new(Caller {
                            client_id: Some(session.id),
                            addr: session.peer,
                            name: session.name.clone(),
                        })),
                        _ => None,
                    };
                    let request = Request {
                        command,
                        args,
                        arrived,
                        caller,
                    };
                    let footprint = Footprint::of(command.touches(&request.args));
                    let how = || {
                        Sending::of(footprint, || {
                            shared.service.would_read_first(command, &request.args)
                        })
                    };
                    if replies.must_wait(replies.len(), footprint, how) {
                        replies.push_held(protocol, footprint, request);
                    } else {
                        let ticket = replies.next_ticket();
                        replies.push_stock(protocol, footprint);
                        dispatch(
                            shared,
                            &mut replies,
                            &mut running,
                            &mailbox,
                            ticket,
                            request,
                        );
                    }
                }
            }
        }

        // Settle every answer that is in, and every future that is done,
        // without waiting; then write out the replies that are next in order.
        if mailbox.take(&mut arrived_answers) {
            for (ticket, answer) in arrived_answers.drain(..) {
                if let Some(call) = replies.take_sent(ticket) {
                    settle(shared, &mut replies, &mut running, ticket, call, answer);
                }
            }
        }
        while let Some(Some((ticket, reply))) = running.next().now_or_never() {
            replies.answer(ticket, reply);
        }
        if replies.held > 0 {
            release_held(shared, &mut replies, &mut running, &mailbox);
        }
        replies.write_ready(&mut output);

        // Done when nothing more can arrive and everything is answered. (An
        // incomplete request left in the buffer can't be answered.)
        if !reading && replies.is_empty() && output.is_empty() {
            break;
        }
        let idle = replies.is_empty() && input.is_empty() && output.is_empty();
        let holding = input.capacity() > 0 || output.capacity() > 0;

        let can_read = reading && replies.len() < config.max_pipeline && output.len() < MAX_OUTPUT;
        if draining && can_read {
            // Draining: take in what the client sent before the signal (it
            // is in the socket buffer now), without waiting for more. Every
            // request read is answered; then the connection closes.
            if input.capacity() - input.len() < READ_CHUNK / 4 {
                input.reserve(READ_CHUNK);
            }
            match crate::net::read_now(reader.as_ref(), &mut input) {
                Ok(0) => {
                    reading = false;
                    closed_by_client = true;
                }
                Ok(_) => {}
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => reading = false,
                Err(err) => return Err(err),
            }
            continue;
        }
        // Biased: the branches are polled in this order instead of from a
        // random start, which cost a thread-local RNG call per select
        // (callgrind). The ones before the read run out of work, and the
        // read stops at --max-pipeline; what comes after it only matters
        // when the client is quiet.
        tokio::select! {
            biased;
            written = writer.write_buf(&mut output), if !output.is_empty() => {
                if written? == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
            }
            // Answers from the pipes; the top of the loop settles them.
            _ = std::future::poll_fn(|cx| mailbox.poll_wake(cx)), if replies.sent > 0 => {}
            Some((ticket, reply)) = running.next(), if !running.is_empty() => {
                replies.answer(ticket, reply);
            }
            // Before the read: a client that never stops sending must not
            // keep the drain from starting.
            () = &mut drained, if reading && !draining => {
                draining = true;
            }
            // Wait for bytes before allocating a buffer for them.
            ready = reader.readable(), if can_read && !draining => {
                ready?;
                match read_available(&reader, &mut input) {
                    Ok(0) => {
                        reading = false;
                        closed_by_client = true;
                    }
                    Ok(_) => last_read = tokio::time::Instant::now(),
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(err) => return Err(err),
                }
            }
            // Every half second while it holds buffers or is owed answers:
            // an idle connection gives its buffers back (the next read
            // allocates again), and a request whose answer is overdue past
            // its deadline is answered here (a pipe that can't run).
            _ = janitor.tick(), if holding || replies.sent > 0 => {
                if idle && last_read.elapsed() >= IDLE_RELEASE {
                    input = BytesMut::new();
                    output = BytesMut::new();
                    replies.release_idle();
                }
                let overdue = tokio::time::Instant::now() - ANSWER_GRACE;
                while let Some((ticket, call)) = replies.take_overdue(overdue) {
                    settle(shared, &mut replies, &mut running, ticket, call, Err(PipeError::Timeout));
                }
            }
            // --idle-timeout: nothing sent and nothing owed for that long.
            // (select! builds every branch's future each time round, so the
            // timer is made only inside, when the branch is polled.)
            _ = async { tokio::time::sleep_until(last_read + idle_timeout.unwrap_or_default()).await },
                if idle_timeout.is_some() && replies.is_empty() && output.is_empty() => {
                tracing::debug!(client = id, "idle timeout; closing");
                break;
            }
            else => break,
        }
    }
    // Every reply is written: a FIN after the last one. Then, unless the
    // client has closed already, drop what it still sends until it does,
    // so the close stays a FIN (see net::discard_input).
    writer.shutdown().await?;
    if !closed_by_client {
        crate::net::discard_input(reader.as_ref(), CLOSE_LINGER).await;
    }
    Ok(())
}

/// Reads what the socket has now, growing the buffer first if needed.
fn read_available(reader: &ReadHalf<'_>, input: &mut BytesMut) -> std::io::Result<usize> {
    if input.capacity() - input.len() < READ_CHUNK / 4 {
        input.reserve(READ_CHUNK);
    }
    crate::net::try_read(reader.as_ref(), input)
}

/// A stock request as read, until it is sent.
struct Request {
    command: StockCommand,
    args: Vec<Bytes>,
    arrived: Instant,
    /// Who sent it, for the operators' commands (boxed: the rest, every
    /// DEDUCT among them, move this struct around and name no caller).
    caller: Option<Box<Caller>>,
}

type Running<'a> = FuturesUnordered<BoxFuture<'a, (u64, Reply)>>;

/// Sends the stock request of `ticket` on its way: checked and answered
/// on the spot (code 3), written into its node pipe, or run as a future.
#[inline]
fn dispatch<'a>(
    shared: &'a Shared,
    replies: &mut Replies,
    running: &mut Running<'a>,
    mailbox: &Arc<Mailbox>,
    ticket: u64,
    request: Request,
) {
    let Request {
        command,
        args,
        arrived,
        caller,
    } = request;
    match shared.service.prepare(command, &args, arrived) {
        Some(Prepared::Answered(result)) => replies.answer(ticket, stock_reply(result)),
        Some(Prepared::Call(call)) => {
            let completion = Completion::Mailbox(mailbox.clone(), ticket);
            match shared.service.submit(&call, completion) {
                Ok(()) => replies.sent(ticket, call),
                Err((refused, _)) => settle(shared, replies, running, ticket, call, Err(refused)),
            }
        }
        None => running.push(
            async move {
                let caller = caller.map(|c| *c).unwrap_or_default();
                let reply = shared.service.serve(command, &args, arrived, &caller).await;
                (ticket, reply)
            }
            .boxed(),
        ),
    }
}

/// Sends every held request (and held fallback) that nothing unfinished
/// before it holds back any more, in order.
fn release_held<'a>(
    shared: &'a Shared,
    replies: &mut Replies,
    running: &mut Running<'a>,
    mailbox: &Arc<Mailbox>,
) {
    while replies.held > 0 {
        let Some((ticket, released)) = replies.take_releasable() else {
            return;
        };
        match released {
            Released::Request(request) => {
                dispatch(shared, replies, running, mailbox, ticket, request)
            }
            Released::Fallback(call) => running.push(
                async move { (ticket, stock_reply(shared.service.fallback(call).await)) }.boxed(),
            ),
        }
    }
}

/// A call's answer (or why there is none) made its reply: at once when the
/// answer settles it, or through a fallback future (held until the earlier
/// requests of its SKU are done: the slow path is not the pipe's order).
fn settle<'a>(
    shared: &'a Shared,
    replies: &mut Replies,
    running: &mut Running<'a>,
    ticket: u64,
    call: StockCall,
    answer: Result<Answer, PipeError>,
) {
    if call.reads_first() && answer.is_ok() && replies.fallback_must_wait(ticket) {
        // An earlier request of this SKU was not done when this read ran,
        // and takes effect after it (its script through the slow path): an
        // answer from the read would come before that effect. The script
        // answers instead, after it.
        let call = shared.service.script_instead(call);
        replies.hold_fallback(ticket, call);
        return;
    }
    match shared.service.conclude(call, answer) {
        Concluded::Answered(result) => replies.answer(ticket, stock_reply(result)),
        Concluded::Fallback(call) => {
            if replies.fallback_must_wait(ticket) {
                replies.hold_fallback(ticket, call);
            } else {
                running.push(
                    async move { (ticket, stock_reply(shared.service.fallback(call).await)) }
                        .boxed(),
                );
            }
        }
    }
}

fn stock_reply(result: StockResult) -> Reply {
    match result {
        Ok(reply) => Reply::Stock(reply),
        Err(fault) => Reply::Error(fault.reply_text()),
    }
}

/// The replies a connection owes, in request order. Each request gets the
/// next ticket; a reply is written once every reply before it is.
///
/// It also keeps the order in which requests take effect: a stock request
/// is sent only when no unfinished request before it touches what it
/// touches ([`Touches`]), unless both are script calls on one SKU's node
/// pipe, which keeps them in order itself. Requests on different SKUs go
/// at once, so a pipeline over many SKUs loses nothing.
#[derive(Default)]
struct Replies {
    slots: VecDeque<Slot>,
    /// The ticket of `slots[0]`.
    first: u64,
    /// Slots whose call is with a node pipe.
    sent: usize,
    /// Stock slots not answered yet: while none is, nothing can hold a
    /// new request back, and no slot is looked at.
    open: usize,
    /// Of those, the ones that touch everything (orders).
    open_all: usize,
    /// Of the others, how many fall in each of [`BUCKETS`] buckets by the
    /// hash of their SKU: a new request whose bucket is empty has nothing
    /// to wait for, and looks at no slot (a pipeline over many SKUs then
    /// costs a lookup per request, not a walk of what is in flight).
    /// Made at the first stock request.
    buckets: Option<Box<[u16; BUCKETS]>>,
    /// Slots held back (a request not sent yet, or a fallback not run yet).
    held: usize,
}

/// Buckets of [`Replies::buckets`]: with up to a few dozen requests in
/// flight, almost every request finds its own empty (16 in flight: 1 in
/// 17 looks further). 512 bytes, only while the connection is busy.
const BUCKETS: usize = 256;

/// What a stock request touches, as the connection keeps it while the
/// request is open: its SKU by a 64-bit hash, or everything. Two SKUs
/// that share a hash only wait for each other: at worst a needless wait,
/// never a wrong order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Footprint {
    /// One SKU; `piped` as [`Touches::Piped`].
    Sku {
        hash: u64,
        piped: bool,
    },
    All,
}

impl Footprint {
    fn of(touches: Touches<'_>) -> Footprint {
        match touches {
            Touches::Piped(sku) => Footprint::Sku {
                hash: sku_hash(sku),
                piped: true,
            },
            Touches::Sku(sku) => Footprint::Sku {
                hash: sku_hash(sku),
                piped: false,
            },
            Touches::All => Footprint::All,
        }
    }

    /// Its place in [`Replies::buckets`] (everything is counted apart).
    fn bucket(self) -> Option<usize> {
        match self {
            Footprint::Sku { hash, .. } => Some((hash % BUCKETS as u64) as usize),
            Footprint::All => None,
        }
    }
}

/// A SKU's name hashed eight bytes at a time (FxHash's step): a handful
/// of instructions for a usual name, on every request. Its last eight
/// bytes are read as one word (overlapping the one before).
fn sku_hash(sku: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |hash: u64, word: u64| (hash.rotate_left(5) ^ word).wrapping_mul(K);
    let mut hash = sku.len() as u64;
    if sku.len() < 8 {
        let word = sku.iter().fold(0u64, |word, b| (word << 8) | u64::from(*b));
        hash = step(hash, word);
    } else {
        let mut rest = sku;
        while let Some((word, tail)) = rest.split_first_chunk::<8>()
            && !tail.is_empty()
        {
            hash = step(hash, u64::from_le_bytes(*word));
            rest = tail;
        }
        let (_, last) = sku.split_last_chunk::<8>().expect("eight bytes or more");
        hash = step(hash, u64::from_le_bytes(*last));
    }
    // The high bits are the best mixed; buckets take the low ones.
    hash ^ (hash >> 29)
}

/// One request's place in the reply order, and the protocol its reply is
/// encoded in (fixed when the request was read: a later HELLO doesn't
/// change it).
struct Slot {
    protocol: Protocol,
    state: SlotState,
    /// What a stock request touches in Redis, while it is open; `None`
    /// for the rest.
    touches: Option<Footprint>,
}

enum SlotState {
    Ready(Reply),
    /// With a node pipe; the answer comes through the mailbox.
    Sent(StockCall),
    /// Running as a future, or being settled.
    Pending,
    /// Not sent yet: an unfinished request before it touches the same.
    Held(Request),
    /// Its answer calls for the slow path, which waits for the unfinished
    /// requests before it on its SKU.
    HeldFallback(StockCall),
}

/// What [`Replies::take_releasable`] hands back to be sent.
enum Released {
    Request(Request),
    Fallback(StockCall),
}

impl Slot {
    fn is_open(&self) -> bool {
        self.touches.is_some() && !matches!(self.state, SlotState::Ready(_))
    }

    /// How the call of this slot is with its node pipe, if it is.
    fn with_pipe(&self) -> Option<Sending> {
        match &self.state {
            SlotState::Sent(call) if call.reads_first() => Some(Sending::ReadFirst),
            SlotState::Sent(_) => Some(Sending::Script),
            _ => None,
        }
    }
}

/// How a stock request goes to Redis, for [`Replies::must_wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// A script call on its SKU's node pipe: in the pipe's order behind
    /// the calls of that SKU sent before it.
    Script,
    /// A read of its SKU's keys on the node pipe, then perhaps its script
    /// through the slow path ([`crate::stock::sold_out`]). Behind other
    /// reads it needs no wait: a read changes nothing, and a read whose
    /// answer would come before an earlier request's effect is sent on to
    /// the script instead, after it ([`settle`]).
    ReadFirst,
    /// A path of its own (the redis crate), or a slow-path resend.
    Alone,
}

impl Sending {
    fn of(footprint: Footprint, reads_first: impl FnOnce() -> bool) -> Sending {
        match footprint {
            Footprint::Sku { piped: true, .. } if reads_first() => Sending::ReadFirst,
            Footprint::Sku { piped: true, .. } => Sending::Script,
            Footprint::Sku { piped: false, .. } | Footprint::All => Sending::Alone,
        }
    }
}

impl Replies {
    fn len(&self) -> usize {
        self.slots.len()
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The ticket the next request pushed gets.
    fn next_ticket(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    fn push(&mut self, reply: Reply, protocol: Protocol) {
        self.slots.push_back(Slot {
            protocol,
            state: SlotState::Ready(reply),
            touches: None,
        });
    }

    /// Counts a stock slot that is open now.
    fn opened(&mut self, footprint: Footprint) {
        self.open += 1;
        match footprint.bucket() {
            None => self.open_all += 1,
            Some(bucket) => {
                self.buckets.get_or_insert_with(|| Box::new([0; BUCKETS]))[bucket] += 1;
            }
        }
    }

    /// Counts a stock slot that is answered now.
    fn closed(&mut self, footprint: Footprint) {
        self.open -= 1;
        match footprint.bucket() {
            None => self.open_all -= 1,
            Some(bucket) => {
                if let Some(buckets) = &mut self.buckets {
                    buckets[bucket] -= 1;
                }
            }
        }
    }

    /// A stock request about to be sent ([`Replies::sent`] or
    /// [`Replies::answer`] follows).
    fn push_stock(&mut self, protocol: Protocol, footprint: Footprint) {
        self.opened(footprint);
        self.slots.push_back(Slot {
            protocol,
            state: SlotState::Pending,
            touches: Some(footprint),
        });
    }

    /// A stock request held back until what it must follow is done.
    fn push_held(&mut self, protocol: Protocol, footprint: Footprint, request: Request) {
        self.opened(footprint);
        self.held += 1;
        self.slots.push_back(Slot {
            protocol,
            state: SlotState::Held(request),
            touches: Some(footprint),
        });
    }

    /// Whether a request at `index` with `footprint`, sent `how` (asked
    /// only when an earlier slot may touch the same), must wait for an
    /// unfinished request before it.
    fn must_wait(&self, index: usize, footprint: Footprint, how: impl FnOnce() -> Sending) -> bool {
        if self.open == 0 {
            return false;
        }
        if self.open_all == 0
            && let Some(bucket) = footprint.bucket()
            && self
                .buckets
                .as_ref()
                .is_none_or(|buckets| buckets[bucket] == 0)
        {
            return false;
        }
        let how = how();
        self.slots.iter().take(index).any(|earlier| {
            let Some(theirs) = earlier.touches else {
                return false;
            };
            if !earlier.is_open() {
                return false;
            }
            match (theirs, footprint) {
                (Footprint::All, _) | (_, Footprint::All) => true,
                (Footprint::Sku { hash: a, .. }, Footprint::Sku { hash: b, .. }) => {
                    a == b
                        && !matches!(
                            (earlier.with_pipe(), how),
                            (Some(Sending::Script), Sending::Script | Sending::ReadFirst)
                                | (Some(Sending::ReadFirst), Sending::ReadFirst)
                        )
                }
            }
        })
    }

    /// Whether the fallback of `ticket` must wait for an unfinished request
    /// before it on its SKU.
    fn fallback_must_wait(&self, ticket: u64) -> bool {
        let Some(index) = self.index(ticket) else {
            return false;
        };
        match self.slots[index].touches {
            Some(footprint) => self.must_wait(index, footprint, || Sending::Alone),
            None => false,
        }
    }

    fn hold_fallback(&mut self, ticket: u64, call: StockCall) {
        if let Some(slot) = self.slot(ticket) {
            slot.state = SlotState::HeldFallback(call);
            self.held += 1;
        }
    }

    /// The first held slot nothing holds back any more, taken out to be
    /// sent (its slot pending meanwhile).
    fn take_releasable(&mut self) -> Option<(u64, Released)> {
        let index = (0..self.slots.len()).find(|&i| {
            let slot = &self.slots[i];
            // A held request is let go as a script call at most: whether it
            // reads first is known once it is checked, and a read let go
            // behind an unfinished read is answered by the script anyway.
            let how = match (&slot.state, slot.touches) {
                (SlotState::Held(_), Some(Footprint::Sku { piped: true, .. })) => Sending::Script,
                (SlotState::Held(_) | SlotState::HeldFallback(_), _) => Sending::Alone,
                _ => return false,
            };
            let footprint = slot.touches.expect("held slots are stock");
            !self.must_wait(i, footprint, || how)
        })?;
        let slot = &mut self.slots[index];
        let released = match std::mem::replace(&mut slot.state, SlotState::Pending) {
            SlotState::Held(request) => Released::Request(request),
            SlotState::HeldFallback(call) => Released::Fallback(call),
            _ => unreachable!("found held just above"),
        };
        self.held -= 1;
        Some((self.first + index as u64, released))
    }

    fn index(&self, ticket: u64) -> Option<usize> {
        let index = usize::try_from(ticket.checked_sub(self.first)?).ok()?;
        (index < self.slots.len()).then_some(index)
    }

    fn slot(&mut self, ticket: u64) -> Option<&mut Slot> {
        let index = self.index(ticket)?;
        self.slots.get_mut(index)
    }

    /// The call of `ticket` is with its node pipe now.
    fn sent(&mut self, ticket: u64, call: StockCall) {
        if let Some(slot) = self.slot(ticket) {
            slot.state = SlotState::Sent(call);
            self.sent += 1;
        }
    }

    /// The call of `ticket`, if it is still with a pipe (not answered by
    /// the connection's own overdue check meanwhile).
    fn take_sent(&mut self, ticket: u64) -> Option<StockCall> {
        let slot = self.slot(ticket)?;
        if !matches!(slot.state, SlotState::Sent(_)) {
            return None;
        }
        let SlotState::Sent(call) = std::mem::replace(&mut slot.state, SlotState::Pending) else {
            unreachable!("checked just above")
        };
        self.sent -= 1;
        Some(call)
    }

    /// The first call still with a pipe whose deadline was before
    /// `overdue`. Calls are sent in order with one `--timeout`, so that is
    /// the first sent one or none.
    fn take_overdue(&mut self, overdue: tokio::time::Instant) -> Option<(u64, StockCall)> {
        if self.sent == 0 {
            return None;
        }
        let (index, _) = self.slots.iter().enumerate().find(
            |(_, s)| matches!(&s.state, SlotState::Sent(call) if call.deadline() < overdue),
        )?;
        let ticket = self.first + index as u64;
        self.take_sent(ticket).map(|call| (ticket, call))
    }

    fn answer(&mut self, ticket: u64, reply: Reply) {
        let Some(index) = self.index(ticket) else {
            return;
        };
        let slot = &mut self.slots[index];
        if matches!(slot.state, SlotState::Sent(_)) {
            self.sent -= 1;
        }
        let closed = match slot.state {
            SlotState::Ready(_) => None,
            _ => slot.touches.take(),
        };
        slot.state = SlotState::Ready(reply);
        if let Some(footprint) = closed {
            self.closed(footprint);
        }
    }

    /// An idle connection gives back what it keeps for requests in
    /// flight (made again at its next stock request).
    fn release_idle(&mut self) {
        if self.open == 0 {
            self.buckets = None;
        }
    }

    /// Encodes every reply that is next in order.
    fn write_ready(&mut self, output: &mut BytesMut) {
        while let Some(Slot {
            state: SlotState::Ready(_),
            ..
        }) = self.slots.front()
        {
            let Some(Slot {
                protocol,
                state: SlotState::Ready(reply),
                ..
            }) = self.slots.pop_front()
            else {
                unreachable!("the front slot is ready")
            };
            self.first += 1;
            reply.encode(protocol, output);
        }
    }
}

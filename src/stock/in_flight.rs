//! A client connection's stock requests in flight, answered in the order
//! they were sent.
//!
//! Pipelined requests run concurrently: every DEDUCT read from the socket
//! goes upstream at once, without waiting for the one before, and the
//! replies come back in request order ([`InFlight::write_ready`]).
//!
//! Yet each takes effect after every request sent before it, as Redis
//! promises for one connection: a request waits only for an unfinished
//! earlier one that touches the same SKU (an ORDER touches its lines'
//! SKUs and its order; the order commands that name no SKU touch
//! everything), and not even then when both are script calls on that
//! SKU's node pipe, which keeps them in order itself
//! ([`Replies::must_wait`]). A fallback to the redis crate waits for the
//! earlier ones of its SKU; a sold-out read whose answer would overtake an
//! earlier request's effect is answered by the script after it instead
//! ([`settle`]).
//!
//! DEDUCT and REVERT cost no future, task or channel of their own: each is
//! checked, then written straight into its node pipe's next batch
//! ([`crate::pipeline`]) with this connection's [`Mailbox`] and its place
//! in the reply order as the completion, and the answers that arrived come
//! back in one wake. Only what needs the redis crate (a redirect, a lost
//! connection, the operators' commands) runs as a future.

use super::command::Serve;
use super::{
    Caller, Concluded, Prepared, StockCall, StockCommand, StockResult, StockService, Touches,
};
use crate::pipeline::{Answer, Completion, Mailbox, PipeError};
use crate::reply::{Protocol, Reply};
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

/// A connection's requests in flight: its replies owed, in order, and the
/// stock calls behind them.
pub struct InFlight<'a> {
    service: &'a Arc<StockService>,
    replies: Replies,
    /// Where the node pipes deliver this connection's answers.
    mailbox: Arc<Mailbox>,
    /// The answers taken from the mailbox, being settled.
    arrived: Vec<(u64, Result<Answer, PipeError>)>,
    running: Running<'a>,
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

impl<'a> InFlight<'a> {
    pub fn new(service: &'a Arc<StockService>) -> InFlight<'a> {
        InFlight {
            service,
            replies: Replies::default(),
            mailbox: Arc::new(Mailbox::default()),
            arrived: Vec::new(),
            running: Running::default(),
        }
    }

    /// Requests read and not yet written back.
    pub fn len(&self) -> usize {
        self.replies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// A reply made on the spot (a connection-level command, an error),
    /// in its place in the order.
    pub fn push_reply(&mut self, reply: Reply, protocol: Protocol) {
        self.replies.push(reply, protocol);
    }

    /// A stock command (its arguments after the name, arity checked),
    /// read at `arrived`: sent at once unless an unfinished request before
    /// it touches what it touches. `caller` says who sent it, asked only
    /// by the commands whose audit log names their sender.
    pub fn push(
        &mut self,
        command: StockCommand,
        args: Vec<Bytes>,
        arrived: Instant,
        caller: impl FnOnce() -> Caller,
        protocol: Protocol,
    ) {
        // Only a command served by a future of its own reads its caller:
        // the rest, every DEDUCT among them, name none.
        let caller = match command.describe().serve {
            Serve::Alone(_) => Some(Box::new(caller())),
            Serve::Single(_) | Serve::Order(_) => None,
        };
        let request = Request {
            command,
            args,
            arrived,
            caller,
        };
        let service = self.service;
        let replies = &mut self.replies;
        let touches = command.touches(&request.args);
        let kind = Kind::of(touches);
        let lines = Lines::of(touches);
        let sku = request.args.first().map_or(&[][..], |sku| &sku[..]);
        let how = || match kind {
            Kind::Piped if service.would_read_first(command, &request.args) => Sending::ReadFirst,
            Kind::Piped => Sending::Script,
            _ => Sending::Alone,
        };
        if replies.must_wait(replies.len(), kind, sku, lines.as_deref(), how) {
            replies.push_held(protocol, kind, request);
            replies.set_lines(lines);
        } else {
            let ticket = replies.next_ticket();
            // Its slot is made in the state the start leaves it in: a call
            // is written into it once.
            match start(service, &self.mailbox, ticket, request) {
                Started::Answered(reply) => replies.push(reply, protocol),
                Started::Piped(call) => replies.push_sent(protocol, kind, call),
                started => {
                    replies.push_stock(protocol, kind);
                    replies.set_lines(lines);
                    carry_on(service, replies, &mut self.running, ticket, started);
                }
            }
        }
    }

    /// Settles every answer that is in and every future that is done,
    /// without waiting, and sends what they held back.
    pub fn progress(&mut self) {
        if self.mailbox.take(&mut self.arrived) {
            for (ticket, answer) in self.arrived.drain(..) {
                if let Some(call) = self.replies.take_sent(ticket) {
                    settle(
                        self.service,
                        &mut self.replies,
                        &mut self.running,
                        ticket,
                        call,
                        answer,
                    );
                }
            }
        }
        while let Some(Some((ticket, reply))) = self.running.next().now_or_never() {
            self.replies.answer(ticket, reply);
        }
        if self.replies.held > 0 {
            release_held(
                self.service,
                &mut self.replies,
                &mut self.running,
                &self.mailbox,
            );
        }
    }

    /// Encodes every reply that is next in order.
    pub fn write_ready(&mut self, output: &mut BytesMut) {
        self.replies.write_ready(output);
    }

    /// Whether an answer is owed by a node pipe or a future: then
    /// [`InFlight::arrival`] has something to wait for.
    pub fn awaits(&self) -> bool {
        self.replies.sent > 0 || !self.running.is_empty()
    }

    /// Whether a call is with a node pipe (whose answer may be overdue).
    pub fn with_pipes(&self) -> bool {
        self.replies.sent > 0
    }

    /// Ready once an answer has arrived (settled by the next
    /// [`InFlight::progress`]) or a future is done (answered here).
    pub fn arrival(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            if self.replies.sent > 0 && self.mailbox.poll_wake(cx).is_ready() {
                return Poll::Ready(());
            }
            if let Some(running) = &mut self.running.0
                && let Poll::Ready(Some((ticket, reply))) = running.poll_next_unpin(cx)
            {
                self.replies.answer(ticket, reply);
                return Poll::Ready(());
            }
            Poll::Pending
        })
    }

    /// Answers every call whose pipe has not answered it by `overdue`
    /// (past its deadline: a pipe that can't run).
    pub fn answer_overdue(&mut self, overdue: tokio::time::Instant) {
        while let Some((ticket, call)) = self.replies.take_overdue(overdue) {
            settle(
                self.service,
                &mut self.replies,
                &mut self.running,
                ticket,
                call,
                Err(PipeError::Timeout),
            );
        }
    }

    /// Whether it keeps room while nothing is in flight.
    pub fn holds_memory(&self) -> bool {
        self.replies.holds_memory()
    }

    /// Gives back the reply slots and answer lists of an idle connection,
    /// each as large as its busiest moment needed (a `VecDeque` never
    /// shrinks: one pipelined handshake left 8 slots of 300 bytes). The
    /// next request allocates again.
    pub fn give_back(&mut self) {
        if self.replies.holds_memory() {
            self.replies.slots = VecDeque::new();
        }
        if self.arrived.capacity() > 0 {
            self.arrived = Vec::new();
        }
        self.mailbox.give_back();
        if self.running.is_empty() {
            self.running.0 = None;
        }
    }
}

/// The requests running as futures (the redis crate's paths): made with
/// the first, and dropped again with the connection's other memory
/// ([`InFlight::give_back`]). An empty `FuturesUnordered` holds two allocations, and
/// most connections never run a future.
#[derive(Default)]
struct Running<'a>(Option<FuturesUnordered<BoxFuture<'a, (u64, Reply)>>>);

impl<'a> Running<'a> {
    fn push(&mut self, future: BoxFuture<'a, (u64, Reply)>) {
        self.0
            .get_or_insert_with(FuturesUnordered::new)
            .push(future);
    }

    fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(FuturesUnordered::is_empty)
    }

    /// The next future done (`None` when none is running).
    fn next(&mut self) -> impl Future<Output = Option<(u64, Reply)>> + '_ {
        std::future::poll_fn(|cx| match &mut self.0 {
            Some(running) => running.poll_next_unpin(cx),
            None => std::task::Poll::Ready(None),
        })
    }
}

/// What starting a stock request came to.
enum Started<'a> {
    /// Answered on the spot (code 3).
    Answered(Reply),
    /// With its node pipe.
    Piped(StockCall),
    /// Refused by its node pipe: to be settled (the slow path, or an error).
    Refused(StockCall, PipeError),
    /// Running as a future, on the SKU its request names.
    Future(BoxFuture<'a, (u64, Reply)>, Option<Bytes>),
}

/// Starts the stock request of `ticket`: checked and answered on the spot
/// (code 3), written into its node pipe, or made a future.
#[inline]
fn start<'a>(
    service: &'a Arc<StockService>,
    mailbox: &Arc<Mailbox>,
    ticket: u64,
    request: Request,
) -> Started<'a> {
    let Request {
        command,
        args,
        arrived,
        caller,
    } = request;
    match service.prepare(command, &args, arrived) {
        Some(Prepared::Answered(result)) => Started::Answered(stock_reply(result)),
        Some(Prepared::Call(call)) => {
            let completion = Completion::Mailbox(mailbox.clone(), ticket);
            match service.submit(&call, completion) {
                Ok(()) => Started::Piped(call),
                Err((refused, _)) => Started::Refused(call, refused),
            }
        }
        None => {
            let sku = args.first().cloned();
            let future = async move {
                let caller = caller.map(|c| *c).unwrap_or_default();
                let reply = service.serve(command, &args, arrived, &caller).await;
                (ticket, reply)
            }
            .boxed();
            Started::Future(future, sku)
        }
    }
}

/// What the slot of `ticket` (pending) becomes once its request `started`.
fn carry_on<'a>(
    service: &'a Arc<StockService>,
    replies: &mut Replies,
    running: &mut Running<'a>,
    ticket: u64,
    started: Started<'a>,
) {
    match started {
        Started::Answered(reply) => replies.answer(ticket, reply),
        Started::Piped(call) => replies.sent(ticket, call),
        Started::Refused(call, refused) => {
            settle(service, replies, running, ticket, call, Err(refused))
        }
        Started::Future(future, sku) => {
            replies.running(ticket, sku);
            running.push(future);
        }
    }
}

/// Runs the slow path of `call` (the redis crate) as a future.
fn fall_back<'a>(
    service: &'a Arc<StockService>,
    replies: &mut Replies,
    running: &mut Running<'a>,
    ticket: u64,
    call: StockCall,
) {
    replies.running(ticket, Some(Bytes::copy_from_slice(call.sku())));
    running.push(async move { (ticket, stock_reply(service.fallback(call).await)) }.boxed());
}

/// Sends every held request (and held fallback) that nothing unfinished
/// before it holds back any more, in order.
fn release_held<'a>(
    service: &'a Arc<StockService>,
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
                let started = start(service, mailbox, ticket, request);
                carry_on(service, replies, running, ticket, started);
            }
            Released::Fallback(call) => fall_back(service, replies, running, ticket, *call),
        }
    }
}

/// A call's answer (or why there is none) made its reply: at once when the
/// answer settles it, or through a fallback future (held until the earlier
/// requests of its SKU are done: the slow path is not the pipe's order).
fn settle<'a>(
    service: &'a Arc<StockService>,
    replies: &mut Replies,
    running: &mut Running<'a>,
    ticket: u64,
    call: StockCall,
    answer: Result<Answer, PipeError>,
) {
    if call.reads_first() && answer.is_ok() && replies.fallback_must_wait(ticket, call.sku()) {
        // An earlier request of this SKU was not done when this read ran,
        // and takes effect after it (its script through the slow path): an
        // answer from the read would come before that effect. The script
        // answers instead, after it.
        let call = service.script_instead(call);
        replies.hold_fallback(ticket, call);
        return;
    }
    match service.conclude(call, answer) {
        Concluded::Answered(result) => replies.answer(ticket, stock_reply(result)),
        Concluded::Fallback(call) => {
            if replies.fallback_must_wait(ticket, call.sku()) {
                replies.hold_fallback(ticket, call);
            } else {
                fall_back(service, replies, running, ticket, call);
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
/// at once, so a pipeline over many SKUs loses nothing; and while every
/// unfinished request is a plain script call with its pipe (a pipeline of
/// DEDUCTs), a new script call goes without a look at any of them.
#[derive(Default)]
struct Replies {
    slots: VecDeque<Slot>,
    /// The ticket of `slots[0]`.
    first: u64,
    /// Slots whose call is with a node pipe.
    sent: usize,
    /// Stock slots not answered yet...
    open: usize,
    /// ...of which the ones that touch everything (orders)...
    open_all: usize,
    /// ...and the ones not in a node pipe's order: all but a plain script
    /// call with its pipe (held back, running as a future or a fallback,
    /// reading first). While none is, a script call never waits.
    irregular: usize,
    /// Slots held back (a request not sent yet, or a fallback not run yet).
    held: usize,
}

/// What a slot's request touches ([`Touches`], without the SKU's name:
/// that is the request's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Not a stock request: answered on the spot.
    Local,
    Piped,
    Sku,
    /// An ORDER or ORDER.HOLD ([`Lines`]).
    Lines,
    All,
}

impl Kind {
    fn of(touches: Touches<'_>) -> Kind {
        match touches {
            Touches::Piped(_) => Kind::Piped,
            Touches::Sku(_) => Kind::Sku,
            Touches::Lines { .. } => Kind::Lines,
            Touches::All => Kind::All,
        }
    }
}

/// What an ORDER or ORDER.HOLD touches ([`Touches::Lines`]): its order
/// and its lines' SKUs, kept with its slot while it is unfinished (its
/// request moves into the saga's future).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lines {
    id: Bytes,
    skus: Vec<Bytes>,
}

impl Lines {
    fn of(touches: Touches<'_>) -> Option<Box<Lines>> {
        let Touches::Lines { id, pairs } = touches else {
            return None;
        };
        Some(Box::new(Lines {
            id: Bytes::copy_from_slice(id),
            skus: pairs.iter().step_by(2).cloned().collect(),
        }))
    }

    fn has(&self, sku: &[u8]) -> bool {
        self.skus.iter().any(|s| &s[..] == sku)
    }

    /// Two orders that share their order or a SKU.
    fn meets(&self, other: &Lines) -> bool {
        self.id == other.id || self.skus.iter().any(|s| other.has(s))
    }
}

/// One request's place in the reply order, and the protocol its reply is
/// encoded in (fixed when the request was read: a later HELLO doesn't
/// change it).
struct Slot {
    protocol: Protocol,
    state: SlotState,
    kind: Kind,
    /// The SKU of a request running as a future (its call moved into it).
    running_sku: Option<Bytes>,
    /// An order's footprint, while it is unfinished.
    lines: Option<Box<Lines>>,
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

impl SlotState {
    /// A plain script call with its node pipe: in the pipe's order with
    /// the later calls of its SKU (a read-first DEDUCT may yet take the
    /// slow path: it is not).
    fn is_plain(&self) -> bool {
        matches!(self, SlotState::Sent(call) if !call.reads_first())
    }
}

/// What a slot in some state counts for ([`Replies::tally`]).
#[derive(Clone, Copy)]
struct Counted {
    sent: bool,
    open: bool,
    all: bool,
    irregular: bool,
    held: bool,
}

impl Counted {
    #[inline(always)]
    fn of(kind: Kind, state: &SlotState) -> Counted {
        let open = kind != Kind::Local && !matches!(state, SlotState::Ready(_));
        Counted {
            sent: matches!(state, SlotState::Sent(_)),
            open,
            all: open && kind == Kind::All,
            irregular: open && !state.is_plain(),
            held: matches!(state, SlotState::Held(_) | SlotState::HeldFallback(_)),
        }
    }
}

/// What [`Replies::take_releasable`] hands back to be sent.
enum Released {
    Request(Request),
    Fallback(Box<StockCall>),
}

impl Slot {
    fn is_open(&self) -> bool {
        self.kind != Kind::Local && !matches!(self.state, SlotState::Ready(_))
    }

    /// The SKU its request is on, while it is open.
    fn sku(&self) -> Option<&[u8]> {
        match &self.state {
            SlotState::Sent(call) | SlotState::HeldFallback(call) => Some(call.sku()),
            SlotState::Held(request) => request.args.first().map(|sku| &sku[..]),
            SlotState::Pending => self.running_sku.as_deref(),
            SlotState::Ready(_) => None,
        }
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

impl Replies {
    fn len(&self) -> usize {
        self.slots.len()
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether it keeps room for slots it has none in (see [`give_back`]).
    fn holds_memory(&self) -> bool {
        self.slots.is_empty() && self.slots.capacity() > 0
    }

    /// The ticket the next request pushed gets.
    fn next_ticket(&self) -> u64 {
        self.first + self.slots.len() as u64
    }

    /// Counts a slot's state in (`+1`) or out (`-1`): every change of a
    /// slot's state goes through here, so the counts stay exact.
    #[inline(always)]
    fn tally(&mut self, counted: Counted, sign: isize) {
        let step = |count: &mut usize, on: bool| {
            if on {
                *count = count.wrapping_add_signed(sign);
            }
        };
        step(&mut self.sent, counted.sent);
        step(&mut self.open, counted.open);
        step(&mut self.open_all, counted.all);
        step(&mut self.irregular, counted.irregular);
        step(&mut self.held, counted.held);
    }

    fn push_slot(&mut self, protocol: Protocol, kind: Kind, state: SlotState) {
        self.tally(Counted::of(kind, &state), 1);
        self.slots.push_back(Slot {
            protocol,
            state,
            kind,
            running_sku: None,
            lines: None,
        });
    }

    /// The footprint of the order just pushed.
    fn set_lines(&mut self, lines: Option<Box<Lines>>) {
        if let Some(slot) = self.slots.back_mut() {
            slot.lines = lines;
        }
    }

    /// Sets the state of the slot at `index`, in place: a state is large
    /// (a call in it is written once, not moved about).
    #[inline(always)]
    fn set_state(&mut self, index: usize, state: SlotState) {
        let kind = self.slots[index].kind;
        let before = Counted::of(kind, &self.slots[index].state);
        let after = Counted::of(kind, &state);
        self.slots[index].state = state;
        self.tally(before, -1);
        self.tally(after, 1);
    }

    /// [`Replies::set_state`], handing back the state before.
    fn take_state(&mut self, index: usize, state: SlotState) -> SlotState {
        let kind = self.slots[index].kind;
        let before = Counted::of(kind, &self.slots[index].state);
        let after = Counted::of(kind, &state);
        let taken = std::mem::replace(&mut self.slots[index].state, state);
        self.tally(before, -1);
        self.tally(after, 1);
        taken
    }

    fn push(&mut self, reply: Reply, protocol: Protocol) {
        self.push_slot(protocol, Kind::Local, SlotState::Ready(reply));
    }

    /// A stock request about to be sent ([`Replies::sent`],
    /// [`Replies::running`] or [`Replies::answer`] follows).
    fn push_stock(&mut self, protocol: Protocol, kind: Kind) {
        self.push_slot(protocol, kind, SlotState::Pending);
    }

    /// A stock request with its node pipe from the start.
    fn push_sent(&mut self, protocol: Protocol, kind: Kind, call: StockCall) {
        self.sent += 1;
        self.open += 1;
        if call.reads_first() {
            self.irregular += 1;
        }
        self.slots.push_back(Slot {
            protocol,
            state: SlotState::Sent(call),
            kind,
            running_sku: None,
            lines: None,
        });
    }

    /// A stock request held back until what it must follow is done.
    fn push_held(&mut self, protocol: Protocol, kind: Kind, request: Request) {
        self.push_slot(protocol, kind, SlotState::Held(request));
    }

    /// Whether a request at `index` of `kind` on `sku`, sent `how` (asked
    /// only when an earlier request may touch the same), must wait for an
    /// unfinished request before it.
    fn must_wait(
        &self,
        index: usize,
        kind: Kind,
        sku: &[u8],
        lines: Option<&Lines>,
        how: impl FnOnce() -> Sending,
    ) -> bool {
        if self.open == 0 {
            return false;
        }
        // Every unfinished request a plain script call with its pipe: a
        // script call (or a read) behind them keeps the pipe's order.
        if kind == Kind::Piped && self.open_all == 0 && self.irregular == 0 {
            return false;
        }
        let how = how();
        self.slots.iter().take(index).any(|earlier| {
            if !earlier.is_open() {
                return false;
            }
            if earlier.kind == Kind::All || kind == Kind::All {
                return true;
            }
            match (earlier.lines.as_deref(), lines) {
                (Some(earlier), Some(lines)) => return earlier.meets(lines),
                (Some(earlier), None) => return earlier.has(sku),
                (None, Some(lines)) => return earlier.sku().is_some_and(|s| lines.has(s)),
                (None, None) => {}
            }
            earlier.sku() == Some(sku)
                && !matches!(
                    (earlier.with_pipe(), how),
                    (Some(Sending::Script), Sending::Script | Sending::ReadFirst)
                        | (Some(Sending::ReadFirst), Sending::ReadFirst)
                )
        })
    }

    /// Whether the fallback of `ticket`, on `sku`, must wait for an
    /// unfinished request before it on its SKU.
    fn fallback_must_wait(&self, ticket: u64, sku: &[u8]) -> bool {
        let Some(index) = self.index(ticket) else {
            return false;
        };
        let slot = &self.slots[index];
        self.must_wait(index, slot.kind, sku, slot.lines.as_deref(), || {
            Sending::Alone
        })
    }

    fn hold_fallback(&mut self, ticket: u64, call: StockCall) {
        if let Some(index) = self.index(ticket) {
            self.set_state(index, SlotState::HeldFallback(call));
        }
    }

    /// The request of `ticket` runs as a future now, on `sku`.
    fn running(&mut self, ticket: u64, sku: Option<Bytes>) {
        if let Some(index) = self.index(ticket) {
            self.slots[index].running_sku = sku;
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
            let how = match (&slot.state, slot.kind) {
                (SlotState::Held(_), Kind::Piped) => Sending::Script,
                (SlotState::Held(_) | SlotState::HeldFallback(_), _) => Sending::Alone,
                _ => return false,
            };
            let sku = slot.sku().unwrap_or_default();
            !self.must_wait(i, slot.kind, sku, slot.lines.as_deref(), || how)
        })?;
        let released = match self.take_state(index, SlotState::Pending) {
            SlotState::Held(request) => Released::Request(request),
            SlotState::HeldFallback(call) => Released::Fallback(Box::new(call)),
            _ => unreachable!("found held just above"),
        };
        Some((self.first + index as u64, released))
    }

    fn index(&self, ticket: u64) -> Option<usize> {
        let index = usize::try_from(ticket.checked_sub(self.first)?).ok()?;
        (index < self.slots.len()).then_some(index)
    }

    /// The call of `ticket` is with its node pipe now (its slot was
    /// pending). Written in place, counted by hand: this and the two below
    /// run for every request.
    fn sent(&mut self, ticket: u64, call: StockCall) {
        let Some(index) = self.index(ticket) else {
            return;
        };
        self.sent += 1;
        if self.slots[index].kind != Kind::Local && !call.reads_first() {
            // Pending was irregular; a plain call with its pipe is not.
            self.irregular -= 1;
        }
        self.slots[index].state = SlotState::Sent(call);
    }

    /// The call of `ticket`, if it is still with a pipe (not answered by
    /// the connection's own overdue check meanwhile); its slot pending.
    fn take_sent(&mut self, ticket: u64) -> Option<StockCall> {
        let index = self.index(ticket)?;
        let slot = &mut self.slots[index];
        if !matches!(slot.state, SlotState::Sent(_)) {
            return None;
        }
        let SlotState::Sent(call) = std::mem::replace(&mut slot.state, SlotState::Pending) else {
            unreachable!("checked just above")
        };
        self.sent -= 1;
        if slot.kind != Kind::Local && !call.reads_first() {
            self.irregular += 1;
        }
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
        let before = Counted::of(slot.kind, &slot.state);
        slot.state = SlotState::Ready(reply);
        slot.running_sku = None;
        slot.lines = None;
        // A ready slot counts for nothing.
        self.tally(before, -1);
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

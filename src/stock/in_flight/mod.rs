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
//! ([`precedence`]). A fallback to the redis crate waits for the
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

mod precedence;
mod replies;

use super::command::Serve;
use super::{Caller, Concluded, Prepared, StockCall, StockCommand, StockResult, StockService};
use crate::pipeline::{Answer, Completion, Mailbox, PipeError};
use crate::reply::{Protocol, Reply};
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use precedence::Sending;
use replies::{Kind, Lines, Released, Replies};
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
    /// Who sent it, for the operators' commands and the orders (boxed:
    /// the rest, every DEDUCT among them, move this struct around and
    /// name no caller).
    caller: Option<Box<Caller>>,
    /// The user who sent it, for the access log.
    user: Option<Arc<crate::auth::Account>>,
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
        user: Option<Arc<crate::auth::Account>>,
        protocol: Protocol,
    ) {
        // Only a command served by a future of its own reads its caller:
        // the rest, every DEDUCT among them, name none.
        let caller = match command.describe().serve {
            Serve::Alone(_) | Serve::Order(_) => Some(Box::new(caller())),
            Serve::Single(_) => None,
        };
        let request = Request {
            command,
            args,
            arrived,
            caller,
            user,
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
            replies.push_held(protocol, kind, request, lines);
        } else {
            let ticket = replies.next_ticket();
            // Its slot is made in the state the start leaves it in: a call
            // is written into it once.
            match start(service, &self.mailbox, ticket, request) {
                Started::Answered(reply) => replies.push(reply, protocol),
                Started::Piped(call) => replies.push_sent(protocol, kind, call),
                started => {
                    replies.push_stock(protocol, kind, lines);
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
        user,
    } = request;
    match service.prepare(command, &args, arrived, user) {
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
            Released::Fallback(call) => fall_back(service, replies, running, ticket, call),
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

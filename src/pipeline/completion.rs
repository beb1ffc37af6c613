//! Where a call's answer goes: a oneshot one caller awaits, or a client
//! connection's mailbox; and the wake-up flag a pipe's task waits on.

use super::{PipeError, lock};
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::sync::oneshot;

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
    pub(super) fn complete(self, result: Result<Answer, PipeError>) {
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

    /// Drops the list's room while nothing is in it: an idle connection
    /// keeps none (the next answer allocates again).
    pub fn give_back(&self) {
        let mut arrived = lock(&self.arrived);
        if arrived.is_empty() && arrived.capacity() > 0 {
            *arrived = Vec::new();
        }
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
pub(super) struct Signal {
    raised: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    pub(super) fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Ready (and lowered) once raised.
    pub(super) fn poll_lower(&self, cx: &mut Context<'_>) -> Poll<()> {
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

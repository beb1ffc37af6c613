//! One node pipe's queue: callers write their requests into it under one
//! short lock, bounded (admission), and the pipe's task takes them in
//! batches; a gathered call stays open at its end.

use super::completion::{Completion, Signal};
use super::join::{Open, Part};
use super::{Login, PipeError};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Requests one pipe holds before it has taken them into a batch. Past it,
/// a caller is refused at once: a node that stopped reading must not
/// queue requests without bound (measured before this bound: 2.8 MB
/// queued after 10 s of a zero-window node under load).
const MAX_WAITING: usize = 16 * 1024;

/// A request queued for the pipe's next batch, its bytes in the queue's
/// `output` up to `end`, after the previous waiter's.
pub(super) struct Waiter {
    /// `None` once answered (a timeout before it was sent).
    pub(super) completion: Option<Completion>,
    pub(super) deadline: Instant,
    pub(super) end: usize,
    pub(super) part: Part,
}

/// What callers and the pipe's task share.
pub(super) struct Queue {
    /// Encoded requests the task has not taken yet.
    pub(super) output: BytesMut,
    pub(super) waiting: VecDeque<Waiter>,
    /// After a failed connect, calls are refused until then.
    pub(super) refuse_until: Option<Instant>,
    /// The pipe left the slot table: finish what is in flight, then stop.
    pub(super) retired: bool,
    /// The gathered call still taking members, if any.
    pub(super) open: Open,
    /// The task left the open call queued (an earlier call of its key is
    /// in Redis): a request that doesn't join it must wake the task.
    pub(super) holding: bool,
}

impl Queue {
    /// Writes the open gathered call into `output`: from now on it is bytes
    /// like any other request's.
    pub(super) fn close_open(&mut self) {
        if !self.open.is_open() {
            return;
        }
        // The call's writer moves to its lead, which splits the reply.
        let Some(join) = self.open.join.take() else {
            return;
        };
        // A lone member's call is in the output already.
        if self.open.lone.take().is_none() {
            join.write(&self.open.gathered, &mut self.output);
        }
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

impl Queue {
    /// The open call's lone member ([`Open::lone`]) taken out of the
    /// output into its gathered form: a second member joins it, or the
    /// call stays queued while its output goes.
    pub(super) fn gather_lone(&mut self) {
        let Some((start, marks)) = self.open.lone.take() else {
            return;
        };
        if let Some(join) = &self.open.join {
            join.gather_lone(&self.output[start..], &marks, &mut self.open.gathered);
        }
        self.output.truncate(start);
    }
}

/// How a pipe's connection behaves.
#[derive(Debug, Clone)]
pub(super) struct PipeSettings {
    pub(super) login: Login,
    pub(super) connect_timeout: Duration,
    /// The `WAIT` that ends each batch, with `--wait-replicas`.
    pub(super) wait: Option<Bytes>,
}

pub(super) struct PipeInner {
    pub(super) addr: String,
    pub(super) queue: Mutex<Queue>,
    /// Wakes the task: work was queued, or the pipe was retired.
    pub(super) work: Signal,
}

/// Whether the pipe takes one more request now.
pub(super) fn admit(queue: &mut Queue) -> Result<(), PipeError> {
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

//! One node pipe's queue: callers write their requests into it under one
//! short lock, bounded (admission), and the pipe's task takes them in
//! batches; a gathered call stays open at its end.

use super::completion::{Completion, Signal};
use super::conversation::run;
use super::join::{Gathered, Joinable, Open, Part, join_hash};
use super::{Login, PipeError, lock};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
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
    pub(super) fn start(addr: String, settings: PipeSettings) -> Arc<NodePipe> {
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

    pub(super) fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Queues one request: `encode` writes it at the end of the next batch.
    pub(super) fn submit(
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
    pub(super) fn submit_joinable(
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

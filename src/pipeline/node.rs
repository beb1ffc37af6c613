//! One primary's node pipe, as the slot table holds it: starting it starts
//! its conversation with the node ([`super::conversation`]); submitting
//! writes a request into its queue ([`super::queue`]); dropping the last
//! handle retires it. Above both, so that neither imports the other's
//! caller.

use super::completion::{Completion, Signal};
use super::conversation::run;
use super::join::{Gathered, Joinable, Open, Part, join_hash};
use super::queue::{PipeInner, PipeSettings, Queue, Waiter, admit};
use super::{PipeError, lock};
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

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

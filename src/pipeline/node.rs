//! One primary's node pipe, as the slot table holds it: starting it starts
//! its conversation with the node ([`super::conversation`]); submitting
//! writes a request into its queue ([`super::queue`]); dropping the last
//! handle retires it. Above both, so that neither imports the other's
//! caller.

use super::completion::{Completion, Signal};
use super::conversation::run;
use super::join::{Gathered, Joinable, LoneMarks, Open, Part, join_hash};
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
    /// one. Opening one, `lone` (when given) writes the request as its own
    /// call, its pieces marked; otherwise (and when a second member joins,
    /// [`Join::gather_lone`](super::Join::gather_lone)) `shared` writes what
    /// the members share and `member` each one's own parts.
    pub(super) fn submit_joinable(
        &self,
        deadline: Instant,
        completion: Completion,
        joinable: Joinable<
            '_,
            impl FnOnce(&mut BytesMut) -> LoneMarks,
            impl FnOnce(&mut Gathered),
            impl FnOnce(&mut Gathered),
        >,
    ) -> Result<(), (PipeError, Completion)> {
        let Joinable {
            key,
            join,
            lone,
            shared,
            member,
        } = joinable;
        let mut queue = lock(&self.inner.queue);
        if let Err(refused) = admit(&mut queue) {
            return Err((refused, completion));
        }
        let joins = queue.open.takes(join, key);
        if joins {
            queue.gather_lone();
            member(&mut queue.open.gathered);
        } else {
            queue.close_open();
            let first = queue.waiting.len();
            let Queue { open, output, .. } = &mut *queue;
            open.join = Some(join.clone());
            open.key.extend_from_slice(key);
            open.hash = join_hash(key);
            open.first = first;
            match lone {
                Some(lone) => {
                    let start = output.len();
                    open.lone = Some((start, lone(output)));
                }
                None => {
                    shared(&mut open.gathered);
                    member(&mut open.gathered);
                }
            }
        }
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

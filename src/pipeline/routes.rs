//! The pipes and the slot table: which primary's pipe serves each of the
//! 16384 slots, read without a lock and rebuilt from CLUSTER SLOTS.

use super::completion::{Answer, Completion};
use super::join::{Gathered, Joinable, LoneMarks};
use super::node::NodePipe;
use super::queue::PipeSettings;
use super::{Bound, Login, PipeError};
use crate::config::Durability;
use crate::keys::SLOTS;
use crate::reply::encode_command;
use arc_swap::ArcSwap;
use bytes::BytesMut;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

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
                    .find(|p| p.addr() == *addr)
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

    /// Marks the slot table stale (a MOVED said so); the health loop
    /// rebuilds it soon.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Queues a request for the primary of `slot`: `encode` writes it into
    /// that pipe's next batch, and its answer goes to `completion`. Refused
    /// at once (the completion handed back) when no pipe serves the slot,
    /// the pipe is reconnecting, or it holds too many requests already.
    pub fn submit(
        &self,
        slot: u16,
        deadline: Instant,
        completion: Completion,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<(), (PipeError, Completion)> {
        let routes = self.routes.load();
        match routes.owners.get(slot as usize) {
            Some(&index) if index != u16::MAX => {
                routes.pipes[index as usize].submit(deadline, completion, encode)
            }
            _ => Err((PipeError::Lost, completion)),
        }
    }

    /// [`Pipelines::submit`] of a request that may share one call with
    /// others of the same join key queued on the same pipe at the same
    /// time (see the module's notes). `shared` writes what a call's members
    /// share (run for the first), `member` each one's own parts; the
    /// [`Join`] writes the call from them.
    pub fn submit_joinable(
        &self,
        slot: u16,
        deadline: Instant,
        completion: Completion,
        joinable: Joinable<
            '_,
            impl FnOnce(&mut BytesMut) -> LoneMarks,
            impl FnOnce(&mut Gathered),
            impl FnOnce(&mut Gathered),
        >,
    ) -> Result<(), (PipeError, Completion)> {
        let routes = self.routes.load();
        match routes.owners.get(slot as usize) {
            Some(&index) if index != u16::MAX => {
                routes.pipes[index as usize].submit_joinable(deadline, completion, joinable)
            }
            _ => Err((PipeError::Lost, completion)),
        }
    }

    /// [`Pipelines::submit`], then waits for the answer, never past
    /// `deadline`: the pipe answers a timeout itself, and this wait is
    /// bounded too, so a pipe that cannot run never holds a caller.
    pub async fn call(
        &self,
        slot: u16,
        deadline: Instant,
        bound: Bound,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<Answer, PipeError> {
        let (reply, answer) = oneshot::channel();
        if let Err((refused, _)) = self.submit(slot, deadline, Completion::Oneshot(reply), encode) {
            return Err(refused);
        }
        wait(answer, deadline, bound).await
    }
}

/// The answer `answer` brings, within `deadline` as `bound` says.
pub async fn wait(
    answer: oneshot::Receiver<Result<Answer, PipeError>>,
    deadline: Instant,
    bound: Bound,
) -> Result<Answer, PipeError> {
    match bound {
        Bound::Caller => answer.await.unwrap_or(Err(PipeError::Lost)),
        Bound::Timer => match tokio::time::timeout_at(deadline, answer).await {
            Ok(answer) => answer.unwrap_or(Err(PipeError::Lost)),
            Err(_) => Err(PipeError::Timeout),
        },
    }
}

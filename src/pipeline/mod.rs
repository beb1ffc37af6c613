//! The hot path to Redis: one pipelined connection per primary.
//!
//! DEDUCT and REVERT are one EVALSHA each. Sent through the redis crate's
//! cluster client, every call crosses two channels, two tasks and two
//! oneshots, builds a `Cmd` and a `Value` tree, and arms its own timer:
//! about 20 µs of stockgate's CPU per request (measured with perf and
//! benches/side_by_side), against ~1 µs of its own work. Here instead:
//!
//! - a **node pipe** per primary owns one connection, and a queue that
//!   callers write into directly: a caller encodes its EVALSHA straight
//!   into the pipe's next batch and leaves a [`Completion`] beside it, all
//!   under one short lock, with no channel, task hop or allocation per
//!   request. The pipe's task writes everything queued in one write, so
//!   many clients' requests to one node become one upstream pipeline (which
//!   also costs Redis less per command), and matches replies in order;
//! - a reply is handed over as its raw bytes ([`crate::answer`]) to the
//!   caller's [`Completion`]: a connection's [`Mailbox`] (one per client
//!   connection, many replies per wake) or, for the HTTP face and the
//!   operators' commands, a oneshot;
//! - one deadline timer per pipe: when the oldest request passes its
//!   deadline it is answered with a timeout, and its reply, if it ever
//!   comes, is dropped. Every I/O phase waits in one `select!` with that
//!   timer, so a node that stops reading (its window shut) can't hold a
//!   request past its deadline;
//! - a connection on which a request timed out with its bytes sent (its
//!   reply, or its batch's WAIT, unread) or not all written is given up
//!   at once: reset, its other requests failed over to the slow path, and
//!   a new one opened. Its bytes may be stuck
//!   for good (a black-holed flow: a dropped conntrack or NAT entry, a
//!   firewall that silently discards), where only a new connection is
//!   served, and nothing on a connection tells a stuck flow from a slow
//!   node; client libraries close a connection after a timeout for the same
//!   reason. The first new connection is opened at once; while new ones die
//!   the same way before any reply, the pipe waits [`RECONNECT_FIRST`],
//!   doubling to [`RECONNECT_MOST`], before the next (its calls take the
//!   slow path meanwhile). Each connection has TCP keepalive
//!   ([`crate::net::upstream_keepalive`]), which finds a dropped flow that
//!   carries no request;
//! - the slot table maps each of the 16384 slots to its primary's pipe; it
//!   is read without a lock and rebuilt from CLUSTER SLOTS by the health
//!   loop and after a redirect;
//! - with `--wait-replicas`, each batch ends with one `WAIT`: WAIT covers
//!   every earlier write on its connection, so one per batch confirms the
//!   whole batch (a group commit), and the batch's replies are held until it
//!   answers. Sent per request on a shared connection instead, each WAIT
//!   would block every request behind it for the whole wait timeout when a
//!   replica is gone (the fault suite measured 82 of 86 requests timing out);
//! - requests that may share one call (a hot SKU's DEDUCTs,
//!   [`Pipelines::submit_joinable`]) gather in the queue while they wait:
//!   each joins the call of those before it with the same join key, and
//!   the pipe writes the gathered call once ([`Join`]). While an earlier
//!   call of that key is still in Redis, the gathered one stays queued and
//!   keeps gathering: Redis would run it only after that call anyway, and
//!   one call of n deductions costs it far less than n calls. Each member
//!   keeps its own completion: the call's array reply is split into one
//!   reply per member, in order, and an error of the whole call goes to
//!   each of them.
//!
//! Anything out of the ordinary (MOVED, ASK, TRYAGAIN, CLUSTERDOWN,
//! NOSCRIPT, READONLY, an ACL's NOPERM, a connection lost mid-request) is
//! not handled here: the request goes again through the redis crate (see
//! [`crate::upstream`]), which owns redirects, retries and reconnection.
//! Sending it again is safe because the scripts are idempotent by
//! request_id, and a resend of the same call answers as the first did.

mod completion;
mod conversation;
mod join;
mod node;
mod queue;
mod routes;

pub use completion::{Answer, Completion, Mailbox};
pub use join::{Gathered, Join, Joinable, LoneMarks};
pub use routes::{Pipelines, wait};

use std::sync::{Mutex, MutexGuard};

/// How the node pipes log in.
#[derive(Debug, Clone, Default)]
pub struct Login {
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

/// Who bounds a caller's wait for its answer. The pipe answers every
/// request by its deadline (or as lost when its connection fails); a
/// timer of the caller's own guards only against a pipe whose task
/// stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A timer at the deadline, for this wait.
    Timer,
    /// The caller's own bound over many waits (an order's saga is bounded
    /// as a whole): no timer per wait.
    Caller,
}

/// Why a call through a pipe got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeError {
    /// The deadline passed; the request may or may not have run.
    Timeout,
    /// No connection, or it was lost; the request may or may not have run.
    Lost,
    /// The pipe already holds [`MAX_WAITING`] requests: the node is not
    /// keeping up. This request was not sent.
    Overloaded,
}

/// A lock that a panic elsewhere doesn't poison for good: what it guards
/// (queues of bytes and completions) stays consistent at every await.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

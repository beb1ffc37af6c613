//! The Redis side: a Redis Cluster or one non-cluster Redis, reached with
//! the `redis` crate, shared by every client connection; the node pipes
//! ([`crate::pipeline`]) carry the hot path beside it.
//!
//! stockgate starts serving before Redis answers (a sidecar must not crash
//! loop while Redis restarts); a background task connects, loads the
//! scripts on every primary, and keeps `/readyz` truthful from then on.
//! Until the first connection exists, requests get `UPSTREAM not ready`.
//!
//! - [`connect`] finds the mode (cluster or not) and opens the redis-rs
//!   connection, with timeouts and retries sized by the deadline;
//! - [`topology`] knows the primaries and feeds the node pipes' slot table;
//! - [`eval`] runs scripts: the hot path through a node pipe, and the
//!   redis-rs fallback for everything out of the ordinary;
//! - [`health`] keeps readiness, the scripts and the eviction check up to
//!   date in the background, and replaces a connection given up.
//!
//! A call on the redis crate's shared connection that gets no reply within
//! its deadline gives that connection up ([`Upstream::on_connection`]):
//! its bytes may be stuck for good (a black-holed flow: a dropped
//! conntrack or NAT entry, a firewall that silently discards), and the
//! redis crate keeps a connection until it fails, which a stuck flow never
//! does. The health loop opens a new one within [`health`]'s tick and swaps
//! it in; calls in flight on the old one finish there (their outcome
//! unknown, if they time out too), new calls go on the new one. The node
//! pipes do the same with their own connections ([`crate::pipeline`]).

mod connect;
mod eval;
mod health;
mod topology;

pub use eval::{Piped, Verdict};
use health::ByEval;
pub use health::Eviction;

use crate::config::UpstreamConfig;
use crate::error::{FaultKind, UpstreamError};
use crate::metrics::Metrics;
use crate::pipeline::{Login, Pipelines};
use crate::script::{Calling, CallingNow, Library, LuaScript};
use connect::Connection;
use redis::{Cmd, RedisError, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The mode stockgate settled on: a Redis Cluster, or one non-cluster Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Cluster,
    Standalone,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Cluster => "cluster",
            Mode::Standalone => "standalone",
        }
    }
}

/// A primary, as `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub host: String,
    pub port: u16,
}

/// The upstream, as every part of stockgate sees it.
pub struct Upstream {
    config: UpstreamConfig,
    scripts: Vec<Arc<LuaScript>>,
    /// The scripts as one function library (none for the one-shot tools).
    library: Option<Library>,
    /// How scripts are called now: FCALL once the library is on every
    /// primary and FCALL is allowed, else EVALSHA (see [`health`]).
    calling: Arc<CallingNow>,
    /// Why the library is not in use, when `--scripts auto` fell back to
    /// EVALSHA (for `stockgate check`, INFO and the log).
    calling_why: Mutex<Option<ByEval>>,
    /// A node answered `Function not found`: the health loop loads the
    /// library again within a tick.
    library_lost: AtomicBool,
    /// A call was refused FCALL and went by EVALSHA: the health loop runs
    /// its full check within a tick, to learn where and to say so (and,
    /// with `--scripts function`, to turn not ready).
    recheck: AtomicBool,
    /// Set by the first successful connect; replaced when a call timed out
    /// on it, or when it keeps failing while a fresh one works.
    connection: RwLock<Option<Current>>,
    /// Numbers the connections, from 1, so that a call reports on the one it
    /// used: a late timeout on a connection replaced since condemns nothing.
    generations: AtomicU64,
    /// The newest connection a call timed out on (0: none): the health loop
    /// replaces it while it is the current one.
    dead: AtomicU64,
    /// The newest connection a call was answered on: one given up before
    /// any was waits longer for its successor (see [`health`]).
    answered: AtomicU64,
    ready: AtomicBool,
    metrics: Arc<Metrics>,
    /// The primaries at the last health check, for INFO.
    nodes: Mutex<Vec<Node>>,
    /// The hot path for DEDUCT and REVERT (`crate::pipeline`, which with
    /// --wait-replicas ends each batch with one WAIT); none for TLS
    /// upstreams, which use the redis crate throughout.
    pipelines: Option<Pipelines>,
    /// Why the upstream is not ready, for logs and INFO.
    last_problem: Mutex<Option<String>>,
    /// With --wait-replicas: the slot ranges whose primary had fewer
    /// replicas than asked when the health loop last read the topology,
    /// each with how many it had ([`Upstream::replicas_short`]).
    short_of_replicas: RwLock<Vec<(u16, u16, i64)>>,
}

impl Upstream {
    pub fn new(
        config: UpstreamConfig,
        scripts: Vec<Arc<LuaScript>>,
        metrics: Arc<Metrics>,
    ) -> Arc<Upstream> {
        // rediss:// needs a process-wide rustls crypto provider; installing
        // it twice is harmless (the second call reports the first).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plain = config
            .urls
            .iter()
            .all(|u| u.expose().starts_with("redis://"));
        let pipelines = plain.then(|| {
            let login = redis::IntoConnectionInfo::into_connection_info(config.urls[0].expose())
                .map(|info| {
                    let settings = info.redis_settings();
                    Login {
                        username: settings.username().map(str::to_owned),
                        password: settings.password().map(str::to_owned),
                        db: settings.db(),
                    }
                })
                .unwrap_or_default();
            Pipelines::new(login, config.connect_timeout, config.durability)
        });
        Arc::new(Upstream {
            config,
            library: Library::of(&scripts),
            scripts,
            calling: Arc::default(),
            calling_why: Mutex::new(None),
            library_lost: AtomicBool::new(false),
            recheck: AtomicBool::new(false),
            connection: RwLock::new(None),
            generations: AtomicU64::new(0),
            dead: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            metrics,
            nodes: Mutex::new(Vec::new()),
            pipelines,
            last_problem: Mutex::new(None),
            short_of_replicas: RwLock::new(Vec::new()),
        })
    }

    /// True once Redis is reachable and every script is loaded on every
    /// primary; kept up to date by the health loop (see [`health`] for
    /// how often it checks what).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// How scripts are called now ([`Calling`]): read on every call.
    pub fn calling(&self) -> Calling {
        self.calling.get()
    }

    /// The same, for what writes calls on its own (the coalesced DEDUCT).
    pub fn calling_now(&self) -> Arc<CallingNow> {
        self.calling.clone()
    }

    /// How scripts are called, as INFO and the log say it: `FCALL
    /// (library <name>)`, or `EVALSHA` and why.
    pub fn calling_text(&self) -> String {
        match (self.calling(), &self.library) {
            (Calling::Function, Some(library)) => format!("FCALL (library {})", library.name),
            _ => match &*self.calling_why.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(why) => format!("EVALSHA ({why})"),
                None => "EVALSHA".to_owned(),
            },
        }
    }

    /// The mode, once connected.
    pub fn mode(&self) -> Option<Mode> {
        self.current().map(|current| current.mode)
    }

    /// The connection now (a cheap clone: clones share the sockets).
    fn current(&self) -> Option<Current> {
        self.connection
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The seed URLs, passwords hidden.
    pub fn seeds(&self) -> Vec<String> {
        self.config.urls.iter().map(ToString::to_string).collect()
    }

    /// The overall deadline of one call.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// The primaries seen at the last health check.
    pub fn nodes(&self) -> Vec<Node> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why the upstream is not ready, if it isn't.
    pub fn problem(&self) -> Option<String> {
        self.last_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends one command, routed by its key, within `--timeout`.
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, UpstreamError> {
        self.on_connection(self.config.timeout, async |connection| {
            connection.query(cmd).await
        })
        .await
    }

    /// Runs `call` on the connection now, within `budget`. A call that gets
    /// no reply in time left bytes unread (or unsent) on the connection
    /// every call shares: it is given up, and the health loop replaces it
    /// (see the module docs). A reply, an error reply included, proves it
    /// answers.
    async fn on_connection<T>(
        &self,
        budget: Duration,
        call: impl AsyncFnOnce(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, UpstreamError> {
        let Some(mut current) = self.current() else {
            return Err(UpstreamError::new(
                FaultKind::NotReady,
                "not connected to redis yet",
            ));
        };
        let generation = current.generation;
        match tokio::time::timeout(budget, call(&mut current.connection)).await {
            Ok(Ok(value)) => {
                self.answered.fetch_max(generation, Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(err)) => {
                if err.is_timeout() {
                    // The redis crate's own response timeout: no reply either.
                    self.dead.fetch_max(generation, Ordering::Relaxed);
                } else if matches!(
                    err.kind(),
                    redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                ) {
                    self.answered.fetch_max(generation, Ordering::Relaxed);
                }
                Err(UpstreamError::from_redis(&err))
            }
            Err(_) => {
                self.dead.fetch_max(generation, Ordering::Relaxed);
                Err(UpstreamError::timeout(self.config.timeout))
            }
        }
    }

    /// Sends a pipeline whose commands all name keys of one slot (in
    /// cluster mode it goes to that slot's primary), within `--timeout`.
    pub async fn pipeline(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, UpstreamError> {
        self.on_connection(self.config.timeout, async |connection| {
            connection.pipeline(pipe).await
        })
        .await
    }
}

/// The redis crate's connection now, and what the health loop knows it by.
#[derive(Clone)]
struct Current {
    mode: Mode,
    connection: Connection,
    /// Its number ([`Upstream::generations`]).
    generation: u64,
}

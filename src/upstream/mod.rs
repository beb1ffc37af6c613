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
//!   date in the background.

mod connect;
mod eval;
mod health;
mod topology;

pub use eval::Verdict;
pub use health::Eviction;

use crate::config::UpstreamConfig;
use crate::error::{FaultKind, UpstreamError};
use crate::metrics::Metrics;
use crate::pipeline::{Login, Pipelines};
use crate::redact::redact;
use crate::script::LuaScript;
use connect::Connection;
use redis::{Cmd, Value};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Set by the first successful connect; replaced only when it is stuck.
    connection: RwLock<Option<(Mode, Connection)>>,
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
        let plain = config.urls.iter().all(|u| u.starts_with("redis://"));
        let pipelines = plain.then(|| {
            let login = redis::IntoConnectionInfo::into_connection_info(config.urls[0].as_str())
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
            scripts,
            connection: RwLock::new(None),
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

    /// The mode, once connected.
    pub fn mode(&self) -> Option<Mode> {
        self.current().map(|(mode, _)| mode)
    }

    /// The connection now (a cheap clone: clones share the sockets).
    fn current(&self) -> Option<(Mode, Connection)> {
        self.connection
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The seed URLs, passwords hidden.
    pub fn seeds(&self) -> Vec<String> {
        self.config.urls.iter().map(|u| redact(u)).collect()
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
        let mut connection = self.connection()?;
        match tokio::time::timeout(self.config.timeout, connection.query(cmd)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(UpstreamError::from_redis(&err)),
            Err(_) => Err(UpstreamError::timeout(self.config.timeout)),
        }
    }

    fn connection(&self) -> Result<Connection, UpstreamError> {
        match self.current() {
            Some((_, connection)) => Ok(connection),
            None => Err(UpstreamError::new(
                FaultKind::NotReady,
                "not connected to redis yet",
            )),
        }
    }

    /// Sends a pipeline whose commands all name keys of one slot (in
    /// cluster mode it goes to that slot's primary), within `--timeout`.
    pub async fn pipeline(&self, pipe: &redis::Pipeline) -> Result<Vec<Value>, UpstreamError> {
        let mut connection = self.connection()?;
        match tokio::time::timeout(self.config.timeout, connection.pipeline(pipe)).await {
            Ok(Ok(values)) => Ok(values),
            Ok(Err(err)) => Err(UpstreamError::from_redis(&err)),
            Err(_) => Err(UpstreamError::timeout(self.config.timeout)),
        }
    }
}

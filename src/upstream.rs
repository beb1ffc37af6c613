//! The Redis side: a Redis Cluster or one non-cluster Redis, reached with
//! the `redis` crate, shared by every client connection.
//!
//! stockgate starts serving before Redis answers (a sidecar must not crash
//! loop while Redis restarts); a background task connects, loads the
//! scripts on every primary, and keeps `/readyz` truthful from then on.
//! Until the first connection exists, requests get `UPSTREAM not ready`.

use crate::config::{Durability, UpstreamConfig, UpstreamMode};
use crate::error::{FaultKind, UpstreamError};
use crate::metrics::Metrics;
use crate::outcome::StockReply;
use crate::pipeline::{Login, PipeError, Pipelines};
use crate::redact::redact;
use crate::script::LuaScript;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often readiness is re-checked (script present on every primary).
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a cluster connection may fail its health checks before a fresh
/// one is tried in its place (see [`Upstream::maintain`]).
const REPLACE_AFTER: Duration = Duration::from_secs(5);

/// The mode stockgate settled on, and why.
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

/// One shared, multiplexed, self-reconnecting connection. Cloning it is
/// cheap: every clone talks through the same sockets.
#[derive(Clone)]
enum Connection {
    Cluster(ClusterConnection),
    Standalone(ConnectionManager),
}

impl Connection {
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Connection::Cluster(c) => cmd.query_async(c).await,
            Connection::Standalone(c) => cmd.query_async(c).await,
        }
    }

    /// A pipeline's replies one by one: a command's error reply comes back
    /// as `Value::ServerError` in its place, not as the pipeline's error.
    async fn packed(
        &mut self,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, RedisError> {
        use redis::aio::ConnectionLike;
        match self {
            Connection::Cluster(c) => c.req_packed_commands(pipe, 0, count).await,
            Connection::Standalone(c) => c.req_packed_commands(pipe, 0, count).await,
        }
    }

    async fn pipeline(&mut self, pipe: &redis::Pipeline) -> Result<Vec<Value>, RedisError> {
        match self {
            Connection::Cluster(c) => pipe.query_async(c).await,
            Connection::Standalone(c) => pipe.query_async(c).await,
        }
    }
}

/// Whether a primary may evict keys stockgate needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// `noeviction`, or no memory limit at all.
    Safe(String),
    /// The policy that can evict.
    Risky(String),
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
    /// The hot path for DEDUCT and REVERT (`crate::pipeline`); none for
    /// TLS upstreams and with --wait-replicas, which use the redis crate.
    pipelines: Option<Pipelines>,
    /// Why the upstream is not ready, for logs and INFO.
    last_problem: Mutex<Option<String>>,
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
            Pipelines::new(
                login,
                config.connect_timeout,
                config.timeout,
                config.durability,
            )
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
        })
    }

    /// True once Redis is reachable and every script is loaded on every
    /// primary; re-checked every second.
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

    /// The primaries serving slots now (the one server in standalone mode).
    pub async fn primaries(&self) -> Result<Vec<Node>, UpstreamError> {
        let mut connection = self.connection()?;
        let Connection::Cluster(_) = &connection else {
            let url = redis::Client::open(self.config.urls[0].as_str())
                .map_err(|e| UpstreamError::from_redis(&e))?;
            let addr = url.get_connection_info().addr().to_string();
            let (host, port) = addr.rsplit_once(':').unwrap_or((addr.as_str(), "6379"));
            return Ok(vec![Node {
                host: host.to_owned(),
                port: port.parse().unwrap_or(6379),
            }]);
        };
        let slots = connection
            .query(redis::cmd("CLUSTER").arg("SLOTS"))
            .await
            .map_err(|e| UpstreamError::from_redis(&e))?;
        let mut nodes = Vec::new();
        if let Value::Array(ranges) = slots {
            for range in ranges {
                let Value::Array(items) = range else { continue };
                let Some(Value::Array(primary)) = items.get(2) else {
                    continue;
                };
                if let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                    (primary.first(), primary.get(1))
                {
                    let node = Node {
                        host: String::from_utf8_lossy(host).into_owned(),
                        port: *port as u16,
                    };
                    if !nodes.contains(&node) {
                        nodes.push(node);
                    }
                }
            }
        }
        Ok(nodes)
    }

    /// Sends one command to one primary (SCAN, which walks one node's keys).
    pub async fn query_node(&self, cmd: &Cmd, node: &Node) -> Result<Value, UpstreamError> {
        let mut connection = self.connection()?;
        let call = async {
            match &mut connection {
                Connection::Cluster(c) => {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: node.host.clone(),
                        port: node.port,
                    });
                    c.route_command(cmd.clone(), route).await
                }
                Connection::Standalone(c) => cmd.query_async(c).await,
            }
        };
        match tokio::time::timeout(self.config.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(UpstreamError::from_redis(&err)),
            Err(_) => Err(UpstreamError::timeout(self.config.timeout)),
        }
    }

    /// Connects once, without the readiness loop (for one-shot tools).
    pub async fn connect_once(&self) -> Result<Mode, String> {
        if self.current().is_none() {
            self.connect().await?;
        }
        Ok(self.mode().expect("connected"))
    }

    /// Rebuilds the node pipes' slot table from CLUSTER SLOTS (or the one
    /// standalone server).
    async fn refresh_routes(&self) {
        let Some(pipelines) = &self.pipelines else {
            return;
        };
        let ranges = match self.mode() {
            Some(Mode::Standalone) => match self.primaries().await {
                Ok(nodes) => nodes
                    .into_iter()
                    .take(1)
                    .map(|n| (0, crate::keys::SLOTS - 1, format!("{}:{}", n.host, n.port)))
                    .collect(),
                Err(_) => return,
            },
            Some(Mode::Cluster) => {
                let mut slots = redis::cmd("CLUSTER");
                slots.arg("SLOTS");
                match self.query(&slots).await {
                    Ok(Value::Array(ranges)) => ranges
                        .into_iter()
                        .filter_map(|range| {
                            let Value::Array(items) = range else {
                                return None;
                            };
                            let (
                                Some(Value::Int(lo)),
                                Some(Value::Int(hi)),
                                Some(Value::Array(primary)),
                            ) = (items.first(), items.get(1), items.get(2))
                            else {
                                return None;
                            };
                            let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                                (primary.first(), primary.get(1))
                            else {
                                return None;
                            };
                            Some((
                                *lo as u16,
                                *hi as u16,
                                format!("{}:{port}", String::from_utf8_lossy(host)),
                            ))
                        })
                        .collect::<Vec<_>>(),
                    _ => return,
                }
            }
            None => return,
        };
        pipelines.set_routes(&ranges);
    }

    /// Runs DEDUCT or REVERT: through the primary's node pipe when there is
    /// one, else (or when the pipe meets a redirect, a lost script or a lost
    /// connection) through the redis crate, with what is left of
    /// `--timeout`. Running it twice is safe: the scripts are idempotent.
    pub async fn eval_stock(
        &self,
        script: &LuaScript,
        keys: [&[u8]; 2],
        args: &[&[u8]],
    ) -> Result<StockReply, UpstreamError> {
        let started = tokio::time::Instant::now();
        if let Some(pipelines) = &self.pipelines {
            let mut request = bytes::BytesMut::with_capacity(256);
            crate::reply::evalsha(&mut request, &script.sha, &keys, args);
            let request = request.freeze();
            let slot = crate::keys::slot(keys[0]);
            match pipelines
                .call(slot, request, started + self.config.timeout)
                .await
            {
                Ok(answer) => match answer.frame {
                    redis_protocol::resp2::types::BytesFrame::Error(text) => {
                        let (code, detail) = text.split_once(' ').unwrap_or((&text, ""));
                        if !UpstreamError::is_redirect(code) {
                            return Err(UpstreamError::from_server_error(code, detail));
                        }
                        if code == "MOVED" {
                            pipelines.mark_stale();
                        }
                    }
                    frame => {
                        let reply = StockReply::from_frame(frame)?;
                        if let (Some(durability), Some(confirmed)) =
                            (self.config.durability, answer.replicas)
                        {
                            replicated(reply.code as i64, confirmed, durability)?;
                        }
                        return Ok(reply);
                    }
                },
                Err(PipeError::Timeout) => return Err(UpstreamError::timeout(self.config.timeout)),
                Err(PipeError::Lost) => {}
            }
        }
        let left = self.config.timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(UpstreamError::timeout(self.config.timeout));
        }
        let value = self
            .eval_within(script, keys.as_slice(), args, left)
            .await?;
        StockReply::from_script(value)
    }

    /// Runs `script` with EVALSHA on the node that owns `keys[0]`, falling
    /// back to EVAL there on NOSCRIPT, all within `--timeout`.
    pub async fn eval(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, UpstreamError> {
        self.eval_within(script, keys, args, self.config.timeout)
            .await
    }

    /// `eval`, within `budget`.
    async fn eval_within(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        budget: Duration,
    ) -> Result<Value, UpstreamError> {
        if let Some(durability) = self.config.durability {
            return self.eval_durably(script, keys, args, durability).await;
        }
        let mut connection = self.connection()?;
        let call = async move {
            let evalsha = script_call("EVALSHA", &script.sha, keys, args);
            match connection.query(&evalsha).await {
                Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    tracing::debug!(script = script.name, "NOSCRIPT; sending the body with EVAL");
                    let eval = script_call("EVAL", &script.body, keys, args);
                    connection.query(&eval).await
                }
                other => other,
            }
        };
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(UpstreamError::from_redis(&err)),
            Err(_) => Err(UpstreamError::timeout(self.config.timeout)),
        }
    }

    /// `eval`, then WAIT on the same node in the same pipeline: a reply that
    /// states the request's record (codes 0, 1 and 4: it wrote it now, or
    /// reports what an earlier call wrote) stands only once `replicas`
    /// replicas confirmed it. Codes 2 and 3 state nothing and pass.
    ///
    /// A duplicate (1) must wait too: the retry of a write answered `not
    /// replicated` finds the record on the primary and would otherwise be
    /// acknowledged while no replica has it, and a failover then loses an
    /// acknowledged deduction. WAIT covers the writes this connection made,
    /// and every call to a node shares one connection, so it covers the
    /// earlier call's write unless that came through another connection.
    async fn eval_durably(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        durability: crate::config::Durability,
    ) -> Result<Value, UpstreamError> {
        let mut connection = self.connection()?;
        let wait_ms = durability.timeout.as_millis() as u64;
        let call = async move {
            let pipeline = |verb: &str, script_text: &str| {
                let mut pipe = redis::pipe();
                pipe.add_command(script_call(verb, script_text, keys, args))
                    .cmd("WAIT")
                    .arg(durability.replicas)
                    .arg(wait_ms);
                pipe
            };
            let mut replies = connection
                .packed(&pipeline("EVALSHA", &script.sha), 2)
                .await?;
            let noscript = matches!(&replies.first(), Some(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::NoScript));
            if noscript {
                replies = connection
                    .packed(&pipeline("EVAL", &script.body), 2)
                    .await?;
            }
            Ok::<_, RedisError>(replies)
        };
        let replies = match tokio::time::timeout(self.config.timeout, call).await {
            Ok(Ok(replies)) => replies,
            Ok(Err(err)) => return Err(UpstreamError::from_redis(&err)),
            Err(_) => return Err(UpstreamError::timeout(self.config.timeout)),
        };
        let mut replies = replies.into_iter();
        let (Some(reply), Some(acks)) = (replies.next(), replies.next()) else {
            return Err(UpstreamError::new(
                FaultKind::BadReply,
                "the script and WAIT pipeline answered too few replies",
            ));
        };
        let reply = reply
            .extract_error()
            .map_err(|e| UpstreamError::from_redis(&e))?;
        if let Value::Array(items) = &reply
            && let Some(Value::Int(code)) = items.first()
        {
            let confirmed = match acks {
                Value::Int(n) => n,
                // WAIT itself failed: nothing is confirmed.
                _ => -1,
            };
            replicated(*code, confirmed, durability)?;
        }
        Ok(reply)
    }

    /// Connects, loads the scripts, and keeps readiness up to date until
    /// `stop` is cancelled.
    ///
    /// A cluster connection that has failed every check for
    /// [`REPLACE_AFTER`] is replaced by a fresh one, if a fresh one works:
    /// after every node went down and came back, redis-rs's cluster client
    /// can stay stuck answering "No connections found" for good (its slot
    /// refresh retries its own emptied connection map and never goes back
    /// to the seeds), so stockgate would never serve again without a
    /// restart (tests/faults network::whole_upstream_down_then_back, long
    /// variant, about one outage in twenty).
    pub async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let mut failing_since: Option<std::time::Instant> = None;
        loop {
            let outcome = match self.current() {
                None => self.connect().await,
                Some((mode, connection)) => match self.ensure_scripts(connection).await {
                    Ok(()) => Ok(()),
                    Err(problem) => {
                        let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                        if mode == Mode::Cluster && since.elapsed() >= REPLACE_AFTER {
                            match self.connect().await {
                                Ok(()) => {
                                    tracing::warn!(
                                        %problem,
                                        "replaced a cluster connection that kept failing while a fresh one works"
                                    );
                                    Ok(())
                                }
                                Err(_) => Err(problem),
                            }
                        } else {
                            Err(problem)
                        }
                    }
                },
            };
            if outcome.is_ok() {
                failing_since = None;
                if let Ok(nodes) = self.primaries().await {
                    *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = nodes;
                }
                self.refresh_routes().await;
            }
            self.set_ready(outcome);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(HEALTH_INTERVAL) => {}
            }
        }
    }

    fn set_ready(&self, outcome: Result<(), String>) {
        let was_ready = self.ready.swap(outcome.is_ok(), Ordering::Relaxed);
        self.metrics
            .set_upstream_ready(outcome.is_ok(), was_ready != outcome.is_ok());
        let mut last = self.last_problem.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(()) => {
                if !was_ready {
                    tracing::info!(
                        mode = self.mode().map(Mode::as_str),
                        "upstream ready: redis reachable and scripts loaded on every primary"
                    );
                }
                *last = None;
            }
            Err(problem) => {
                // Log a problem when it first appears or changes, not every second.
                if was_ready || last.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(%problem, "upstream not ready");
                }
                *last = Some(problem);
            }
        }
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

    async fn connect(&self) -> Result<(), String> {
        let mode = match self.config.mode {
            UpstreamMode::Cluster => Mode::Cluster,
            UpstreamMode::Standalone => Mode::Standalone,
            UpstreamMode::Auto => self.detect_mode().await?,
        };
        let connection = match mode {
            Mode::Cluster => Connection::Cluster(self.connect_cluster().await?),
            Mode::Standalone => Connection::Standalone(self.connect_standalone().await?),
        };
        self.ensure_scripts(connection.clone()).await?;
        // The first connection, or one that replaces a stuck one; requests
        // in flight keep the old one until they finish.
        *self.connection.write().unwrap_or_else(|e| e.into_inner()) = Some((mode, connection));
        self.warn_about_eviction().await;
        Ok(())
    }

    /// Logs a warning for each primary whose eviction policy can lose data:
    /// `volatile-*` policies evict exactly the idempotency records (the only
    /// keys with a TTL), so a retry would deduct again; `allkeys-*` can evict
    /// stock. `stockgate check` explains the same, as a FAIL.
    async fn warn_about_eviction(&self) {
        let Ok(nodes) = self.primaries().await else {
            return;
        };
        for node in nodes {
            match self.eviction(&node).await {
                Ok(Eviction::Safe(_)) => {}
                Ok(Eviction::Risky(policy)) => tracing::warn!(
                    node = %format!("{}:{}", node.host, node.port),
                    policy,
                    "maxmemory-policy can evict idempotency records (volatile-*) or stock (allkeys-*); use noeviction"
                ),
                Err(err) => tracing::debug!(%err, "cannot read maxmemory-policy"),
            }
        }
    }

    /// A primary's eviction settings.
    pub async fn eviction(&self, node: &Node) -> Result<Eviction, UpstreamError> {
        let setting = |name: &'static str| async move {
            let mut get = redis::cmd("CONFIG");
            get.arg("GET").arg(name);
            let reply = self.query_node(&get, node).await?;
            let value = match reply {
                Value::Array(items) => items.into_iter().nth(1),
                Value::Map(pairs) => pairs.into_iter().next().map(|(_, v)| v),
                _ => None,
            };
            match value {
                Some(Value::BulkString(v)) => Ok(String::from_utf8_lossy(&v).into_owned()),
                _ => Err(UpstreamError::new(
                    FaultKind::BadReply,
                    format!("CONFIG GET {name} answered an unexpected shape"),
                )),
            }
        };
        let policy = setting("maxmemory-policy").await?;
        let maxmemory = setting("maxmemory").await?;
        Ok(if policy == "noeviction" || maxmemory == "0" {
            Eviction::Safe(format!("maxmemory {maxmemory}, maxmemory-policy {policy}"))
        } else {
            Eviction::Risky(policy)
        })
    }

    /// Asks the seeds, in order, for their version and whether they run in
    /// cluster mode. Redis 7.0 is needed for script flags (`#!lua`).
    async fn detect_mode(&self) -> Result<Mode, String> {
        let mut problems = Vec::new();
        for url in &self.config.urls {
            match self.probe(url).await {
                Ok(mode) => return Ok(mode),
                Err(problem) => problems.push(format!("{}: {problem}", redact(url))),
            }
        }
        Err(problems.join("; "))
    }

    /// A client for one URL, with the --upstream-tls-* certificates.
    fn client(&self, url: &str) -> Result<redis::Client, String> {
        match &self.config.tls {
            Some(tls) => redis::Client::build_with_tls(url, tls.0.clone()),
            None => redis::Client::open(url),
        }
        .map_err(|e| format!("{}: {}", redact(url), explain(&e)))
    }

    async fn probe(&self, url: &str) -> Result<Mode, String> {
        let client = self.client(url)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.connect_timeout))
            .set_response_timeout(Some(self.config.timeout));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| format!("cannot connect: {}", explain(&e)))?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .arg("cluster")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("INFO failed: {e}"))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let version = field("redis_version").unwrap_or("unknown");
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if major < 7 {
            return Err(format!(
                "redis {version} is too old: stockgate needs Redis 7.0 or newer (script flags)"
            ));
        }
        Ok(if field("cluster_enabled") == Some("1") {
            Mode::Cluster
        } else {
            Mode::Standalone
        })
    }

    async fn connect_cluster(&self) -> Result<ClusterConnection, String> {
        // Retrying a DEDUCT is safe only because the script is idempotent:
        // a retry after a lost reply finds the record and answers 1. That is
        // what lets the client retry on MOVED, ASK, TRYAGAIN, CLUSTERDOWN and
        // dropped connections at all. The crate's default backoff waits at
        // least 1.28 s before each retry, longer than the whole --timeout;
        // these waits are in milliseconds, 2 to 100, doubling from 8. The
        // deadline, not the retry count, ends the retries: see cluster_retries.
        let mut builder = ClusterClientBuilder::new(self.config.urls.clone());
        if let Some(tls) = &self.config.tls {
            builder = builder.certs(tls.0.clone());
        }
        let client = builder
            .connection_timeout(self.config.connect_timeout)
            .response_timeout(self.config.timeout)
            .overall_response_timeout(Some(self.config.timeout))
            .retries(cluster_retries(self.config.timeout))
            .min_retry_wait(2)
            .max_retry_wait(100)
            .retry_wait_formula(8, 2)
            .build()
            .map_err(|e| format!("cluster client: {e}"))?;
        client
            .get_async_connection()
            .await
            .map_err(|e| format!("cannot connect to the cluster: {}", explain(&e)))
    }

    async fn connect_standalone(&self) -> Result<ConnectionManager, String> {
        let url = &self.config.urls[0];
        let client = self.client(url)?;
        // The manager reconnects in the background; requests made while it
        // is down fail at once and the caller retries with the same id.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.config.connect_timeout))
            .set_response_timeout(Some(self.config.timeout))
            .set_number_of_retries(3)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| format!("cannot connect to {}: {}", redact(url), explain(&e)))
    }

    /// Loads every script on every primary where it is missing. In cluster
    /// mode the crate sends SCRIPT EXISTS and SCRIPT LOAD to all primaries.
    async fn ensure_scripts(&self, mut connection: Connection) -> Result<(), String> {
        for script in &self.scripts {
            let mut exists = redis::cmd("SCRIPT");
            exists.arg("EXISTS").arg(&script.sha);
            let present = match connection.query(&exists).await {
                Ok(Value::Array(flags)) => flags.iter().all(|f| matches!(f, Value::Int(1))),
                Ok(Value::Int(flag)) => flag == 1,
                Ok(other) => return Err(format!("SCRIPT EXISTS answered {other:?}")),
                Err(err) => return Err(format!("redis unreachable: {err}")),
            };
            if !present {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(&script.body);
                connection
                    .query(&load)
                    .await
                    .map_err(|e| format!("SCRIPT LOAD {} failed: {e}", script.name))?;
                tracing::info!(script = script.name, sha = %script.sha, "script loaded on every primary");
            }
        }
        Ok(())
    }
}

/// How many retries the cluster client may make within `deadline`.
///
/// redis-rs spends one retry per MOVED or ASK hop and per TRYAGAIN, and
/// sleeps (2 to 100 ms, jittered, about 50 on average) before only some of
/// them: while a slot moves, a new request goes source (ASK), target
/// (TRYAGAIN), sleep, and again. A fixed 8 retries lasted 150 to 400 ms, so
/// a slot move or failover shorter than `--timeout` still reached clients as
/// `-UPSTREAM TryAgain`. Two retries per average sleep over the whole
/// deadline let the deadline decide; the overall response timeout still
/// ends every request on time.
fn cluster_retries(deadline: Duration) -> u32 {
    let sleeps = deadline.as_millis() / 50;
    (2 * sleeps + 4).clamp(8, 10_000) as u32
}

/// With `--wait-replicas`, a reply that reports the request's record
/// (code 0: written now; 1 and 4: written before, perhaps through another
/// connection, perhaps lost in a failover since) stands only once enough
/// replicas confirmed it. Codes 2 and 3 wrote nothing and pass.
fn replicated(code: i64, confirmed: i64, durability: Durability) -> Result<(), UpstreamError> {
    if !matches!(code, 0 | 1 | 4) || confirmed >= i64::from(durability.replicas) {
        return Ok(());
    }
    Err(UpstreamError::new(
        FaultKind::NotReplicated,
        format!(
            "not replicated: {} of {} replicas confirmed the write within {} ms, so it may be lost if its primary fails",
            confirmed.max(0),
            durability.replicas,
            durability.timeout.as_millis()
        ),
    ))
}

fn script_call(verb: &str, script: &str, keys: &[&[u8]], args: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// An error from connecting, with a hint where the cause is a usual
/// mistake.
fn explain(err: &RedisError) -> String {
    let text = err.to_string();
    if text.contains("UnknownIssuer") {
        format!(
            "{text} (TLS: the server's certificate is not signed by --upstream-tls-ca, or by the system's roots when that flag is absent)"
        )
    } else if text.contains("UnsupportedCertVersion") {
        format!(
            "{text} (TLS: certificates must be X.509 v3; an openssl certificate signed without -extfile is v1)"
        )
    } else if text.contains("NotValidForName") {
        format!("{text} (TLS: the server's certificate does not name the host in the upstream URL)")
    } else if text.contains("WRONGPASS") || text.contains("NOAUTH") {
        format!("{text} (check the user:password in the upstream URL)")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_last_as_long_as_the_deadline() {
        assert_eq!(cluster_retries(Duration::from_secs(1)), 44);
        assert_eq!(cluster_retries(Duration::from_millis(100)), 8);
        assert_eq!(cluster_retries(Duration::from_secs(3600)), 10_000);
    }
}

//! Connecting: which mode the seeds run in, and the redis-rs connection
//! (cluster or standalone) with explicit timeouts and a retry budget sized
//! by the deadline.

use super::{Current, Mode, Upstream};
use crate::config::UpstreamMode;
use crate::redact::SecretUrl;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo, RedisError, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One shared, multiplexed, self-reconnecting connection. Cloning it is
/// cheap: every clone talks through the same sockets.
#[derive(Clone)]
pub(super) enum Connection {
    Cluster(ClusterConnection),
    Standalone(ConnectionManager),
}

impl Connection {
    pub(super) async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Connection::Cluster(c) => cmd.query_async(c).await,
            Connection::Standalone(c) => cmd.query_async(c).await,
        }
    }

    /// A pipeline's replies one by one: a command's error reply comes back
    /// as `Value::ServerError` in its place, not as the pipeline's error.
    pub(super) async fn packed(
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

    pub(super) async fn pipeline(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<Value>, RedisError> {
        match self {
            Connection::Cluster(c) => pipe.query_async(c).await,
            Connection::Standalone(c) => pipe.query_async(c).await,
        }
    }
}

impl Upstream {
    /// Connects once, without the readiness loop (for one-shot tools).
    pub async fn connect_once(&self) -> Result<Mode, String> {
        if self.current().is_none() {
            self.connect().await?;
        }
        Ok(self.mode().expect("connected"))
    }

    pub(super) async fn connect(&self) -> Result<(), String> {
        let mode = match self.config.mode {
            UpstreamMode::Cluster => Mode::Cluster,
            UpstreamMode::Standalone => Mode::Standalone,
            UpstreamMode::Auto => self.detect_mode().await?,
        };
        let connection = match mode {
            Mode::Cluster => Connection::Cluster(self.connect_cluster().await?),
            Mode::Standalone => Connection::Standalone(self.connect_standalone().await?),
        };
        self.ensure_scripts(connection.clone(), None).await?;
        // The first connection, or one that replaces one given up or stuck;
        // requests in flight keep the old one until they finish.
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.connection.write().unwrap_or_else(|e| e.into_inner()) = Some(Current {
            mode,
            connection,
            generation,
        });
        self.warn_about_eviction().await;
        Ok(())
    }

    /// Asks the seeds, in order, for their version and whether they run in
    /// cluster mode. Redis 7.0 is needed for script flags (`#!lua`).
    async fn detect_mode(&self) -> Result<Mode, String> {
        let mut problems = Vec::new();
        for url in &self.config.urls {
            match self.probe(url).await {
                Ok(mode) => return Ok(mode),
                Err(problem) => problems.push(format!("{url}: {problem}")),
            }
        }
        Err(problems.join("; "))
    }

    /// A client for one URL, with the --upstream-tls-* certificates and
    /// TCP keepalive.
    fn client(&self, url: &SecretUrl) -> Result<redis::Client, String> {
        let fail = |e: RedisError| format!("{url}: {}", explain(&e));
        let info = url
            .expose()
            .into_connection_info()
            .map_err(fail)?
            .set_tcp_settings(tcp_settings());
        match &self.config.tls {
            Some(tls) => redis::Client::build_with_tls(info, tls.0.clone()),
            None => redis::Client::open(info),
        }
        .map_err(fail)
    }

    async fn probe(&self, url: &SecretUrl) -> Result<Mode, String> {
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
        let seeds = self.config.urls.iter().map(SecretUrl::expose);
        let mut builder = ClusterClientBuilder::new(seeds).tcp_settings(tcp_settings());
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
            .map_err(|e| format!("cannot connect to {url}: {}", explain(&e)))
    }
}

/// The redis crate's sockets: TCP keepalive as the node pipes have it
/// ([`crate::net::upstream_keepalive`]); Nagle as the crate's default
/// leaves it.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_keepalive(crate::net::upstream_keepalive())
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
///
/// At most 59: redis 1.8.1 computes each wait as `2^retry * 8` in u64,
/// which overflows at the 61st error reply, and in a debug build that
/// panics the task driving the cluster connection (every request through
/// it then fails until the health loop replaces it; pinned by the fault
/// suite's `sixty_one_retries_leave_the_cluster_connection_working`). Past
/// the 5th retry every wait is the 100 ms ceiling anyway, so 59 retries
/// span about 5 s: deadlines above that end by the count instead.
fn cluster_retries(deadline: Duration) -> u32 {
    let sleeps = deadline.as_millis() / 50;
    (2 * sleeps + 4).clamp(8, 59) as u32
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
        assert_eq!(cluster_retries(Duration::from_secs(3600)), 59);
    }
}

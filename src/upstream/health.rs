//! Health, in the background: connect, load the scripts on every
//! primary, keep readiness (and `/readyz`) truthful, replace a cluster
//! connection that stays stuck, and warn about a risky eviction policy.

use super::connect::Connection;
use super::{Mode, Node, Upstream};
use crate::error::{FaultKind, UpstreamError};
use redis::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often readiness is re-checked (script present on every primary).
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a cluster connection may fail its health checks before a fresh
/// one is tried in its place (see [`Upstream::maintain`]).
const REPLACE_AFTER: Duration = Duration::from_secs(5);

/// Whether a primary may evict keys stockgate needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// `noeviction`, or no memory limit at all.
    Safe(String),
    /// The policy that can evict.
    Risky(String),
}

impl Upstream {
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

    /// Logs a warning for each primary whose eviction policy can lose data:
    /// `volatile-*` policies evict exactly the idempotency records (the only
    /// keys with a TTL), so a retry would deduct again; `allkeys-*` can evict
    /// stock. `stockgate check` explains the same, as a FAIL.
    pub(super) async fn warn_about_eviction(&self) {
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

    /// Loads every script on every primary where it is missing. In cluster
    /// mode the crate sends SCRIPT EXISTS and SCRIPT LOAD to all primaries.
    pub(super) async fn ensure_scripts(&self, mut connection: Connection) -> Result<(), String> {
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

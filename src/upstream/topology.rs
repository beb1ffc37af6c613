//! The topology: which primaries serve which slots, for INFO, for SCAN
//! and SCRIPT on every node, and for the node pipes' slot table; and with
//! `--wait-replicas`, how many replicas each primary has, so that a write
//! where too few are connected is answered `not replicated` without a
//! WAIT that would block the shared connection.

use super::connect::Connection;
use super::{Mode, Node, Upstream};
use crate::error::UpstreamError;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Value};

impl Upstream {
    /// The primaries serving slots now (the one server in standalone mode).
    pub async fn primaries(&self) -> Result<Vec<Node>, UpstreamError> {
        Ok(self.slots().await?.nodes())
    }

    /// Which primary serves which slots: one CLUSTER SLOTS in cluster
    /// mode, no command in standalone mode (the one server serves all).
    async fn slots(&self) -> Result<SlotMap, UpstreamError> {
        if self.mode() != Some(Mode::Cluster) {
            let url = redis::Client::open(self.config.urls[0].as_str())
                .map_err(|e| UpstreamError::from_redis(&e))?;
            let addr = url.get_connection_info().addr().to_string();
            let (host, port) = addr.rsplit_once(':').unwrap_or((addr.as_str(), "6379"));
            let node = Node {
                host: host.to_owned(),
                port: port.parse().unwrap_or(6379),
            };
            // How many replicas it has is asked in `refresh_topology`, and
            // only when it matters (--wait-replicas).
            return Ok(SlotMap(vec![(0, crate::keys::SLOTS - 1, node, None)]));
        }
        let mut cluster_slots = redis::cmd("CLUSTER");
        cluster_slots.arg("SLOTS");
        let slots = self.query(&cluster_slots).await?;
        let Value::Array(ranges) = slots else {
            return Err(UpstreamError::new(
                crate::error::FaultKind::BadReply,
                format!("CLUSTER SLOTS answered {slots:?}"),
            ));
        };
        let ranges = ranges
            .into_iter()
            .filter_map(|range| {
                let Value::Array(items) = range else {
                    return None;
                };
                let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(primary))) =
                    (items.first(), items.get(1), items.get(2))
                else {
                    return None;
                };
                let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
                    (primary.first(), primary.get(1))
                else {
                    return None;
                };
                let node = Node {
                    host: String::from_utf8_lossy(host).into_owned(),
                    port: *port as u16,
                };
                // Each replica the cluster deems usable (not failed, and
                // synced at least once) follows the primary in the range.
                let replicas = items.len().saturating_sub(3);
                Some((*lo as u16, *hi as u16, node, Some(replicas)))
            })
            .collect();
        Ok(SlotMap(ranges))
    }

    /// Sends one command to one primary (SCAN, which walks one node's keys).
    pub async fn query_node(&self, cmd: &Cmd, node: &Node) -> Result<Value, UpstreamError> {
        let node = &self.routable(node);
        self.on_connection(self.config.timeout, async |connection| {
            on_node(connection, cmd, node).await
        })
        .await
    }

    /// `node` as the redis crate knows it. CLUSTER SLOTS names a node that
    /// doesn't know its own address (a lone primary that never met another
    /// node) with an empty host, which means "where you asked": the seeds'
    /// host.
    fn routable(&self, node: &Node) -> Node {
        if !node.host.is_empty() {
            return node.clone();
        }
        let host = redis::Client::open(self.config.urls[0].as_str())
            .ok()
            .and_then(|client| {
                let addr = client.get_connection_info().addr().to_string();
                addr.rsplit_once(':').map(|(host, _)| host.to_owned())
            })
            .unwrap_or_default();
        Node {
            host,
            port: node.port,
        }
    }

    /// [`Upstream::query_node`], with the node's error reply kept as the
    /// redis crate read it, for a caller that tells one refusal from
    /// another (FUNCTION LOAD's "already exists" from NOPERM).
    pub(super) async fn ask_node(
        &self,
        cmd: &Cmd,
        node: &Node,
    ) -> Result<redis::RedisResult<Value>, UpstreamError> {
        let node = &self.routable(node);
        self.on_connection(self.config.timeout, async |connection| {
            match on_node(connection, cmd, node).await {
                Err(err)
                    if matches!(
                        err.kind(),
                        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
                    ) =>
                {
                    Ok(Err(err))
                }
                other => other.map(Ok),
            }
        })
        .await
    }

    /// Reads the topology once (one CLUSTER SLOTS, or nothing in
    /// standalone mode) and brings both of its users up to date: the node
    /// pipes' slot table and the primaries INFO lists.
    pub(super) async fn refresh_topology(&self) -> Result<(), UpstreamError> {
        let mut slots = self.slots().await?;
        if let Some(pipelines) = &self.pipelines {
            let ranges: Vec<(u16, u16, String)> = slots
                .0
                .iter()
                .map(|(lo, hi, node, _)| (*lo, *hi, format!("{}:{}", node.host, node.port)))
                .collect();
            pipelines.set_routes(&ranges);
        }
        *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = slots.nodes();
        if let Some(durability) = self.config.durability {
            self.count_standalone_replicas(&mut slots).await;
            let short = slots
                .0
                .iter()
                .filter_map(|(lo, hi, _, replicas)| {
                    let replicas = (*replicas)? as i64;
                    (replicas < i64::from(durability.replicas)).then_some((*lo, *hi, replicas))
                })
                .collect();
            *self
                .short_of_replicas
                .write()
                .unwrap_or_else(|e| e.into_inner()) = short;
        }
        Ok(())
    }

    /// A standalone primary's replicas, by ROLE, which lists those online
    /// (INFO's `connected_slaves` counts any still syncing too); left
    /// unknown when ROLE fails, so writes go on waiting with WAIT.
    async fn count_standalone_replicas(&self, slots: &mut SlotMap) {
        let [(_, _, node, replicas @ None)] = &mut slots.0[..] else {
            return;
        };
        match self.query_node(&redis::cmd("ROLE"), node).await {
            Ok(Value::Array(items)) => {
                if let (Some(Value::BulkString(kind)), Some(Value::Array(online))) =
                    (items.first(), items.get(2))
                    && kind == b"master"
                {
                    *replicas = Some(online.len());
                }
            }
            Ok(other) => tracing::debug!(?other, "ROLE answered an unexpected shape"),
            Err(err) => tracing::debug!(%err, "cannot count the primary's replicas"),
        }
    }

    /// With `--wait-replicas`, how many replicas the primary of `slot` had
    /// at the last look, when that was fewer than asked: a write there can't
    /// be confirmed, and a WAIT would only block the connection it is sent
    /// on for `--wait-timeout`. `None` when it had enough (or nobody knows).
    pub(super) fn replicas_short(&self, slot: u16) -> Option<i64> {
        self.short_of_replicas
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, replicas)| *replicas)
    }
}

/// Slot ranges, the primary serving each as CLUSTER SLOTS lists them, and
/// how many replicas it has (`None`: not asked).
struct SlotMap(Vec<(u16, u16, Node, Option<usize>)>);

impl SlotMap {
    /// Each primary once, in the order CLUSTER SLOTS first names it.
    fn nodes(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = Vec::new();
        for (_, _, node, _) in &self.0 {
            if !nodes.contains(node) {
                nodes.push(node.clone());
            }
        }
        nodes
    }
}

/// `cmd` on `node` alone.
async fn on_node(connection: &mut Connection, cmd: &Cmd, node: &Node) -> redis::RedisResult<Value> {
    match connection {
        Connection::Cluster(c) => {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: node.host.clone(),
                port: node.port,
            });
            c.route_command(cmd.clone(), route).await
        }
        Connection::Standalone(c) => cmd.query_async(c).await,
    }
}

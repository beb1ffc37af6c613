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

    /// Which primary serves which slots, as (first, last, primary) ranges:
    /// for `stockgate check`, read as routing reads them.
    pub async fn slot_owners(&self) -> Result<Vec<(u16, u16, Node)>, UpstreamError> {
        Ok(self
            .slots()
            .await?
            .0
            .into_iter()
            .map(|(first, last, primary, _)| (first, last, primary))
            .collect())
    }

    /// Which primary serves which slots: one CLUSTER SLOTS in cluster
    /// mode, no command in standalone mode (the one server serves all).
    async fn slots(&self) -> Result<SlotMap, UpstreamError> {
        if self.mode() != Some(Mode::Cluster) {
            let (host, port) = self.seed().map_err(|e| UpstreamError::from_redis(&e))?;
            let node = Node {
                host,
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
        Ok(SlotMap::from_cluster_slots(&ranges, &self.seed_host()))
    }

    /// The first seed's host and port, as the redis crate reads its URL.
    fn seed(&self) -> redis::RedisResult<(String, String)> {
        let addr = redis::Client::open(self.config.urls[0].expose())?
            .get_connection_info()
            .addr()
            .to_string();
        let (host, port) = addr.rsplit_once(':').unwrap_or((addr.as_str(), "6379"));
        Ok((host.to_owned(), port.to_owned()))
    }

    /// Where a node that names no host of its own is: the host asked, the
    /// first seed's.
    fn seed_host(&self) -> String {
        self.seed().map(|(host, _)| host).unwrap_or_default()
    }

    /// Sends one command to one primary (SCAN, which walks one node's keys).
    pub async fn query_node(&self, cmd: &Cmd, node: &Node) -> Result<Value, UpstreamError> {
        let node = &self.routable(node);
        self.on_connection(self.config.timeout, async |connection| {
            on_node(connection, cmd, node).await
        })
        .await
    }

    /// `node` as the redis crate knows it: the primaries of [`SlotMap`]
    /// have their host already, but `stockgate check` reads CLUSTER SLOTS
    /// on its own, and a node there may name none (see
    /// [`SlotMap::from_cluster_slots`]).
    fn routable(&self, node: &Node) -> Node {
        if !node.host.is_empty() {
            return node.clone();
        }
        Node {
            host: self.seed_host(),
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
            pipelines.set_routes(&slots.routes());
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
    /// The ranges of a CLUSTER SLOTS reply, each with its primary and how
    /// many replicas follow it (each replica the cluster deems usable:
    /// not failed, and synced at least once). A primary that doesn't know
    /// its own address (a lone primary that never met another node) is
    /// named with an empty host, and one behind an unknown endpoint
    /// (`cluster-preferred-endpoint-type unknown-endpoint`) with a null:
    /// both mean "where you asked", so such a primary is `asked`'s.
    fn from_cluster_slots(ranges: &[Value], asked: &str) -> SlotMap {
        let ranges = ranges
            .iter()
            .filter_map(|range| {
                let Value::Array(items) = range else {
                    return None;
                };
                let (Some(Value::Int(lo)), Some(Value::Int(hi)), Some(Value::Array(primary))) =
                    (items.first(), items.get(1), items.get(2))
                else {
                    return None;
                };
                let host = match primary.first() {
                    Some(Value::BulkString(host)) if !host.is_empty() => {
                        String::from_utf8_lossy(host).into_owned()
                    }
                    Some(Value::BulkString(_) | Value::Nil) => asked.to_owned(),
                    _ => return None,
                };
                let Some(Value::Int(port)) = primary.get(1) else {
                    return None;
                };
                let node = Node {
                    host,
                    port: *port as u16,
                };
                let replicas = items.len().saturating_sub(3);
                Some((*lo as u16, *hi as u16, node, Some(replicas)))
            })
            .collect();
        SlotMap(ranges)
    }

    /// The node pipes' slot table: each range and its primary's
    /// `host:port`.
    fn routes(&self) -> Vec<(u16, u16, String)> {
        self.0
            .iter()
            .map(|(lo, hi, node, _)| (*lo, *hi, format!("{}:{}", node.host, node.port)))
            .collect()
    }

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

/// `cmd` on `node` alone, its error reply an `Err` in either mode: the
/// cluster client's `route_command` hands one back as a value
/// (`Value::ServerError`), where `query_async` makes it the error, so
/// read as it is an ACL's NOPERM to FUNCTION LOAD or FCALL looked like an
/// answer.
async fn on_node(connection: &mut Connection, cmd: &Cmd, node: &Node) -> redis::RedisResult<Value> {
    match connection {
        Connection::Cluster(c) => {
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: node.host.clone(),
                port: node.port,
            });
            c.route_command(cmd.clone(), route)
                .await
                .and_then(Value::extract_error)
        }
        Connection::Standalone(c) => cmd.query_async(c).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// A range of CLUSTER SLOTS: `first`, `last`, the primary, replicas.
    fn range(first: i64, last: i64, primary: Value, replicas: usize) -> Value {
        let node = |host: Value, port: i64| Value::Array(vec![host, Value::Int(port), bulk("id")]);
        let mut items = vec![Value::Int(first), Value::Int(last), node(primary, 7000)];
        items.extend((0..replicas).map(|r| node(bulk("replica.internal"), 7100 + r as i64)));
        Value::Array(items)
    }

    #[test]
    fn a_primary_without_a_host_is_routed_to_the_host_asked() {
        // A single-primary cluster that never met another node.
        let lone = SlotMap::from_cluster_slots(&[range(0, 16383, bulk(""), 0)], "127.0.0.1");
        assert_eq!(lone.routes(), [(0, 16383, "127.0.0.1:7000".to_owned())]);
        assert_eq!(
            lone.nodes(),
            [Node {
                host: "127.0.0.1".into(),
                port: 7000
            }]
        );
        // An unknown endpoint (a null) means the same.
        let unknown = SlotMap::from_cluster_slots(&[range(0, 16383, Value::Nil, 1)], "gate-0");
        assert_eq!(unknown.routes(), [(0, 16383, "gate-0:7000".to_owned())]);
        assert_eq!(unknown.0[0].3, Some(1));
    }

    #[test]
    fn a_primary_naming_its_host_keeps_it() {
        let map = SlotMap::from_cluster_slots(
            &[
                range(0, 8191, bulk("redis-a.internal"), 1),
                range(8192, 16383, bulk("redis-b.internal"), 0),
            ],
            "127.0.0.1",
        );
        assert_eq!(
            map.routes(),
            [
                (0, 8191, "redis-a.internal:7000".to_owned()),
                (8192, 16383, "redis-b.internal:7000".to_owned())
            ]
        );
    }
}

//! The topology: which primaries serve which slots, for INFO, for SCAN
//! and SCRIPT on every node, and for the node pipes' slot table.

use super::connect::Connection;
use super::{Node, Upstream};
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
        let mut connection = self.connection()?;
        let Connection::Cluster(_) = &connection else {
            let url = redis::Client::open(self.config.urls[0].as_str())
                .map_err(|e| UpstreamError::from_redis(&e))?;
            let addr = url.get_connection_info().addr().to_string();
            let (host, port) = addr.rsplit_once(':').unwrap_or((addr.as_str(), "6379"));
            let node = Node {
                host: host.to_owned(),
                port: port.parse().unwrap_or(6379),
            };
            return Ok(SlotMap(vec![(0, crate::keys::SLOTS - 1, node)]));
        };
        let mut cluster_slots = redis::cmd("CLUSTER");
        cluster_slots.arg("SLOTS");
        let call = connection.query(&cluster_slots);
        let slots = match tokio::time::timeout(self.config.timeout, call).await {
            Ok(Ok(slots)) => slots,
            Ok(Err(err)) => return Err(UpstreamError::from_redis(&err)),
            Err(_) => return Err(UpstreamError::timeout(self.config.timeout)),
        };
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
                Some((*lo as u16, *hi as u16, node))
            })
            .collect();
        Ok(SlotMap(ranges))
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

    /// Reads the topology once (one CLUSTER SLOTS, or nothing in
    /// standalone mode) and brings both of its users up to date: the node
    /// pipes' slot table and the primaries INFO lists.
    pub(super) async fn refresh_topology(&self) -> Result<(), UpstreamError> {
        let slots = self.slots().await?;
        if let Some(pipelines) = &self.pipelines {
            let ranges: Vec<(u16, u16, String)> = slots
                .0
                .iter()
                .map(|(lo, hi, node)| (*lo, *hi, format!("{}:{}", node.host, node.port)))
                .collect();
            pipelines.set_routes(&ranges);
        }
        *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = slots.nodes();
        Ok(())
    }
}

/// Slot ranges and the primary serving each, as CLUSTER SLOTS lists them.
struct SlotMap(Vec<(u16, u16, Node)>);

impl SlotMap {
    /// Each primary once, in the order CLUSTER SLOTS first names it.
    fn nodes(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = Vec::new();
        for (_, _, node) in &self.0 {
            if !nodes.contains(node) {
                nodes.push(node.clone());
            }
        }
        nodes
    }
}

//! The topology: which primaries serve which slots, for INFO, for SCAN
//! and SCRIPT on every node, and for the node pipes' slot table.

use super::connect::Connection;
use super::{Mode, Node, Upstream};
use crate::error::UpstreamError;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Value};

impl Upstream {
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

    /// Rebuilds the node pipes' slot table from CLUSTER SLOTS (or the one
    /// standalone server).
    pub(super) async fn refresh_routes(&self) {
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
}

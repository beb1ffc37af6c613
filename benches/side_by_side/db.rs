//! The Redis data each row starts from and is audited against: the skus
//! seeded on each primary, the scripts loaded, and what a row changed.

use std::time::Duration;
use stockgate::keys::{self, KeyLayout};
use stockgate::params::Sku;
use stockgate::script::{LuaScript, Scripts};

/// Stock every sku starts each row with: far more than any row deducts,
/// so every reply is code 0, and within Lua's exact integer range.
pub const START_STOCK: i64 = 1_000_000_000_000;

/// The Redis servers one target writes to (a cluster's primaries, or one
/// standalone), the skus seeded on each, and the audit after a row.
pub struct Db {
    nodes: Vec<Node>,
    /// Every sku's name and the index of the node that owns its slot.
    pub skus: Vec<(String, usize)>,
    layout: KeyLayout,
    script: std::sync::Arc<LuaScript>,
    /// The DEDUCT script of script version 3, for `direct-standalone-v3`.
    v3: LuaScript,
}

struct Node {
    port: u16,
    conn: redis::Connection,
}

/// What a row actually changed in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Idempotency records created (keys beyond the seeded stock keys).
    pub records: u64,
    /// Total stock decrease over every sku.
    pub stock_decrease: u64,
    /// Units on hold over every sku (its `:held` counter): out of the
    /// stock, not deducted for good.
    pub held: u64,
}

impl Db {
    /// `ports` are the primaries (one for a standalone Redis); a sku goes to
    /// the primary `owner(slot)` names.
    pub fn new(ports: &[u16], sku_count: usize, owner: impl Fn(u16) -> usize) -> Db {
        let layout = KeyLayout::new("stock").expect("stockgate's default prefix");
        let nodes = ports
            .iter()
            .map(|&port| Node {
                port,
                conn: connect(port),
            })
            .collect();
        let skus = (0..sku_count)
            .map(|i| {
                let sku = format!("sku-{i:05}");
                let slot = keys::slot(&layout.stock_key(&Sku::parse(sku.clone().into()).unwrap()));
                (sku, owner(slot))
            })
            .collect();
        Db {
            nodes,
            skus,
            layout,
            script: Scripts::new().deduct,
            v3: {
                let body = include_str!("../../tests/compat/v3/deduct.lua").replacen(
                    "--@common\n",
                    include_str!("../../tests/compat/v3/common.lua"),
                    1,
                );
                LuaScript::from_body("deduct-v3", body, true)
            },
        }
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    pub fn sha(&self) -> &str {
        &self.script.sha
    }

    pub fn v3_sha(&self) -> &str {
        &self.v3.sha
    }

    /// Empties every node, loads the script, and seeds every sku with
    /// [`START_STOCK`]: each row starts from the same state.
    pub fn reset(&mut self) {
        for (index, node) in self.nodes.iter_mut().enumerate() {
            redis::cmd("FLUSHALL")
                .arg("SYNC")
                .query::<()>(&mut node.conn)
                .unwrap_or_else(|e| panic!("FLUSHALL on {}: {e}", node.port));
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&self.script.body)
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("SCRIPT LOAD on {}: {e}", node.port));
            assert_eq!(sha, self.script.sha, "the script's SHA1");
            let v3: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&self.v3.body)
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("SCRIPT LOAD on {}: {e}", node.port));
            assert_eq!(v3, self.v3.sha, "the version 3 script's SHA1");
            let mut pipe = redis::pipe();
            for (sku, _) in self.skus.iter().filter(|(_, n)| *n == index) {
                pipe.set(stock_key(&self.layout, sku), START_STOCK).ignore();
            }
            pipe.query::<()>(&mut node.conn)
                .unwrap_or_else(|e| panic!("seeding on {}: {e}", node.port));
        }
    }

    /// Counts what the row changed, from Redis itself.
    pub fn audit(&mut self) -> Applied {
        let mut applied = Applied {
            records: 0,
            stock_decrease: 0,
            held: 0,
        };
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let skus: Vec<&String> = self
                .skus
                .iter()
                .filter(|(_, n)| *n == index)
                .map(|(s, _)| s)
                .collect();
            let keys: u64 = redis::cmd("DBSIZE")
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("DBSIZE on {}: {e}", node.port));
            // The sweep leader's lease and active list (a stockgate in front
            // of this node writes them even when no hold is placed) are not
            // records. A primary that doesn't own their slot answers MOVED:
            // they are not there.
            let sweeper: u64 = match redis::cmd("EXISTS")
                .arg(self.layout.sweep_lease())
                .arg(self.layout.sweep_active())
                .query(&mut node.conn)
            {
                Ok(n) => n,
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => 0,
                Err(e) => panic!("EXISTS on {}: {e}", node.port),
            };
            applied.records += keys - sweeper - skus.len() as u64;
            let mut pipe = redis::pipe();
            for sku in &skus {
                pipe.get(stock_key(&self.layout, sku));
            }
            let stocks: Vec<i64> = pipe
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("reading stock on {}: {e}", node.port));
            applied.stock_decrease += stocks.iter().map(|s| (START_STOCK - s) as u64).sum::<u64>();
            let mut pipe = redis::pipe();
            for sku in &skus {
                let sku = Sku::parse(sku.to_string().into()).expect("valid sku");
                pipe.get(self.layout.sku_keys(&sku).held);
            }
            let held: Vec<Option<u64>> = pipe
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("reading held units on {}: {e}", node.port));
            applied.held += held.into_iter().flatten().sum::<u64>();
        }
        applied
    }

    /// Makes every sku one kept by location (docs/locations.md), after a
    /// [`Db::reset`]: its stock key the text `loc`, and `locations`
    /// locations `w1`, `w2`, ... each with [`START_STOCK`].
    pub fn locate(&mut self, locations: usize) {
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let mut pipe = redis::pipe();
            for (sku, _) in self.skus.iter().filter(|(_, n)| *n == index) {
                let stock = stock_key(&self.layout, sku);
                pipe.set(&stock, "loc").ignore();
                let hash = [&stock[..], b":loc"].concat();
                for w in 1..=locations {
                    pipe.hset(&hash, format!("w{w}"), START_STOCK).ignore();
                }
            }
            pipe.query::<()>(&mut node.conn)
                .unwrap_or_else(|e| panic!("locating on {}: {e}", node.port));
        }
    }

    /// The units every location of every sku lost since [`Db::locate`].
    pub fn located_decrease(&mut self, locations: usize) -> u64 {
        let mut decrease = 0;
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let mut pipe = redis::pipe();
            for (sku, _) in self.skus.iter().filter(|(_, n)| *n == index) {
                let hash = [&stock_key(&self.layout, sku)[..], b":loc"].concat();
                for w in 1..=locations {
                    pipe.hget(&hash, format!("w{w}"));
                }
            }
            let units: Vec<i64> = pipe
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("reading locations on {}: {e}", node.port));
            decrease += units.iter().map(|u| (START_STOCK - u) as u64).sum::<u64>();
        }
        decrease
    }

    /// CPU seconds every node has used (`INFO cpu`: the whole process,
    /// microsecond resolution).
    pub fn cpu_seconds(&mut self) -> f64 {
        self.nodes
            .iter_mut()
            .map(|node| {
                let info: String = redis::cmd("INFO")
                    .arg("cpu")
                    .query(&mut node.conn)
                    .unwrap_or_else(|e| panic!("INFO cpu on {}: {e}", node.port));
                ["used_cpu_sys:", "used_cpu_user:"]
                    .iter()
                    .map(|field| {
                        info.lines()
                            .find_map(|l| l.strip_prefix(field))
                            .and_then(|v| v.trim().parse::<f64>().ok())
                            .unwrap_or(0.0)
                    })
                    .sum::<f64>()
            })
            .sum()
    }
}

pub fn stock_key(layout: &KeyLayout, sku: &str) -> Vec<u8> {
    layout.stock_key(&Sku::parse(sku.to_owned().into()).expect("valid sku"))
}

/// A plain connection to one Redis on loopback, with a generous read
/// timeout.
pub fn connect(port: u16) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a valid URL");
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("cannot connect to redis on {port}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set a timeout");
    conn
}

/// The cluster's slot ranges and the primary (by index into `ports`) that
/// serves each, from `CLUSTER SLOTS`.
pub fn slot_owner(ports: &[u16]) -> impl Fn(u16) -> usize + use<> {
    let mut conn = connect(ports[0]);
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .expect("CLUSTER SLOTS");
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => *i,
        other => panic!("CLUSTER SLOTS: expected an integer, got {other:?}"),
    };
    // Each range: [first, last, [ip, port, id, ...] (the primary), replicas...].
    let ranges: Vec<(u16, u16, u16)> = slots
        .iter()
        .map(|range| {
            let redis::Value::Array(items) = range else {
                panic!("CLUSTER SLOTS: a range is not an array: {range:?}");
            };
            let redis::Value::Array(primary) = &items[2] else {
                panic!("CLUSTER SLOTS: no primary in {range:?}");
            };
            (
                int(&items[0]) as u16,
                int(&items[1]) as u16,
                int(&primary[1]) as u16,
            )
        })
        .collect();
    let ports = ports.to_vec();
    move |slot| {
        let (_, _, port) = ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} is not served"));
        ports
            .iter()
            .position(|p| p == port)
            .unwrap_or_else(|| panic!("slot {slot} is served by unknown port {port}"))
    }
}

//! The targets a row measures, where their connections go, and the
//! requests a row sends them: a DEDUCT through stockgate, or the EVALSHA
//! stockgate itself would send, with the same keys and arguments.

use crate::db::Db;
use crate::loadgen::{Conn, Encoded};
use std::net::SocketAddr;
use stockgate::params::{RequestId, Sku};

/// The script arguments stockgate sends with its defaults (`--retry-window
/// 24h`, `--max-qty 1000000`, `--missing-stock error`).
pub const RETRY_WINDOW_MS: &[u8] = b"86400000";
pub const MAX_QTY: &[u8] = b"1000000";
pub const MISSING_STOCK: &[u8] = b"error";
/// The same settings as `lua/deduct.lua` takes them (its ARGV[3]): window,
/// max qty, missing-stock mode, the flags (replicate and journal off).
pub const SETTINGS: &[u8] = b"86400000 1000000 error 00";

/// The targets, in the order the table lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetId {
    DirectCluster,
    StockgateCluster,
    DirectStandalone,
    TwemproxyStandalone,
    StockgateStandalone,
    /// The DEDUCT script of script version 3 (before holds), direct: what
    /// a DEDUCT cost Redis before every script looked at the SKU's holds.
    DirectStandaloneV3,
}

impl TargetId {
    pub const ALL: [TargetId; 6] = [
        TargetId::DirectCluster,
        TargetId::StockgateCluster,
        TargetId::DirectStandalone,
        TargetId::TwemproxyStandalone,
        TargetId::StockgateStandalone,
        TargetId::DirectStandaloneV3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TargetId::DirectCluster => "direct-cluster",
            TargetId::StockgateCluster => "stockgate-cluster",
            TargetId::DirectStandalone => "direct-standalone",
            TargetId::TwemproxyStandalone => "twemproxy-standalone",
            TargetId::StockgateStandalone => "stockgate-standalone",
            TargetId::DirectStandaloneV3 => "direct-standalone-v3",
        }
    }

    pub fn on_cluster(self) -> bool {
        matches!(self, TargetId::DirectCluster | TargetId::StockgateCluster)
    }
}

/// What goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `EVALSHA <sha> 5 <stock key> <record key> <holds> <held> <marker> <qty> <order_no> <settings> <nonce>`
    Evalsha,
    /// `DEDUCT <sku> <qty> <request_id> <order_no>`
    Deduct,
    /// `EVALSHA <v3 sha> 2 <stock key> <record key> <qty> <order_no> ...`:
    /// the same call to the script version before holds.
    EvalshaV3,
}

/// Where a target's connections go.
pub struct Target {
    pub id: TargetId,
    pub shape: Shape,
    /// Connection `i` connects to `routes[i % routes.len()]` and picks skus
    /// from that route's list (indices into the db's skus).
    pub routes: Vec<(SocketAddr, Vec<usize>)>,
    /// The proxy's pid, when there is one.
    pub proxy: Option<u32>,
}

/// A small deterministic generator (SplitMix64): each row's choice of skus
/// is reproducible and costs nothing measurable.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// Encodes the requests of one row: `per_conn` on each of `conns`
/// connections, request_ids prefixed with `tag`.
pub fn plan(
    target: &Target,
    db: &Db,
    conns: usize,
    per_conn: usize,
    tag: &str,
    seed: u64,
) -> Vec<Conn> {
    let qty = b"1";
    (0..conns)
        .map(|c| {
            let (addr, skus) = &target.routes[c % target.routes.len()];
            assert!(!skus.is_empty(), "a route without skus");
            let mut rng = Rng::new(seed ^ ((c as u64) << 32));
            let mut requests = Encoded::default();
            for n in 0..per_conn {
                let sku = &db.skus[skus[rng.below(skus.len())]].0;
                let request_id = format!("{tag}-{c}-{n}");
                let order_no = format!("ORD-{c}-{n}");
                // The call's nonce, as stockgate makes one per call.
                let nonce = format!("{:x}", (c << 32) | n);
                match target.shape {
                    Shape::Deduct => requests.push(&[
                        b"DEDUCT",
                        sku.as_bytes(),
                        qty,
                        request_id.as_bytes(),
                        order_no.as_bytes(),
                    ]),
                    Shape::EvalshaV3 => {
                        let keys = db.layout().request_keys(
                            &Sku::parse(sku.clone().into()).expect("valid sku"),
                            &RequestId::parse(request_id.into()).expect("valid request_id"),
                        );
                        requests.push(&[
                            b"EVALSHA",
                            db.v3_sha().as_bytes(),
                            b"2",
                            &keys.stock,
                            &keys.record,
                            qty,
                            order_no.as_bytes(),
                            RETRY_WINDOW_MS,
                            MAX_QTY,
                            MISSING_STOCK,
                            nonce.as_bytes(),
                        ]);
                    }
                    Shape::Evalsha => {
                        let keys = db.layout().request_keys(
                            &Sku::parse(sku.clone().into()).expect("valid sku"),
                            &RequestId::parse(request_id.into()).expect("valid request_id"),
                        );
                        requests.push(&[
                            b"EVALSHA",
                            db.sha().as_bytes(),
                            b"6",
                            &keys.stock,
                            &keys.record,
                            &keys.holds,
                            &keys.held,
                            &keys.marker,
                            &keys.journal,
                            qty,
                            order_no.as_bytes(),
                            SETTINGS,
                            nonce.as_bytes(),
                        ]);
                    }
                }
            }
            Conn {
                addr: *addr,
                requests,
            }
        })
        .collect()
}

//! stockgate side by side with Redis direct and with twemproxy, end to end
//! on loopback, with one load generator and one load shape for every target.
//!
//! ```sh
//! deploy/bench.sh                                   # installs Redis + nutcracker, then runs all
//! cargo bench --bench side_by_side                  # every mode below, in this order
//! cargo bench --bench side_by_side -- throughput    # only the table
//! cargo bench --bench side_by_side -- latency       # open loop: p50/p99/p99.9 at fixed rates
//! cargo bench --bench side_by_side -- orders        # 3-line ORDERs against 3 DEDUCTs each
//! cargo bench --bench side_by_side -- memory        # only the memory scenarios
//! cargo bench --bench side_by_side -- instructions  # instructions per request, under callgrind
//! cargo bench --bench side_by_side -- flash         # a flash sale on one sku, then its sold-out tail
//! cargo bench --bench side_by_side -- script-cost   # instructions per deduction in Redis, under callgrind
//! cargo bench --bench side_by_side -- sink          # the journal's sink against a flash sale (needs PostgreSQL)
//! BENCH_REQUESTS=20000 BENCH_REPEATS=1 cargo bench --bench side_by_side   # a quick look
//! ```
//!
//! Needs `redis-server` 7+ and `nutcracker` (twemproxy) on the PATH:
//! `deploy/install-deps.sh && deploy/install-bench-deps.sh`. Under
//! `cargo test --all-targets` this binary is built and exits at once.
//!
//! # What runs
//!
//! A 3-primary Redis Cluster and one standalone Redis (`stockgate::dev`),
//! two stockgate processes (the binary cargo builds for this bench, i.e.
//! the release profile; `BENCH_STOCKGATE_BIN` picks another), one in front
//! of each, and nutcracker in front of the standalone Redis. Targets:
//!
//! - `direct-cluster`: EVALSHA of stockgate's own script to the primary
//!   owning the slot. Connections are counted like every other target's:
//!   `BENCH_CONNECTIONS` in all, connection `i` goes to primary `i % 3` and
//!   only carries skus of that primary's slots (as a cluster client's
//!   per-node connection would), so the total in flight is the same
//!   `connections × depth` as through a proxy.
//! - `stockgate-cluster`: DEDUCT through stockgate to that cluster.
//! - `direct-standalone`: the same EVALSHA to the standalone Redis.
//! - `twemproxy-standalone`: the same EVALSHA through nutcracker.
//! - `stockgate-standalone`: DEDUCT through a second stockgate.
//! - `direct-standalone-v3`: the same EVALSHA of the DEDUCT script of
//!   script version 3, the release before holds (`tests/compat/v3/`), with
//!   its two keys: the baseline for what holds cost a DEDUCT on a SKU
//!   that has none (the ratio table's last row, Redis CPU).
//!
//! Every request deducts 1 from a random one of `BENCH_SKUS` skus with a
//! request_id never used before (`<row>-<connection>-<n>`) and an
//! order_no. EVALSHA takes exactly the KEYS and ARGV stockgate sends
//! (`stockgate::keys::KeyLayout` builds the keys; default retry window,
//! max qty, missing-stock mode and a call nonce).
//!
//! # Each row
//!
//! Every node is flushed, the script loaded and every sku seeded with
//! [`fleet::START_STOCK`]. The requests are encoded, all connections
//! opened, then the clock starts. Afterwards the harness checks, in Redis,
//! that the idempotency records created and the total stock decrease both
//! equal the code-0 replies seen, and that every reply was code 0; any
//! difference stops the run with an error.
//!
//! CPU per request is `(utime + stime)` from `/proc/<pid>/stat` (10 ms
//! ticks) over the measured interval, divided by the requests; Redis's
//! comes from `INFO cpu` (summed over the primaries), the load generator's
//! from its own `/proc/self/stat`. Peak RSS is `VmHWM` from
//! `/proc/<pid>/status`, reset through `clear_refs` before every row.
//! Targets are interleaved (rotated each repetition) to spread noise, and
//! the table shows the median of `BENCH_REPEATS` runs.
//!
//! The orders rows (`orders.rs`) put one 3-line ORDER (its lines on
//! three primaries) through `stockgate-cluster` against the same work as
//! three DEDUCTs written at once, and print orders per second, latency and
//! CPU per order, and the ratio; their audit: every reply code 0, and the
//! stock down by exactly 3 × the orders.
//!
//! The throughput rows are a closed loop (`depth` requests in flight per
//! connection): they find the most a target serves, and their latencies
//! follow from the queue they build (Little's law). The latency rows
//! (`latency.rs`) are an open loop at fixed rates far below that, where a
//! sidecar spends its life: requests go out on a schedule whatever the
//! replies do, and each latency runs from the request's intended send
//! time, so a stall is not hidden (no coordinated omission). Same targets
//! (twemproxy too), same requests, same audit after every row.
//!
//! The flash rows (`flash.rs`, issue 16) put the whole load on one sku of
//! 10,000 units on the standalone Redis: the sale until stock 0, then a
//! sold-out tail, each phase measured apart, for `direct-standalone`,
//! `stockgate-standalone` and a third stockgate with `--sold-out-reads
//! false`; audited after every row (10,000 code-0 replies, stock 0, every
//! retry of an applied id answered 1).
//!
//! # Knobs (environment)
//!
//! | variable | default | |
//! |---|---|---|
//! | `BENCH_REQUESTS` | 200000 | requests per row |
//! | `BENCH_REPEATS` | 3 | runs of each (target, depth); latency: the runs each row's seconds are split into, interleaved and merged |
//! | `BENCH_CONNECTIONS` | 50 | client connections |
//! | `BENCH_DEPTHS` | `1,16` | requests in flight per connection |
//! | `BENCH_RATES` | `5000,20000` | latency: fixed total rates, requests per second, spread round-robin over `BENCH_CONNECTIONS` |
//! | `BENCH_LATENCY_SECONDS` | 10 | latency: how long each (target, rate) row sends |
//! | `BENCH_LATENCY_PRIORITY` | `normal` | latency: the load generator's thread at `normal` priority, `nice` (-20) or `fifo` (`SCHED_FIFO`; both need root or `CAP_SYS_NICE`): its sends are then on time, but it preempts the servers it measures (see `latency.rs`) |
//! | `BENCH_ORDERS` | the smaller of 20000 and `BENCH_REQUESTS` | orders: orders per row |
//! | `BENCH_SKUS` | 1000 | |
//! | `BENCH_TARGETS` | all | comma-separated target names |
//! | `BENCH_IDLE_CLIENTS` | 1000 | memory: clients connected (of which `BENCH_CONNECTIONS` active) |
//! | `BENCH_IDLE_HANDSHAKE` | `identify` | memory: what each idle client sends on connect: `identify` (HELLO 3, CLIENT SETINFO LIB-NAME and LIB-VER, CLIENT SETNAME, PING, as real clients do) or `ping` (PING only) |
//! | `BENCH_MANY_CLIENTS` | 10000 | memory: concurrent clients, one DEDUCT each |
//! | `BENCH_MANY_ROUNDS` | 3 | memory: times the concurrent clients come and go |
//! | `BENCH_STOCKGATE_BIN` | this build's | |
//! | `BENCH_STOCKGATE_ARGS` | none | extra `stockgate serve` flags, split at whitespace |
//! | `BENCH_CALLGRIND_REQUESTS` | 20000 | instructions: requests per counted load |
//! | `BENCH_FLASH_CONNECTIONS` | 200 | flash: connections, one request in flight each (`flash.rs`) |
//! | `BENCH_FLASH_TAIL_SECONDS` | 20 | flash: how long the sold-out tail runs after the stock reaches 0 |
//! | `BENCH_SINK_UNITS` | 50000 | sink: units sold in each sale (`sink.rs`) |
//! | `BENCH_SINK_ARGS` | none | sink: extra `journal sink` flags, split at whitespace (`--batch 5000`) |
//! | `BENCH_SINK_LOG` | unset | sink: set, the sinks' debug log on stderr |
//! | `BENCH_NUTCRACKER_BIN` | `/usr/sbin/nutcracker`, else `nutcracker` on the PATH | |

mod flash;
mod fleet;
mod instructions;
mod latency;
mod loadgen;
mod memory;
mod orders;
mod report;
mod script_cost;
mod sink;
// The tests' throwaway PostgreSQL (initdb and pg_ctl in a temp dir), for
// the `sink` mode.
#[path = "../../tests/support/postgres.rs"]
#[allow(dead_code)] // restarts and the like are the tests'
mod postgres;

use fleet::{Db, Proc, Stockgate, Twemproxy};
use loadgen::{Conn, Encoded};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;
use stockgate::dev::{LocalCluster, LocalRedis, RedisOptions};
use stockgate::params::{RequestId, Sku};

/// The script arguments stockgate sends with its defaults (`--retry-window
/// 24h`, `--max-qty 1000000`, `--missing-stock error`).
const RETRY_WINDOW_MS: &[u8] = b"86400000";
const MAX_QTY: &[u8] = b"1000000";
const MISSING_STOCK: &[u8] = b"error";
/// The same settings as `lua/deduct.lua` takes them (its ARGV[3]): window,
/// max qty, missing-stock mode, the flags (replicate and journal off).
const SETTINGS: &[u8] = b"86400000 1000000 error 00";

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

    fn on_cluster(self) -> bool {
        matches!(self, TargetId::DirectCluster | TargetId::StockgateCluster)
    }
}

/// What goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `EVALSHA <sha> 2 <stock key> <record key> <qty> <order_no> ...`
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

/// The environment knobs.
pub struct Knobs {
    pub requests: usize,
    pub repeats: usize,
    pub connections: usize,
    pub depths: Vec<usize>,
    /// Latency: the fixed total rates, requests per second.
    pub rates: Vec<u64>,
    /// Latency: how long each (target, rate) row sends.
    pub latency_seconds: f64,
    /// Latency: what the load generator's thread asks the scheduler for.
    pub latency_priority: loadgen::Priority,
    pub skus: usize,
    pub targets: Vec<TargetId>,
    pub idle_clients: usize,
    pub idle_handshake: memory::Handshake,
    pub many_clients: usize,
    pub many_rounds: usize,
    pub stockgate_bin: PathBuf,
    pub nutcracker_bin: PathBuf,
}

impl Knobs {
    fn from_env() -> Knobs {
        fn num(name: &str, default: usize) -> usize {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
                Err(_) => default,
            }
        }
        let depths = std::env::var("BENCH_DEPTHS").unwrap_or_else(|_| "1,16".into());
        let rates = std::env::var("BENCH_RATES").unwrap_or_else(|_| "5000,20000".into());
        let targets = match std::env::var("BENCH_TARGETS") {
            Ok(list) => list
                .split(',')
                .map(|name| {
                    *TargetId::ALL
                        .iter()
                        .find(|t| t.name() == name.trim())
                        .unwrap_or_else(|| panic!("unknown target {name:?} in BENCH_TARGETS"))
                })
                .collect(),
            Err(_) => TargetId::ALL.to_vec(),
        };
        let knobs = Knobs {
            requests: num("BENCH_REQUESTS", 200_000),
            repeats: num("BENCH_REPEATS", 3).max(1),
            connections: num("BENCH_CONNECTIONS", 50).max(1),
            depths: depths
                .split(',')
                .map(|d| d.trim().parse().expect("BENCH_DEPTHS: numbers"))
                .collect(),
            rates: rates
                .split(',')
                .map(|r| match r.trim().parse() {
                    Ok(rate) if rate > 0 => rate,
                    _ => panic!("BENCH_RATES: requests per second above 0, got {r:?}"),
                })
                .collect(),
            latency_seconds: match std::env::var("BENCH_LATENCY_SECONDS") {
                Ok(v) => match v.trim().parse::<f64>() {
                    Ok(s) if s > 0.0 => s,
                    _ => panic!("BENCH_LATENCY_SECONDS={v:?} is not a number of seconds"),
                },
                Err(_) => 10.0,
            },
            latency_priority: match std::env::var("BENCH_LATENCY_PRIORITY").as_deref() {
                Err(_) | Ok("normal") => loadgen::Priority::Normal,
                Ok("nice") => loadgen::Priority::Nice,
                Ok("fifo") => loadgen::Priority::Fifo,
                Ok(other) => panic!("BENCH_LATENCY_PRIORITY={other:?}: normal, nice or fifo"),
            },
            skus: num("BENCH_SKUS", 1000).max(1),
            targets,
            idle_clients: num("BENCH_IDLE_CLIENTS", 1000),
            idle_handshake: match std::env::var("BENCH_IDLE_HANDSHAKE").as_deref() {
                Err(_) | Ok("identify") => memory::Handshake::Identify,
                Ok("ping") => memory::Handshake::Ping,
                Ok(other) => panic!("BENCH_IDLE_HANDSHAKE={other:?}: identify or ping"),
            },
            many_clients: num("BENCH_MANY_CLIENTS", 10_000),
            many_rounds: num("BENCH_MANY_ROUNDS", 3),
            stockgate_bin: std::env::var_os("BENCH_STOCKGATE_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_stockgate"))),
            nutcracker_bin: std::env::var_os("BENCH_NUTCRACKER_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    // Debian installs it in /usr/sbin, which a user's PATH may lack.
                    let debian = PathBuf::from("/usr/sbin/nutcracker");
                    if debian.exists() {
                        debian
                    } else {
                        PathBuf::from("nutcracker")
                    }
                }),
        };
        assert!(
            knobs.requests >= knobs.connections,
            "BENCH_REQUESTS must be at least BENCH_CONNECTIONS"
        );
        knobs
    }
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
                            b"2",
                            &keys.stock,
                            &keys.record,
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

/// CPU counters at one instant.
pub struct Probe {
    pub proxy: Option<f64>,
    pub redis: f64,
    pub loadgen: f64,
}

pub fn probe(proxy: Option<u32>, db: &mut Db) -> Probe {
    Probe {
        proxy: proxy.map(fleet::cpu_seconds),
        redis: db.cpu_seconds(),
        loadgen: fleet::cpu_seconds(std::process::id()),
    }
}

/// One measured run of one target at one depth.
#[derive(Debug, Clone)]
pub struct Run {
    pub target: TargetId,
    pub depth: usize,
    pub requests: u64,
    pub seconds: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub proxy_cpu_us: Option<f64>,
    pub proxy_peak_mib: Option<f64>,
    pub redis_cpu_us: f64,
    pub loadgen_cpu_us: f64,
}

impl Run {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

/// One run and what the harness found wrong with it, if anything.
pub struct Measured {
    pub run: Run,
    pub outcome: loadgen::RunOutcome,
    /// Replies other than code 0, or Redis applying a different number of
    /// deductions than the clients saw.
    pub problem: Option<String>,
}

impl Measured {
    /// The run, or a panic that says what went wrong.
    pub fn checked(self) -> (Run, loadgen::RunOutcome) {
        if let Some(problem) = self.problem {
            panic!("{problem}");
        }
        (self.run, self.outcome)
    }
}

/// Runs the requests of `conns` against `target`, then checks that every
/// reply was code 0 and that Redis applied exactly the code-0 replies.
pub fn measure(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    db: &mut Db,
    conns: Vec<Conn>,
    depth: usize,
) -> Measured {
    measure_with(runtime, target, db, conns, depth, || {})
}

/// [`measure`], calling `at_probe` right before the load starts (with the
/// connections open) and right after its last reply.
pub fn measure_with(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    db: &mut Db,
    conns: Vec<Conn>,
    depth: usize,
    mut at_probe: impl FnMut(),
) -> Measured {
    let requests: u64 = conns.iter().map(|c| c.requests.len() as u64).sum();
    if let Some(pid) = target.proxy {
        fleet::reset_peak(pid);
    }
    let (outcome, before, after) = runtime
        .block_on(loadgen::run(conns, depth, || {
            at_probe();
            probe(target.proxy, db)
        }))
        .unwrap_or_else(|e| panic!("{}: the load generator failed: {e}", target.id.name()));
    let name = target.id.name();
    let problems = audit(target, db, &outcome, requests);
    let per = |seconds: f64| seconds * 1e6 / requests as f64;
    let run = Run {
        target: target.id,
        depth,
        requests,
        seconds: outcome.elapsed.as_secs_f64(),
        p50_us: outcome.latency.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: outcome.latency.value_at_quantile(0.99) as f64 / 1e3,
        max_us: outcome.latency.max() as f64 / 1e3,
        proxy_cpu_us: before.proxy.zip(after.proxy).map(|(b, a)| per(a - b)),
        proxy_peak_mib: target
            .proxy
            .map(|pid| fleet::memory(pid).peak_kib as f64 / 1024.0),
        redis_cpu_us: per(after.redis - before.redis),
        loadgen_cpu_us: per(after.loadgen - before.loadgen),
    };
    Measured {
        run,
        outcome,
        problem: (!problems.is_empty())
            .then(|| format!("{name}, depth {depth}: {}", problems.join("; "))),
    }
}

/// What is wrong with a run of `requests`: replies other than code 0, or
/// Redis (audited now) applying a different number of deductions than the
/// clients saw. Empty when all is well.
pub fn audit(
    target: &Target,
    db: &mut Db,
    outcome: &loadgen::RunOutcome,
    requests: u64,
) -> Vec<String> {
    let name = target.id.name();
    assert_eq!(outcome.replies(), requests, "{name}: replies counted");
    let applied = db.audit();
    let mut problems = Vec::new();
    if outcome.errors != 0 || outcome.codes[0] != requests {
        problems.push(format!(
            "expected {requests} code-0 replies, got codes {:?} and {} errors (first: {:?})",
            outcome.codes, outcome.errors, outcome.first_error
        ));
    }
    if applied.records != outcome.codes[0] || applied.stock_decrease != outcome.codes[0] {
        problems.push(format!(
            "Redis applied {} deductions ({} records created), the clients saw {} (code 0)",
            applied.stock_decrease, applied.records, outcome.codes[0]
        ));
    }
    problems
}

/// Everything the benchmark starts, stopped when dropped.
pub struct Fleet {
    pub cluster: LocalCluster,
    pub standalone: LocalRedis,
    pub cluster_db: Db,
    pub standalone_db: Db,
    pub dir: tempfile::TempDir,
}

impl Fleet {
    fn start(knobs: &Knobs) -> Fleet {
        // Clients come from many loopback addresses (see
        // `loadgen::connect_all`), which protected mode would refuse; the
        // servers still listen on 127.0.0.1 only. Room for the memory
        // scenarios' clients, plus the harness's own.
        let options = RedisOptions {
            extra_args: vec![
                "--protected-mode".into(),
                "no".into(),
                "--maxclients".into(),
                (knobs.many_clients.max(knobs.idle_clients) + 1000).to_string(),
            ],
            ..RedisOptions::default()
        };
        let cluster = LocalCluster::start(3, 0, &options)
            .unwrap_or_else(|e| panic!("cannot start the Redis Cluster: {e}"));
        let standalone = LocalRedis::start(&options)
            .unwrap_or_else(|e| panic!("cannot start the standalone Redis: {e}"));
        let primaries: Vec<u16> = cluster.nodes[..cluster.masters]
            .iter()
            .map(|n| n.port)
            .collect();
        let cluster_db = Db::new(&primaries, knobs.skus, fleet::slot_owner(&primaries));
        let standalone_db = Db::new(&[standalone.node.port], knobs.skus, |_| 0);
        let dir = tempfile::Builder::new()
            .prefix("stockgate-bench-")
            .tempdir()
            .expect("a temp dir");
        Fleet {
            cluster,
            standalone,
            cluster_db,
            standalone_db,
            dir,
        }
    }

    pub fn db(&mut self, id: TargetId) -> &mut Db {
        if id.on_cluster() {
            &mut self.cluster_db
        } else {
            &mut self.standalone_db
        }
    }

    pub fn start_stockgate(&self, knobs: &Knobs, name: &str, on_cluster: bool) -> Stockgate {
        let (seeds, mode) = if on_cluster {
            (self.cluster.seeds(), "cluster")
        } else {
            (vec![self.standalone.url()], "standalone")
        };
        Stockgate::start(&knobs.stockgate_bin, name, &seeds, mode, self.dir.path())
    }

    pub fn start_twemproxy(&self, knobs: &Knobs, name: &str) -> Twemproxy {
        Twemproxy::start(
            &knobs.nutcracker_bin,
            name,
            self.standalone.node.port,
            self.dir.path(),
        )
    }

    /// Where a target's connections go: one proxy address, or (direct to
    /// the cluster) one route per primary with the skus it owns.
    pub fn routes(&self, id: TargetId, proxy: Option<SocketAddr>) -> Vec<(SocketAddr, Vec<usize>)> {
        let db = if id.on_cluster() {
            &self.cluster_db
        } else {
            &self.standalone_db
        };
        let all: Vec<usize> = (0..db.skus.len()).collect();
        match (id, proxy) {
            (_, Some(addr)) => vec![(addr, all)],
            (TargetId::DirectCluster, None) => db
                .ports()
                .into_iter()
                .enumerate()
                .map(|(node, port)| {
                    let owned = all
                        .iter()
                        .copied()
                        .filter(|&s| db.skus[s].1 == node)
                        .collect();
                    (SocketAddr::from(([127, 0, 0, 1], port)), owned)
                })
                .collect(),
            (_, None) => vec![(SocketAddr::from(([127, 0, 0, 1], db.ports()[0])), all)],
        }
    }
}

/// A free loopback port, for [`postgres`].
fn free_port() -> u16 {
    fleet::free_addr().port()
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench
    // binaries without it, and this one is far too heavy for a test run.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("side_by_side: skipped (run it with `cargo bench --bench side_by_side`)");
        return;
    }
    let modes: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |mode: &str| modes.is_empty() || modes.contains(&mode);
    if modes == ["script-cost"] {
        // Redis alone, under callgrind: no fleet to start.
        script_cost::run();
        return;
    }
    loadgen::self_check();
    let knobs = Knobs::from_env();
    let fd_limit = fleet::raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");

    println!("{}", report::machine(fd_limit, &knobs));
    let started = Instant::now();
    let mut fleet = Fleet::start(&knobs);
    if wants("throughput") {
        throughput(&runtime, &knobs, &mut fleet);
    }
    if wants("latency") {
        latency::run(&runtime, &knobs, &mut fleet);
    }
    if wants("orders") {
        orders::run(&runtime, &knobs, &mut fleet);
    }
    if wants("memory") {
        memory::run(&runtime, &knobs, &mut fleet, fd_limit);
    }
    if wants("instructions") {
        let counts = instructions::run(&runtime, &knobs, &mut fleet);
        println!("{}", report::instructions(&counts));
    }
    if wants("flash") {
        flash::run(&runtime, &knobs, &mut fleet);
    }
    if wants("sink") {
        sink::run(&runtime, &knobs, &mut fleet);
    }
    if wants("script-cost") {
        script_cost::run();
    }
    eprintln!("done in {:.0?}", started.elapsed());
}

/// The proxies of the wanted targets, as the throughput and latency rows
/// go through them; stopped when dropped.
pub struct Proxies {
    stockgate_cluster: Option<Stockgate>,
    stockgate_standalone: Option<Stockgate>,
    twemproxy: Option<Twemproxy>,
}

impl Proxies {
    pub fn start(knobs: &Knobs, fleet: &Fleet) -> Proxies {
        let wanted = |id: TargetId| knobs.targets.contains(&id);
        Proxies {
            stockgate_cluster: wanted(TargetId::StockgateCluster)
                .then(|| fleet.start_stockgate(knobs, "stockgate-cluster", true)),
            stockgate_standalone: wanted(TargetId::StockgateStandalone)
                .then(|| fleet.start_stockgate(knobs, "stockgate-standalone", false)),
            twemproxy: wanted(TargetId::TwemproxyStandalone)
                .then(|| fleet.start_twemproxy(knobs, "twemproxy-standalone")),
        }
    }

    /// Where a proxied target's clients connect, and the proxy's pid.
    fn proxy_of(&self, id: TargetId) -> Option<(SocketAddr, u32)> {
        match id {
            TargetId::StockgateCluster => self
                .stockgate_cluster
                .as_ref()
                .map(|s| (s.addr, s.proc.pid)),
            TargetId::StockgateStandalone => self
                .stockgate_standalone
                .as_ref()
                .map(|s| (s.addr, s.proc.pid)),
            TargetId::TwemproxyStandalone => self.twemproxy.as_ref().map(|t| (t.addr, t.proc.pid)),
            _ => None,
        }
    }

    /// The wanted targets, in the order of `BENCH_TARGETS`.
    pub fn targets(&self, knobs: &Knobs, fleet: &Fleet) -> Vec<Target> {
        knobs
            .targets
            .iter()
            .map(|&id| {
                let proxy = self.proxy_of(id);
                Target {
                    id,
                    shape: match id {
                        TargetId::StockgateCluster | TargetId::StockgateStandalone => Shape::Deduct,
                        TargetId::DirectStandaloneV3 => Shape::EvalshaV3,
                        _ => Shape::Evalsha,
                    },
                    routes: fleet.routes(id, proxy.map(|p| p.0)),
                    proxy: proxy.map(|p| p.1),
                }
            })
            .collect()
    }

    fn procs(&mut self) -> impl Iterator<Item = &mut Proc> {
        [
            self.stockgate_cluster.as_mut().map(|s| &mut s.proc),
            self.stockgate_standalone.as_mut().map(|s| &mut s.proc),
            self.twemproxy.as_mut().map(|t| &mut t.proc),
        ]
        .into_iter()
        .flatten()
    }

    /// Fails loudly if a proxy has died.
    pub fn check_alive(&mut self) {
        self.procs().for_each(Proc::check_alive);
    }

    /// What the proxies logged (warnings and errors), as a markdown
    /// paragraph, or nothing when they logged nothing.
    pub fn logs(&mut self) -> String {
        let logs: Vec<String> = self
            .procs()
            .filter_map(|proc| proc.log_summary())
            .map(|line| format!("- {line}"))
            .collect();
        if logs.is_empty() {
            String::new()
        } else {
            format!("Proxy logs (warnings and errors):\n\n{}\n", logs.join("\n"))
        }
    }
}

/// The side-by-side table.
fn throughput(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) {
    let mut proxies = Proxies::start(knobs, fleet);
    let targets = proxies.targets(knobs, fleet);

    let per_conn = knobs.requests.div_ceil(knobs.connections);
    let mut row = 0u64;
    // A short unreported warm-up per target: connections, script caches,
    // allocator pools.
    for target in &targets {
        let db = fleet.db(target.id);
        db.reset();
        let conns = plan(
            target,
            db,
            knobs.connections,
            (per_conn / 10).max(1),
            &format!("w{row}"),
            row,
        );
        measure(runtime, target, db, conns, 16).checked();
        row += 1;
    }
    let mut runs = Vec::new();
    for repeat in 0..knobs.repeats {
        for &depth in &knobs.depths {
            for k in 0..targets.len() {
                let target = &targets[(k + repeat) % targets.len()];
                let db = fleet.db(target.id);
                db.reset();
                let conns = plan(
                    target,
                    db,
                    knobs.connections,
                    per_conn,
                    &format!("r{row}"),
                    row,
                );
                let (run, _) = measure(runtime, target, db, conns, depth).checked();
                eprintln!("{}", report::progress(repeat, &run));
                runs.push(run);
                row += 1;
                proxies.check_alive();
            }
        }
    }
    println!("{}", report::table(knobs, &runs));
    let logs = proxies.logs();
    if !logs.is_empty() {
        println!("{logs}");
    }
}

//! stockgate side by side with Redis direct and with twemproxy, end to end
//! on loopback, with one load generator and one load shape for every target.
//!
//! ```sh
//! deploy/bench.sh                                   # installs Redis + nutcracker, then runs all
//! cargo bench --bench side_by_side                  # every mode below, in this order
//! cargo bench --bench side_by_side -- throughput    # only the table
//! cargo bench --bench side_by_side -- latency       # open loop: p50/p99/p99.9 at fixed rates
//! cargo bench --bench side_by_side -- orders        # 3-line ORDERs against 3 DEDUCTs, 3 HOLDs + 3 CONFIRMs
//! cargo bench --bench side_by_side -- allocation    # DEDUCT.AT over 2 and 3 locations beside DEDUCT
//! cargo bench --bench side_by_side -- memory        # only the memory scenarios
//! cargo bench --bench side_by_side -- instructions  # instructions per request and per ORDER, under callgrind
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
//! [`db::START_STOCK`]. The requests are encoded, all connections
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
//! three DEDUCTs written at once, and ORDER.HOLD + ORDER.CONFIRM against
//! three HOLDs, then their three CONFIRMs, and print orders per second,
//! latency and CPU per order, and the ratios; their audit: every reply
//! code 0, and the stock down by exactly 3 × the orders, nothing left on
//! hold.
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
//! # Layout
//!
//! This file reads the knobs and runs the modes asked for, in the order
//! above. Then, in the order a row's data flows:
//!
//! - `fleet.rs`: the Redis servers ([`fleet::Fleet`]) and the proxies in
//!   front of them, as processes; what `/proc` says about their CPU and
//!   memory;
//! - `db.rs`: the data each row starts from (skus seeded, scripts loaded)
//!   and the audit of what a row changed in Redis;
//! - `target.rs`: the targets, where their connections go, and the
//!   requests a row sends them;
//! - `loadgen.rs`: the load generator, closed loop and open loop;
//! - `throughput.rs`: one closed-loop run of a target and its audit, and
//!   the throughput mode;
//! - one file per other mode: `latency.rs`, `orders.rs`, `allocation.rs`, `memory.rs`,
//!   `instructions.rs`, `flash.rs`, `script_cost.rs`, `sink.rs`;
//! - `report.rs`: the markdown the throughput and instructions modes print.
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
//! | `BENCH_CALLGRIND_REQUESTS` | 20000 | instructions: requests per counted load (the ORDER rows: a third as many orders) |
//! | `BENCH_FLASH_CONNECTIONS` | 200 | flash: connections, one request in flight each (`flash.rs`) |
//! | `BENCH_FLASH_TAIL_SECONDS` | 20 | flash: how long the sold-out tail runs after the stock reaches 0 |
//! | `BENCH_SINK_UNITS` | 50000 | sink: units sold in each sale (`sink.rs`) |
//! | `BENCH_SINK_ARGS` | none | sink: extra `journal sink` flags, split at whitespace (`--batch 5000`) |
//! | `BENCH_SINK_LOG` | unset | sink: set, the sinks' debug log on stderr |
//! | `BENCH_NUTCRACKER_BIN` | `/usr/sbin/nutcracker`, else `nutcracker` on the PATH | |

mod allocation;
mod db;
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
mod target;
mod throughput;
// The tests' throwaway PostgreSQL and MariaDB (in temp dirs), and their
// view of the books' tables, for the `sink` mode.
#[path = "../../tests/support/books_db.rs"]
#[allow(dead_code)] // restarts and the like are the tests'
mod books_db;
#[path = "../../tests/support/certs.rs"]
#[allow(dead_code)]
mod certs;
// The tests' one launcher of a stockgate process: the bench's proxies are
// started the way every test starts one (a bench target can't import an
// integration test's module, so it includes the file, as above).
#[path = "../../tests/support/launch.rs"]
#[allow(dead_code)] // descriptors, sockets and the like are the tests'
mod launch;
#[path = "../../tests/support/mariadb.rs"]
#[allow(dead_code)]
mod mariadb;
#[path = "../../tests/support/postgres.rs"]
#[allow(dead_code)]
mod postgres;

use fleet::Fleet;
use std::path::PathBuf;
use std::time::Instant;
use target::TargetId;

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

/// A free loopback port, for [`postgres`] and [`mariadb`].
fn free_port() -> u16 {
    fleet::free_addr().port()
}

/// A path in this repository, for [`mariadb`]'s template.
fn in_repo(relative: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
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
        throughput::run(&runtime, &knobs, &mut fleet);
    }
    if wants("latency") {
        latency::run(&runtime, &knobs, &mut fleet);
    }
    if wants("orders") {
        orders::run(&runtime, &knobs, &mut fleet);
    }
    if wants("allocation") {
        allocation::run(&runtime, &knobs, &mut fleet);
    }
    if wants("memory") {
        memory::run(&runtime, &knobs, &mut fleet, fd_limit);
    }
    if wants("instructions") {
        let counts = instructions::run(&runtime, &knobs, &mut fleet);
        println!("{}", instructions::render(&counts));
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

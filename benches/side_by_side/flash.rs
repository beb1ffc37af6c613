//! The `flash` mode: a flash sale on one SKU (issue 16).
//!
//! One SKU of the standalone Redis (one primary: the hot primary) starts
//! with [`UNITS`] units; every other sku keeps the usual
//! [`crate::db::START_STOCK`]. `BENCH_FLASH_CONNECTIONS` (200)
//! connections each keep one request in flight: a DEDUCT of qty 1 with a
//! fresh request_id, or, one time in ten, a retry of an id that already
//! got code 0 in this run (same id, qty and order_no). Direct targets send
//! EVALSHA of stockgate's own DEDUCT script with the keys and arguments
//! stockgate sends (a fresh call nonce per send, as stockgate makes one per
//! call), so every target gets the same load.
//!
//! Two phases, measured apart: **the sale**, from the first request to the
//! [`UNITS`]-th code 0 (time to sell out), and **the tail**, the sold-out
//! storm that follows, for `BENCH_FLASH_TAIL_SECONDS` (20). A reply counts
//! in the phase it arrived in. Per phase: req/s, Redis CPU per request
//! (`INFO cpu`), stockgate CPU per request (`/proc/<pid>/stat`), p50/p99,
//! and Redis's own `usec_per_call` of the script calls (EVALSHA direct,
//! FCALL through stockgate) and MGET from `INFO commandstats` (`CONFIG RESETSTAT` at each phase's start), the figure
//! that no other process on the box disturbs.
//!
//! Rows: `direct-standalone`, `stockgate-standalone`, and
//! `stockgate-standalone` started with `--coalesce-deducts 1` and with
//! `--sold-out-reads false` (two more stockgates), so coalescing and the
//! sold-out path are each beside their baseline in one run;
//! `BENCH_TARGETS` picks (the three stockgate rows come with
//! `stockgate-standalone`). Each row gets a short unmeasured warm-up on
//! another sku first. Rows run `BENCH_FLASH_RUNS` (3) times, interleaved,
//! and each phase is shown from the run with its median Redis CPU per
//! request, the sale's range beside it: a sale lasts a fraction of a
//! second, so one run's figure moves by tens of percent.
//!
//! After every row the audit: exactly [`UNITS`] code-0 replies (all to
//! fresh ids), stock 0 and [`UNITS`] records in Redis, every retry of an
//! applied id answered 1 (the tail's count is printed), every fresh id of
//! the tail answered 2, no error replies. Anything else stops the run.

use crate::Knobs;
use crate::db::{Db, connect};
use crate::fleet::{self, Fleet, Stockgate, cpu_seconds};
use crate::loadgen::{self, Encoded, ParsedReply};
use crate::target::{Rng, SETTINGS, TargetId};
use bytes::{Buf, BytesMut};
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use stockgate::params::{RequestId, Sku};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The hot SKU's stock at the start of the sale.
pub const UNITS: u64 = 10_000;
/// Percent of the requests that retry an id already applied.
const RETRY_PERCENT: usize = 10;
/// Phases, as the shared phase counter says.
const SALE: usize = 0;
const TAIL: usize = 1;
const STOP: usize = 2;
/// A reply later than this fails the row.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Targets of the issue, Redis CPU µs per request through stockgate.
const TAIL_TARGET_US: f64 = 1.5;
const SALE_TARGET_US: f64 = 6.0;

/// The mode's own knobs.
struct FlashKnobs {
    connections: usize,
    tail: Duration,
    /// Runs per row, interleaved (`BENCH_FLASH_RUNS`, 3): a sale lasts a
    /// fraction of a second, so one run's figure moves by tens of percent.
    runs: usize,
}

impl FlashKnobs {
    fn from_env() -> FlashKnobs {
        let connections = match std::env::var("BENCH_FLASH_CONNECTIONS") {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("BENCH_FLASH_CONNECTIONS={v:?} is not a number"))
                .max(1),
            Err(_) => 200,
        };
        let tail = match std::env::var("BENCH_FLASH_TAIL_SECONDS") {
            Ok(v) => match v.trim().parse::<f64>() {
                Ok(s) if s > 0.0 => Duration::from_secs_f64(s),
                _ => panic!("BENCH_FLASH_TAIL_SECONDS={v:?} is not a number of seconds"),
            },
            Err(_) => Duration::from_secs(20),
        };
        let runs = match std::env::var("BENCH_FLASH_RUNS") {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("BENCH_FLASH_RUNS={v:?} is not a number"))
                .max(1),
            Err(_) => 3,
        };
        FlashKnobs {
            connections,
            tail,
            runs,
        }
    }
}

/// How a row's requests are spelled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    Evalsha,
    Deduct,
}

/// One row of the table.
struct Row {
    name: &'static str,
    wire: Wire,
    addr: SocketAddr,
    /// The stockgate serving it, if any.
    proxy: Option<usize>,
    /// Counts the sold-out path's metric (a stockgate with the path on).
    sold_out_reads: bool,
}

/// What one phase of one row measured.
#[derive(Clone)]
pub struct Phase {
    pub requests: u64,
    pub seconds: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub redis_cpu_us: f64,
    pub proxy_cpu_us: Option<f64>,
    /// `usec_per_call` and calls of the script calls (EVALSHA and FCALL
    /// together) and of MGET (`INFO commandstats`).
    pub script: Option<(f64, u64)>,
    pub mget: Option<(f64, u64)>,
    /// `stockgate_sold_out_reads_total` answered and script, over the phase.
    pub sold_out_reads: Option<(u64, u64)>,
    /// `stockgate_coalesced_calls_total` and `_deducts_total`, over the phase.
    pub coalesced: Option<(u64, u64)>,
}

impl Phase {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }
}

/// One measured row.
pub struct FlashRun {
    pub name: &'static str,
    pub sale: Phase,
    pub tail: Phase,
    /// Retries of applied ids during the tail, and how many got 1.
    pub tail_retries: u64,
    pub tail_retries_one: u64,
    /// The lowest and highest Redis CPU per request of the row's sales.
    pub sale_range: (f64, f64),
}

/// The `flash` mode: every wanted row once, then the table.
pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) {
    let flash = FlashKnobs::from_env();
    let wanted = |id: TargetId| knobs.targets.contains(&id);
    // Each with its tag, for its log.
    let mut proxies: Vec<(&str, Stockgate)> = Vec::new();
    let mut rows = Vec::new();
    let direct = SocketAddr::from(([127, 0, 0, 1], fleet.standalone.node.port));
    if wanted(TargetId::DirectStandalone) {
        rows.push(Row {
            name: "direct-standalone",
            wire: Wire::Evalsha,
            addr: direct,
            proxy: None,
            sold_out_reads: false,
        });
    }
    if wanted(TargetId::StockgateStandalone) {
        let seeds = vec![fleet.standalone.url()];
        // The sold-out path and coalescing each beside a stockgate without
        // it, in one run.
        for (name, tag, args, on) in [
            ("stockgate-standalone", "flash-stockgate", &[][..], true),
            (
                "stockgate-standalone --coalesce-deducts 1",
                "flash-stockgate-no-coalescing",
                &["--coalesce-deducts", "1"][..],
                true,
            ),
            (
                "stockgate-standalone --sold-out-reads false",
                "flash-stockgate-no-sold-out-reads",
                &["--sold-out-reads", "false"][..],
                false,
            ),
        ] {
            let s =
                fleet::start_stockgate(&[], &knobs.stockgate_bin, tag, &seeds, "standalone", args);
            rows.push(Row {
                name,
                wire: Wire::Deduct,
                addr: s.addr,
                proxy: Some(proxies.len()),
                sold_out_reads: on,
            });
            proxies.push((tag, s));
        }
    }
    if rows.is_empty() {
        eprintln!("flash: skipped (it runs direct-standalone and stockgate-standalone only)");
        return;
    }
    let port = fleet.standalone.node.port;
    let mut admin = connect(port);
    let db = &mut fleet.standalone_db;
    let mut measured: Vec<Vec<FlashRun>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 0..flash.runs {
        for (k, row) in rows.iter().enumerate() {
            let proxy = row.proxy.map(|i| &proxies[i].1);
            // Warm-up: connections, script cache, allocator pools, on a sku
            // with plenty of stock; not measured.
            db.reset();
            let warm = Load {
                sku: db.skus[1 % db.skus.len()].0.clone(),
                units: 2_000,
                tail: Duration::ZERO,
                connections: flash.connections,
                tag: format!("fw{round}x{k}"),
            };
            let _ = drive_row(runtime, row, db, &mut admin, proxy, &warm, true);
            db.reset();
            let load = Load {
                sku: db.skus[0].0.clone(),
                units: UNITS,
                tail: flash.tail,
                connections: flash.connections,
                tag: format!("f{round}x{k}"),
            };
            redis::cmd("SET")
                .arg(stock_key(db, &load.sku))
                .arg(UNITS)
                .query::<()>(&mut admin)
                .expect("seed the hot sku");
            let run = drive_row(runtime, row, db, &mut admin, proxy, &load, false);
            eprintln!("run {round} {}", progress(&run));
            measured[k].push(run);
            for (tag, p) in &mut proxies {
                fleet::check_alive(tag, p);
            }
        }
    }
    let runs: Vec<FlashRun> = measured.into_iter().map(median_run).collect();
    println!("{}", table(&flash, &runs));
    let logs: Vec<String> = proxies
        .iter()
        .filter_map(|(tag, p)| fleet::log_summary(tag, &p.log()))
        .map(|line| format!("- {line}"))
        .collect();
    if !logs.is_empty() {
        println!("Proxy logs (warnings and errors):\n\n{}\n", logs.join("\n"));
    }
}

/// One sale through the stockgate `proxy` on the standalone Redis, for
/// the `sink` mode: `units` units on a SKU of their own, `connections`
/// connections, no tail, audited as every flash row is. Returns the sale's
/// phase and when it sold out.
pub fn sale(
    runtime: &tokio::runtime::Runtime,
    db: &mut Db,
    admin: &mut redis::Connection,
    proxy: &Stockgate,
    units: u64,
    connections: usize,
    tag: &str,
) -> Phase {
    let row = Row {
        name: "sink-sale",
        wire: Wire::Deduct,
        addr: proxy.addr,
        proxy: None,
        sold_out_reads: false,
    };
    let load = Load {
        sku: db.skus[0].0.clone(),
        units,
        tail: Duration::ZERO,
        connections,
        tag: tag.to_owned(),
    };
    redis::cmd("SET")
        .arg(stock_key(db, &load.sku))
        .arg(units)
        .query::<()>(admin)
        .expect("seed the hot sku");
    drive_row(runtime, &row, db, admin, Some(proxy), &load, false).sale
}

/// The connections of a flash row (`BENCH_FLASH_CONNECTIONS`).
pub fn connections() -> usize {
    FlashKnobs::from_env().connections
}

/// A row's runs as one: each phase from the run whose Redis CPU per
/// request is the median of that phase's, the retry counts summed, and
/// the sale's spread kept for the table.
fn median_run(mut runs: Vec<FlashRun>) -> FlashRun {
    let sale_range = runs
        .iter()
        .map(|r| r.sale.redis_cpu_us)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    runs.sort_by(|a, b| a.sale.redis_cpu_us.total_cmp(&b.sale.redis_cpu_us));
    let sale = runs[runs.len() / 2].sale.clone();
    runs.sort_by(|a, b| a.tail.redis_cpu_us.total_cmp(&b.tail.redis_cpu_us));
    let tail = runs[runs.len() / 2].tail.clone();
    FlashRun {
        name: runs[0].name,
        sale,
        tail,
        tail_retries: runs.iter().map(|r| r.tail_retries).sum(),
        tail_retries_one: runs.iter().map(|r| r.tail_retries_one).sum(),
        sale_range,
    }
}

/// One row's load.
struct Load {
    sku: String,
    units: u64,
    tail: Duration,
    connections: usize,
    tag: String,
}

/// What the connections share.
struct Shared {
    phase: AtomicUsize,
    /// Code-0 replies so far.
    sold: AtomicU64,
    units: u64,
    sold_out_at: OnceLock<Instant>,
    sold_out: tokio::sync::Notify,
    /// Applied ids, as (connection, n) of `<tag>-<connection>-<n>`.
    applied: Mutex<Vec<(usize, u64)>>,
}

/// What one connection saw in one phase.
struct Tally {
    latency: Histogram<u64>,
    /// Replies by code, to fresh ids and to retries.
    fresh: [u64; 5],
    retry: [u64; 5],
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            latency: loadgen::histogram(),
            fresh: [0; 5],
            retry: [0; 5],
            errors: 0,
            first_error: None,
        }
    }

    fn add(&mut self, other: &Tally) {
        self.latency.add(&other.latency).expect("same bounds");
        for i in 0..5 {
            self.fresh[i] += other.fresh[i];
            self.retry[i] += other.retry[i];
        }
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    fn replies(&self) -> u64 {
        self.fresh.iter().sum::<u64>() + self.retry.iter().sum::<u64>() + self.errors
    }
}

/// Counters read at a phase boundary.
struct Probe {
    at: Instant,
    redis: f64,
    proxy: Option<f64>,
    sold_out_reads: Option<(u64, u64)>,
    coalesced: Option<(u64, u64)>,
}

fn probe(db: &mut Db, proxy: Option<&Stockgate>, sold_out_reads: bool) -> Probe {
    Probe {
        at: Instant::now(),
        redis: db.cpu_seconds(),
        proxy: proxy.map(|p| cpu_seconds(p.pid())),
        sold_out_reads: proxy.filter(|_| sold_out_reads).map(|p| {
            let read = |result: &str| {
                p.metric(&format!(
                    "stockgate_sold_out_reads_total{{result=\"{result}\"}}"
                ))
                .unwrap_or(0.0) as u64
            };
            (read("answered"), read("script"))
        }),
        coalesced: proxy.map(|p| {
            let read = |name: &str| p.metric(name).unwrap_or(0.0) as u64;
            (
                read("stockgate_coalesced_calls_total"),
                read("stockgate_coalesced_deducts_total"),
            )
        }),
    }
}

/// Runs one row's sale and tail, audits it, and returns what it measured.
/// A warm-up row stops at its sale's end and is not audited.
fn drive_row(
    runtime: &tokio::runtime::Runtime,
    row: &Row,
    db: &mut Db,
    admin: &mut redis::Connection,
    proxy: Option<&Stockgate>,
    load: &Load,
    warm_up: bool,
) -> FlashRun {
    let shared = Arc::new(Shared {
        phase: AtomicUsize::new(SALE),
        sold: AtomicU64::new(0),
        units: load.units,
        sold_out_at: OnceLock::new(),
        sold_out: tokio::sync::Notify::new(),
        applied: Mutex::new(Vec::with_capacity(load.units as usize)),
    });
    let spelling = Arc::new(Spelling::new(row.wire, db, &load.sku, &load.tag));
    let addrs = vec![row.addr; load.connections];
    let (tallies, probes, stats) = runtime.block_on(async {
        let streams = loadgen::connect_all(&addrs)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", row.name));
        reset_stats(admin);
        let start = probe(db, proxy, row.sold_out_reads);
        let tasks: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(c, stream)| {
                tokio::spawn(drive(stream, c, Arc::clone(&shared), Arc::clone(&spelling)))
            })
            .collect();
        let sold_out =
            tokio::time::timeout(Duration::from_secs(120), shared.sold_out.notified()).await;
        let mid = probe(db, proxy, row.sold_out_reads);
        let sale_stats = commandstats(admin);
        reset_stats(admin);
        if sold_out.is_ok() && shared.phase.load(Ordering::Acquire) == TAIL {
            tokio::time::sleep(load.tail).await;
        }
        shared.phase.store(STOP, Ordering::Release);
        let mut tallies = Vec::new();
        let mut failure = None;
        for task in tasks {
            match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
                Ok(t) => tallies.push(t),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        let end = probe(db, proxy, row.sold_out_reads);
        let tail_stats = commandstats(admin);
        if let Some(e) = failure {
            panic!("{}: the load generator failed: {e}", row.name);
        }
        if sold_out.is_err() {
            panic!(
                "{}: not sold out within 120 s ({} of {} units)",
                row.name,
                shared.sold.load(Ordering::Relaxed),
                load.units
            );
        }
        (tallies, [start, mid, end], [sale_stats, tail_stats])
    });
    let mut sale = Tally::new();
    let mut tail = Tally::new();
    for [s, t] in &tallies {
        sale.add(s);
        tail.add(t);
    }
    let sold_out_at = *shared.sold_out_at.get().expect("sold out");
    let [start, mid, end] = probes;
    let [sale_stats, tail_stats] = stats;
    let phase = |tally: &Tally, from: &Probe, to: &Probe, seconds: f64, stats: &Stats| {
        let requests = tally.replies();
        let per = |s: f64| s * 1e6 / requests.max(1) as f64;
        Phase {
            requests,
            seconds,
            p50_us: tally.latency.value_at_quantile(0.50) as f64 / 1e3,
            p99_us: tally.latency.value_at_quantile(0.99) as f64 / 1e3,
            redis_cpu_us: per(to.redis - from.redis),
            proxy_cpu_us: from.proxy.zip(to.proxy).map(|(b, a)| per(a - b)),
            script: stats.script,
            mget: stats.mget,
            sold_out_reads: from
                .sold_out_reads
                .zip(to.sold_out_reads)
                .map(|(b, a)| (a.0 - b.0, a.1 - b.1)),
            coalesced: from
                .coalesced
                .zip(to.coalesced)
                .map(|(b, a)| (a.0 - b.0, a.1 - b.1)),
        }
    };
    let sale_phase = phase(
        &sale,
        &start,
        &mid,
        sold_out_at.duration_since(start.at).as_secs_f64(),
        &sale_stats,
    );
    let sale_redis_cpu_us = sale_phase.redis_cpu_us;
    let run = FlashRun {
        name: row.name,
        sale: sale_phase,
        tail: phase(
            &tail,
            &mid,
            &end,
            end.at.duration_since(sold_out_at).as_secs_f64(),
            &tail_stats,
        ),
        tail_retries: tail.retry.iter().sum::<u64>(),
        tail_retries_one: tail.retry[1],
        sale_range: (sale_redis_cpu_us, sale_redis_cpu_us),
    };
    if !warm_up {
        let problems = audit(db, admin, load, &sale, &tail);
        if !problems.is_empty() {
            panic!("{}: {}", row.name, problems.join("; "));
        }
    }
    run
}

/// What is wrong with a row, from its replies and from Redis: empty when
/// all is well.
fn audit(
    db: &Db,
    admin: &mut redis::Connection,
    load: &Load,
    sale: &Tally,
    tail: &Tally,
) -> Vec<String> {
    let mut problems = Vec::new();
    let zeros = sale.fresh[0] + tail.fresh[0];
    if zeros != load.units || sale.retry[0] + tail.retry[0] != 0 {
        problems.push(format!(
            "expected {} code-0 replies to fresh ids and none to retries, got {zeros} and {}",
            load.units,
            sale.retry[0] + tail.retry[0]
        ));
    }
    let bad_retries = |t: &Tally| t.retry.iter().sum::<u64>() - t.retry[1];
    if bad_retries(sale) + bad_retries(tail) != 0 {
        problems.push(format!(
            "retries of applied ids not answered 1: {} in the sale, {} in the tail (codes: sale {:?}, tail {:?})",
            bad_retries(sale),
            bad_retries(tail),
            sale.retry,
            tail.retry
        ));
    }
    let bad_fresh = tail.fresh.iter().sum::<u64>() - tail.fresh[2];
    if bad_fresh != 0 {
        problems.push(format!(
            "{bad_fresh} fresh ids of the tail not answered 2 (codes {:?})",
            tail.fresh
        ));
    }
    if sale.errors + tail.errors != 0 {
        problems.push(format!(
            "{} error replies (first: {:?})",
            sale.errors + tail.errors,
            sale.first_error.as_ref().or(tail.first_error.as_ref())
        ));
    }
    let stock: Option<i64> = redis::cmd("GET")
        .arg(stock_key(db, &load.sku))
        .query(admin)
        .expect("GET the hot sku's stock");
    if stock != Some(0) {
        problems.push(format!(
            "the hot sku's stock is {stock:?} after the sale, not 0"
        ));
    }
    let keys: u64 = redis::cmd("DBSIZE").query(admin).expect("DBSIZE");
    // Keys that are not records: the sweeper's, and with `--journal` (the
    // `sink` mode) the hot SKU's journal and its shard's set of journals.
    let hot = stockgate::params::Sku::parse(load.sku.clone().into()).expect("a valid sku");
    let layout = db.layout();
    let sweeper: u64 = redis::cmd("EXISTS")
        .arg(layout.sweep_lease())
        .arg(layout.sweep_active())
        .arg(layout.journal_key(&hot))
        .arg(&layout.sweep_shards()[layout.sweep_shard_index(&hot)].journals)
        .query(admin)
        .expect("EXISTS");
    let records = keys - sweeper - db.skus.len() as u64;
    if records != load.units {
        problems.push(format!(
            "Redis holds {records} idempotency records, expected {}",
            load.units
        ));
    }
    problems
}

/// Builds one request's bytes.
struct Spelling {
    wire: Wire,
    sku: String,
    sha: String,
    layout: stockgate::keys::KeyLayout,
    tag: String,
}

impl Spelling {
    fn new(wire: Wire, db: &Db, sku: &str, tag: &str) -> Spelling {
        Spelling {
            wire,
            sku: sku.to_owned(),
            sha: db.sha().to_owned(),
            layout: db.layout().clone(),
            tag: tag.to_owned(),
        }
    }

    /// The request for id `<tag>-<c>-<n>`, sent as call number `call` of
    /// connection `sender`.
    fn request(&self, c: usize, n: u64, sender: usize, call: u64) -> Encoded {
        let request_id = format!("{}-{c}-{n}", self.tag);
        let order_no = format!("ORD-{c}-{n}");
        let mut out = Encoded::default();
        match self.wire {
            Wire::Deduct => out.push(&[
                b"DEDUCT",
                self.sku.as_bytes(),
                b"1",
                request_id.as_bytes(),
                order_no.as_bytes(),
            ]),
            Wire::Evalsha => {
                let keys = self.layout.request_keys(
                    &Sku::parse(self.sku.clone().into()).expect("valid sku"),
                    &RequestId::parse(request_id.into()).expect("valid request_id"),
                );
                // A fresh nonce per call, as stockgate sends: a retry is a
                // new call.
                let nonce = format!("{:x}", ((sender as u64) << 40) | call);
                out.push(&[
                    b"EVALSHA",
                    self.sha.as_bytes(),
                    b"6",
                    &keys.stock,
                    &keys.record,
                    &keys.holds,
                    &keys.held,
                    &keys.marker,
                    &keys.journal,
                    b"1",
                    order_no.as_bytes(),
                    SETTINGS,
                    nonce.as_bytes(),
                ]);
            }
        }
        out
    }
}

/// One connection, one request in flight, until the phase says stop.
/// Returns its tallies of the sale and the tail.
async fn drive(
    mut stream: TcpStream,
    c: usize,
    shared: Arc<Shared>,
    spelling: Arc<Spelling>,
) -> Result<[Tally; 2], String> {
    let mut tallies = [Tally::new(), Tally::new()];
    let mut rng = Rng::new(0xF1A5 ^ ((c as u64) << 32));
    let mut input = BytesMut::with_capacity(4096);
    let mut fresh_n = 0u64;
    let mut call = 0u64;
    let result = async {
        while shared.phase.load(Ordering::Acquire) != STOP {
            let retry = if rng.below(100) < RETRY_PERCENT {
                let applied = shared.applied.lock().expect("not poisoned");
                (!applied.is_empty()).then(|| applied[rng.below(applied.len())])
            } else {
                None
            };
            let (id_c, id_n) = retry.unwrap_or_else(|| {
                fresh_n += 1;
                (c, fresh_n)
            });
            call += 1;
            let request = spelling.request(id_c, id_n, c, call);
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| format!("write: {e}"))?;
            let sent = Instant::now();
            let reply = loop {
                if let Some((len, reply)) = loadgen::parse_reply(&input)? {
                    input.advance(len);
                    break reply;
                }
                let read = tokio::time::timeout(REPLY_TIMEOUT, stream.read_buf(&mut input))
                    .await
                    .map_err(|_| format!("no reply within {REPLY_TIMEOUT:?}"))?
                    .map_err(|e| format!("read: {e}"))?;
                if read == 0 {
                    return Err("connection closed by the server".to_owned());
                }
            };
            let now = Instant::now();
            let phase = shared.phase.load(Ordering::Acquire).min(TAIL);
            let tally = &mut tallies[phase];
            tally
                .latency
                .saturating_record(((now - sent).as_nanos() as u64).max(1_000));
            match reply {
                ParsedReply::Code(code @ 0..=4) => {
                    let codes = if retry.is_some() {
                        &mut tally.retry
                    } else {
                        &mut tally.fresh
                    };
                    codes[code as usize] += 1;
                    if code == 0 && retry.is_none() {
                        shared
                            .applied
                            .lock()
                            .expect("not poisoned")
                            .push((id_c, id_n));
                        if shared.sold.fetch_add(1, Ordering::AcqRel) + 1 == shared.units {
                            let _ = shared.sold_out_at.set(now);
                            shared.phase.store(TAIL, Ordering::Release);
                            shared.sold_out.notify_one();
                        }
                    }
                }
                ParsedReply::Code(other) => {
                    tally.errors += 1;
                    tally
                        .first_error
                        .get_or_insert(format!("unknown code {other}"));
                }
                ParsedReply::Error(text) | ParsedReply::Other(text) => {
                    tally.errors += 1;
                    tally.first_error.get_or_insert(text);
                }
            }
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        // One connection failing stops the row.
        shared.phase.store(STOP, Ordering::Release);
        shared.sold_out.notify_one();
    }
    result.map(|()| tallies)
}

/// Redis's own figures of one phase.
#[derive(Default)]
struct Stats {
    script: Option<(f64, u64)>,
    mget: Option<(f64, u64)>,
}

fn reset_stats(admin: &mut redis::Connection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(admin)
        .expect("CONFIG RESETSTAT");
}

/// `usec_per_call` and `calls` of the script calls and of MGET since the
/// last reset. A script call is an EVALSHA or, through a stockgate that
/// calls its function library, an FCALL: both together, weighted by calls.
fn commandstats(admin: &mut redis::Connection) -> Stats {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(admin)
        .expect("INFO commandstats");
    let of = |command: &str| -> Option<(f64, u64)> {
        let line = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))?;
        let field = |name: &str| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        Some((
            field("usec_per_call")?.parse().ok()?,
            field("calls")?.parse().ok()?,
        ))
    };
    let script = match (of("evalsha"), of("fcall")) {
        (Some((evalsha_us, evalshas)), Some((fcall_us, fcalls))) => Some((
            (evalsha_us * evalshas as f64 + fcall_us * fcalls as f64)
                / (evalshas + fcalls).max(1) as f64,
            evalshas + fcalls,
        )),
        (evalsha, fcall) => evalsha.or(fcall),
    };
    Stats {
        script,
        mget: of("mget"),
    }
}

fn stock_key(db: &Db, sku: &str) -> Vec<u8> {
    crate::db::stock_key(db.layout(), sku)
}

/// One line per row, on stderr.
fn progress(run: &FlashRun) -> String {
    format!(
        "flash {:<44} sold out in {:.2} s ({:.0} req/s, Redis {:.1} µs/req); tail {:.0} req/s, Redis {:.1} µs/req, proxy {}",
        run.name,
        run.sale.seconds,
        run.sale.throughput(),
        run.sale.redis_cpu_us,
        run.tail.throughput(),
        run.tail.redis_cpu_us,
        run.tail
            .proxy_cpu_us
            .map_or("-".into(), |v| format!("{v:.1} µs/req")),
    )
}

/// The flash table, and the targets beside what was measured.
fn table(flash: &FlashKnobs, runs: &[FlashRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "**Flash sale:** one sku of {UNITS} units on the standalone Redis, {} connections at depth 1, \
         qty 1, fresh request_ids plus {RETRY_PERCENT}% retries of applied ids; \
         the sale until stock 0, then a {:.0} s sold-out tail; {} interleaved runs per row, \
         each phase from the run with its median Redis CPU per request.\n",
        flash.connections,
        flash.tail.as_secs_f64(),
        flash.runs
    );
    out.push_str(
        "| target | phase | seconds | requests | req/s | p50 µs | p99 µs | Redis CPU µs/req | stockgate CPU µs/req | script µs/call (calls) | MGET µs/call (calls) | sold-out reads answered / script | coalesced calls (DEDUCTs) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let stat =
        |s: Option<(f64, u64)>| s.map_or("-".into(), |(us, calls)| format!("{us:.2} ({calls})"));
    for run in runs {
        for (name, p) in [("sale", &run.sale), ("tail", &run.tail)] {
            let _ = writeln!(
                out,
                "| {} | {name} | {:.2} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} | {} |",
                run.name,
                p.seconds,
                p.requests,
                p.throughput(),
                p.p50_us,
                p.p99_us,
                p.redis_cpu_us,
                p.proxy_cpu_us.map_or("-".into(), |v| format!("{v:.1}")),
                stat(p.script),
                stat(p.mget),
                p.sold_out_reads
                    .map_or("-".into(), |(a, s)| format!("{a} / {s}")),
                p.coalesced.map_or("-".into(), |(calls, deducts)| format!(
                    "{calls} ({deducts})"
                )),
            );
        }
    }
    out.push_str(
        "\nseconds: the sale's is the time to sell out (first request to the last code 0). \
         Redis CPU: `INFO cpu` over the phase / requests; stockgate CPU: `/proc/<pid>/stat` (10 ms ticks); \
         script (EVALSHA direct, FCALL through stockgate) and MGET: `INFO commandstats` usec_per_call (`CONFIG RESETSTAT` at the phase's start); \
         the script's own MGET (one per call) counts among the MGETs, so the sold-out reads are the MGET calls beyond the script calls.\n\n",
    );
    let _ = writeln!(
        out,
        "Retries of applied ids answered 1 in the tail: {}.\n",
        runs.iter()
            .map(|r| format!("{} {} of {}", r.name, r.tail_retries_one, r.tail_retries))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "Redis CPU µs per request of the sale over the runs, lowest to highest: {}.\n",
        runs.iter()
            .map(|r| format!("{} {:.2}–{:.2}", r.name, r.sale_range.0, r.sale_range.1))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out.push_str("| target | measured | |\n|---|---|---|\n");
    let mark = |v: f64, limit: f64| if v <= limit { "met" } else { "not met" };
    let direct = runs.iter().find(|r| r.name == "direct-standalone");
    let vs = |f: &dyn Fn(&FlashRun) -> f64| {
        direct.map_or(String::new(), |d| format!(" (direct EVALSHA {:.1})", f(d)))
    };
    if let Some(sg) = runs.iter().find(|r| r.name == "stockgate-standalone") {
        let _ = writeln!(
            out,
            "| sold-out tail: Redis CPU ≤ {TAIL_TARGET_US} µs/req through stockgate | {:.2} µs{} | {} |",
            sg.tail.redis_cpu_us,
            vs(&|r| r.tail.redis_cpu_us),
            mark(sg.tail.redis_cpu_us, TAIL_TARGET_US)
        );
        // Per DEDUCT of the sale; per unit sold (the retries' and the
        // last refusals' cost included) beside it.
        let per_unit = sg.sale.redis_cpu_us * sg.sale.requests as f64 / UNITS as f64;
        let alone = runs
            .iter()
            .find(|r| r.name == "stockgate-standalone --coalesce-deducts 1")
            .map_or(String::new(), |r| {
                format!(", {:.1} without coalescing", r.sale.redis_cpu_us)
            });
        let _ = writeln!(
            out,
            "| the sale: Redis CPU ≤ {SALE_TARGET_US} µs/deduction through stockgate | {:.2} µs per DEDUCT, {per_unit:.2} per unit sold{}{alone} | {} |",
            sg.sale.redis_cpu_us,
            vs(&|r| r.sale.redis_cpu_us),
            mark(sg.sale.redis_cpu_us, SALE_TARGET_US)
        );
    }
    out
}

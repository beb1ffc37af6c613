//! The `sink` mode: can `stockgate journal sink` keep up with a flash sale
//! (issue 26)?
//!
//! The sale is the `flash` mode's: `BENCH_SINK_UNITS` (50,000) units of one
//! SKU on the standalone Redis, `BENCH_FLASH_CONNECTIONS` (200) connections
//! with one DEDUCT each in flight (one in ten a retry of an applied id),
//! through a stockgate, audited as a flash row is. A throwaway PostgreSQL
//! 15 (`initdb` in a temp dir, as the tests start one) takes the entries.
//! Three rows, interleaved, `BENCH_FLASH_RUNS` (3) times each:
//!
//! - `sale, journal off`: the rate to keep up with, a stockgate as the
//!   flash mode runs it.
//! - `sale, journal on, sink live`: a stockgate with `--journal true` and a
//!   sink (its defaults: `--batch 1000`, `--poll 200ms`) running through
//!   the sale. It reports the sale's rate, the most entries the journal
//!   held during it (XLEN sampled every 5 ms: entries not yet moved and
//!   trimmed) and how long after the sale the database held every entry:
//!   a sink that keeps up holds the backlog near one batch, where one that
//!   does not lets it grow with the sale.
//! - `sale, journal on, then drain`: the same sale with no sink, then
//!   `stockgate journal sink --drain` timed from its start to its exit
//!   (PostgreSQL connection and migration check included): the sink's own
//!   rate on a backlog, entries per second.
//! - then the other shape of a backlog: `BENCH_SINK_SKUS` (20,000)
//!   journals of one entry each (`stock import --journal true`), drained
//!   the same way.
//!
//! Each row also gives Redis's CPU per request during its sale (`INFO
//! cpu`, as the flash mode reads it): the journal's cost in Redis, beside
//! script-cost's instruction counts. Each figure is the median of the
//! runs. Every run checks that the database holds exactly
//! `BENCH_SINK_UNITS` `deduct` entries of the hot SKU, once each; anything
//! else stops the run.

use crate::Knobs;
use crate::db::connect;
use crate::fleet::{Fleet, Stockgate, free_addr};
use crate::postgres::Postgres;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Units sold in each sale.
fn units() -> u64 {
    std::env::var("BENCH_SINK_UNITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000)
}

fn runs() -> usize {
    std::env::var("BENCH_FLASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// What one round measured.
struct Round {
    /// The sale's rate with the journal off, deductions per second.
    plain: f64,
    /// Redis CPU per request of each sale (µs, `INFO cpu`): journal off,
    /// on with the sink live, on with no sink.
    cpu: [f64; 3],
    /// The sale's rate with the journal on and a sink running.
    live: f64,
    /// The most entries the hot SKU's journal held during the sale: those
    /// not moved and trimmed yet.
    backlog: i64,
    /// From the sale's end (its audit done) to the database holding every
    /// entry.
    catch_up: Duration,
    /// The sale's rate with the journal on and no sink.
    journaled: f64,
    /// `--drain`'s wall time on the sale's whole journal.
    drain: Duration,
}

pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) {
    let units = units();
    let connections = crate::flash::connections();
    let pg = Postgres::start();
    let database = pg.url();
    let seeds = vec![fleet.standalone.url()];
    let dir = fleet.dir.path().to_owned();
    let mut plain = Stockgate::start_with(
        &[],
        &knobs.stockgate_bin,
        "sink-journal-off",
        &seeds,
        "standalone",
        &dir,
        &[],
    );
    let mut journaled = Stockgate::start_with(
        &[],
        &knobs.stockgate_bin,
        "sink-journal-on",
        &seeds,
        "standalone",
        &dir,
        &["--journal", "true"],
    );
    let mut admin = connect(fleet.standalone.node.port);
    let db = &mut fleet.standalone_db;
    let sql = runtime.block_on(Sql::connect(&database));
    let hot = db.skus[0].0.clone();
    let fleet_port = fleet.standalone.node.port;
    let journal_key = db
        .layout()
        .journal_key(&stockgate::params::Sku::parse(hot.clone().into()).expect("a valid sku"));
    let mut rounds = Vec::new();
    for round in 0..runs() {
        db.reset();
        let sale = crate::flash::sale(
            runtime,
            db,
            &mut admin,
            &plain,
            units,
            connections,
            &format!("sp{round}"),
        );
        let plain_rate = sale.throughput();
        let plain_cpu = sale.redis_cpu_us;

        db.reset();
        runtime.block_on(sql.clear());
        let mut sink = start_sink(&knobs.stockgate_bin, &seeds, &database, false);
        wait_until("the sink's tables", Duration::from_secs(30), || {
            runtime.block_on(sql.ready())
        });
        let backlog = Backlog::watch(fleet_port, journal_key.clone());
        let sale = crate::flash::sale(
            runtime,
            db,
            &mut admin,
            &journaled,
            units,
            connections,
            &format!("sl{round}"),
        );
        let sold_out = Instant::now();
        wait_until(
            "the live sink to catch up",
            Duration::from_secs(120),
            || runtime.block_on(sql.moved(&hot)) >= units as i64,
        );
        let catch_up = sold_out.elapsed();
        let peak = backlog.stop();
        let _ = sink.kill();
        let _ = sink.wait();
        runtime.block_on(sql.audit(&hot, units));
        let live = (sale.throughput(), peak, catch_up, sale.redis_cpu_us);

        db.reset();
        runtime.block_on(sql.clear());
        let sale = crate::flash::sale(
            runtime,
            db,
            &mut admin,
            &journaled,
            units,
            connections,
            &format!("sd{round}"),
        );
        let started = Instant::now();
        let status = start_sink(&knobs.stockgate_bin, &seeds, &database, true)
            .wait()
            .expect("the draining sink runs");
        let drain = started.elapsed();
        assert!(status.success(), "journal sink --drain exited {status}");
        runtime.block_on(sql.audit(&hot, units));
        let round = Round {
            plain: plain_rate,
            cpu: [plain_cpu, live.3, sale.redis_cpu_us],
            live: live.0,
            backlog: live.1,
            catch_up: live.2,
            journaled: sale.throughput(),
            drain,
        };
        eprintln!(
            "sink run {}: sale {:.0}/s off, {:.0}/s on (backlog at most {}, caught up {:.0?} after), drain {:.0} entries/s; Redis CPU per request {:.2?} µs (off, live, no sink)",
            rounds.len(),
            round.plain,
            round.live,
            round.backlog,
            round.catch_up,
            units as f64 / round.drain.as_secs_f64(),
            round.cpu,
        );
        rounds.push(round);
        for p in [&mut plain, &mut journaled] {
            p.proc.check_alive();
        }
    }
    let many = many_skus_drain(runtime, &knobs.stockgate_bin, &seeds, &database, &sql, &dir);
    println!("{}", table(units, connections, &rounds, many));
    drop(pg);
}

/// `stockgate journal sink` against the standalone Redis, with its default
/// batch and poll; `--drain` when `drain`.
fn start_sink(bin: &std::path::Path, seeds: &[String], database: &str, drain: bool) -> Child {
    let mut cmd = stockgate_cmd(bin);
    cmd.env("STOCKGATE_LOG", "warn")
        .args(["journal", "sink", "--database", database])
        .args([
            "--upstream",
            &seeds.join(","),
            "--upstream-mode",
            "standalone",
        ])
        .args(["--admin-listen", &free_addr().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if drain {
        cmd.arg("--drain");
    }
    // Other sink flags to compare in one run (`--batch 5000`).
    if let Ok(extra) = std::env::var("BENCH_SINK_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    if std::env::var_os("BENCH_SINK_LOG").is_some() {
        cmd.env("STOCKGATE_LOG", "stockgate=debug");
    } else {
        cmd.stderr(Stdio::null());
    }
    cmd.spawn().expect("start stockgate journal sink")
}

/// The stockgate binary, with none of this process's `STOCKGATE_*`
/// settings.
fn stockgate_cmd(bin: &std::path::Path) -> Command {
    let mut cmd = Command::new(bin);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("STOCKGATE_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// SKUs in the many-SKUs drain.
fn many_skus() -> usize {
    std::env::var("BENCH_SINK_SKUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// The other shape of a backlog: `many_skus()` journals of one entry each
/// (a `set`, written by `stock import --journal true`), as a shop's many
/// quiet SKUs leave them. `sink --drain`'s entries per second, each run
/// audited (every SKU's entry in the database once, no conflict); the
/// median of `runs()`.
fn many_skus_drain(
    runtime: &tokio::runtime::Runtime,
    bin: &std::path::Path,
    seeds: &[String],
    database: &str,
    sql: &Sql,
    dir: &std::path::Path,
) -> f64 {
    let skus = many_skus();
    let file = dir.join("sink-many.csv");
    let mut csv = String::from("sku,qty\n");
    for i in 0..skus {
        csv.push_str(&format!("sink-many-{i},{}\n", 100 + i % 7));
    }
    std::fs::write(&file, csv).expect("write the import file");
    let mut rates = Vec::new();
    for run in 0..runs() {
        runtime.block_on(sql.clear());
        let status = stockgate_cmd(bin)
            .env("STOCKGATE_LOG", "warn")
            .args(["stock", "import", "--journal", "true", "--upstream"])
            .arg(seeds.join(","))
            .args(["--upstream-mode", "standalone"])
            .arg(&file)
            .stdout(Stdio::null())
            .status()
            .expect("run stock import");
        assert!(status.success(), "stock import exited {status}");
        let started = Instant::now();
        let status = start_sink(bin, seeds, database, true)
            .wait()
            .expect("the draining sink runs");
        let took = started.elapsed();
        assert!(status.success(), "journal sink --drain exited {status}");
        let row = runtime
            .block_on(sql.0.query_one(
                "SELECT count(*), count(DISTINCT sku), \
                 (SELECT count(*) FROM stockgate_journal_conflicts) \
                 FROM stockgate_journal WHERE sku LIKE 'sink-many-%' AND event = 'set'",
                &[],
            ))
            .expect("audit the entries");
        let (entries, distinct, conflicts): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            (entries, distinct, conflicts),
            (skus as i64, skus as i64, 0),
            "the database holds each SKU's entry once (entries, skus, conflicts)"
        );
        let rate = skus as f64 / took.as_secs_f64();
        eprintln!(
            "sink many-skus run {run}: {skus} one-entry journals drained in {took:.2?}, {rate:.0} entries/s"
        );
        rates.push(rate);
    }
    median(rates)
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Samples a journal's length (XLEN: entries not yet moved and trimmed)
/// every few milliseconds on a thread of its own, keeping the largest.
struct Backlog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<i64>,
}

impl Backlog {
    fn watch(port: u16, key: Vec<u8>) -> Backlog {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut conn = connect(port);
            let mut peak = 0;
            while !flag.load(Ordering::Acquire) {
                let len: i64 = redis::cmd("XLEN")
                    .arg(&key)
                    .query(&mut conn)
                    .expect("XLEN of the journal");
                peak = peak.max(len);
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        });
        Backlog { stop, thread }
    }

    fn stop(self) -> i64 {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().expect("the backlog sampler")
    }
}

/// The bench's own connection to the database.
struct Sql(tokio_postgres::Client);

impl Sql {
    async fn connect(url: &str) -> Sql {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        tokio::spawn(connection);
        Sql(client)
    }

    /// The sink has made its tables.
    async fn ready(&self) -> bool {
        let row = self
            .0
            .query_one("SELECT to_regclass('stockgate_journal') IS NOT NULL", &[])
            .await
            .expect("ask for the table");
        row.get(0)
    }

    /// Empties the journal table between rows (once the sink made it).
    async fn clear(&self) {
        if self.ready().await {
            self.0
                .batch_execute("TRUNCATE stockgate_journal, stockgate_journal_conflicts")
                .await
                .expect("TRUNCATE");
        }
    }

    /// Entries of `sku` in the database.
    async fn moved(&self, sku: &str) -> i64 {
        self.0
            .query_one(
                "SELECT count(*) FROM stockgate_journal WHERE sku = $1",
                &[&sku],
            )
            .await
            .expect("count the entries")
            .get(0)
    }

    /// Exactly `units` deduct entries of `sku`, each once, and no conflict.
    async fn audit(&self, sku: &str, units: u64) {
        let row = self
            .0
            .query_one(
                "SELECT count(*), count(DISTINCT request_id), \
                 coalesce(sum(stock_change), 0)::bigint, \
                 (SELECT count(*) FROM stockgate_journal_conflicts) \
                 FROM stockgate_journal WHERE sku = $1 AND event = 'deduct'",
                &[&sku],
            )
            .await
            .expect("audit the entries");
        let (entries, ids, change, conflicts): (i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let units = units as i64;
        assert_eq!(
            (entries, ids, change, conflicts),
            (units, units, -units, 0),
            "the database holds each deduction once (entries, ids, stock change, conflicts)"
        );
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn table(units: u64, connections: usize, rounds: &[Round], many: f64) -> String {
    let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let plain = med(&|r| r.plain);
    let live = med(&|r| r.live);
    let journaled = med(&|r| r.journaled);
    let drain = med(&|r| units as f64 / r.drain.as_secs_f64());
    let backlog = med(&|r| r.backlog as f64);
    let catch_up = med(&|r| r.catch_up.as_secs_f64() * 1e3);
    let mut out = format!(
        "\n### The sink against a flash sale ({units} units, {connections} connections, median of {} runs)\n\n",
        rounds.len()
    );
    out.push_str(
        "| row | entries or deductions per second | × the sale, journal off | Redis CPU per request (µs) | × |\n|---|---:|---:|---:|---:|\n",
    );
    let cpus: Vec<f64> = (0..3).map(|i| med(&|r| r.cpu[i])).collect();
    for (name, rate, cpu) in [
        (
            "sale, journal off (the rate to keep up with)",
            plain,
            Some(cpus[0]),
        ),
        ("sale, journal on, sink live", live, Some(cpus[1])),
        ("sale, journal on, no sink", journaled, Some(cpus[2])),
        ("sink --drain of the sale's journal", drain, None),
        (
            &format!(
                "sink --drain of {} SKUs' journals, one entry each",
                many_skus()
            ),
            many,
            None,
        ),
    ] {
        let cpu = cpu.map_or(" | ".to_owned(), |c| {
            format!("{c:.2} | {:.2}×", c / cpus[0])
        });
        out.push_str(&format!(
            "| {name} | {rate:.0} | {:.2}× | {cpu} |\n",
            rate / plain
        ));
    }
    out.push_str(&format!(
        "\nWith the sink live, the hot SKU's journal held at most {backlog:.0} entries not yet moved (of {units}; sampled every 5 ms), and PostgreSQL held every entry {catch_up:.0} ms after the sale's audit.\n"
    ));
    out
}

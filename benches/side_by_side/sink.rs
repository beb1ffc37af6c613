//! The `sink` mode: can `stockgate journal sink` keep up with a flash sale,
//! into each database it writes?
//!
//! The sale is the `flash` mode's: `BENCH_SINK_UNITS` (50,000) units of one
//! SKU on the standalone Redis, `BENCH_FLASH_CONNECTIONS` (200) connections
//! with one DEDUCT each in flight (one in ten a retry of an applied id),
//! through a stockgate, audited as a flash row is. A throwaway PostgreSQL
//! 15 and a throwaway MariaDB 10.11 (in temp dirs, as the tests start
//! them; `BENCH_SINK_DATABASES=postgres` or `=mariadb` for one) take the
//! entries, each its own rows below. The rows, interleaved,
//! `BENCH_FLASH_RUNS` (3) times each (the sale with the journal off once
//! a round, the others once a round per database):
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
use crate::books_db::{BooksDb, Engine, Session};
use crate::db::connect;
use crate::fleet::{self, Fleet, free_addr};
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

/// The databases to write, `BENCH_SINK_DATABASES` (both by default).
fn engines() -> Vec<Engine> {
    let named = std::env::var("BENCH_SINK_DATABASES").unwrap_or_default();
    let all = [Engine::Postgres, Engine::Mariadb];
    if named.trim().is_empty() {
        return all.to_vec();
    }
    named
        .split(',')
        .map(|name| {
            all.into_iter()
                .find(|e| e.to_string() == name.trim())
                .unwrap_or_else(|| {
                    panic!("BENCH_SINK_DATABASES: {name:?} is not postgres or mariadb")
                })
        })
        .collect()
}

/// One database's name in the table.
fn title(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => "PostgreSQL",
        Engine::Mariadb => "MariaDB",
    }
}

/// What one round measured.
struct Round {
    /// The sale's rate with the journal off, deductions per second.
    plain: f64,
    /// Redis CPU per request of that sale (µs, `INFO cpu`).
    plain_cpu: f64,
    /// Each database's rows, in [`engines`]' order.
    into: Vec<DbRound>,
}

/// What one round measured of one database.
struct DbRound {
    /// Redis CPU per request of each sale (µs): journal on with the sink
    /// live, on with no sink.
    cpu: [f64; 2],
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
    let engines = engines();
    let mut databases: Vec<(BooksDb, Sql)> = engines
        .iter()
        .map(|&engine| {
            let db = BooksDb::start_own(engine);
            let sql = runtime.block_on(Sql::connect(&db));
            (db, sql)
        })
        .collect();
    let seeds = vec![fleet.standalone.url()];
    let dir = fleet.dir.path().to_owned();
    let mut plain = fleet::start_stockgate(
        &[],
        &knobs.stockgate_bin,
        "sink-journal-off",
        &seeds,
        "standalone",
        &[],
    );
    let mut journaled = fleet::start_stockgate(
        &[],
        &knobs.stockgate_bin,
        "sink-journal-on",
        &seeds,
        "standalone",
        &["--journal", "true"],
    );
    let mut admin = connect(fleet.standalone.node.port);
    let db = &mut fleet.standalone_db;
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
        let mut measured = Round {
            plain: sale.throughput(),
            plain_cpu: sale.redis_cpu_us,
            into: Vec::new(),
        };
        for (books, sql) in &mut databases {
            let database = books.url();
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
                &format!("sl{}{round}", books.engine),
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
                &format!("sd{}{round}", books.engine),
            );
            let started = Instant::now();
            let status = start_sink(&knobs.stockgate_bin, &seeds, &database, true)
                .wait()
                .expect("the draining sink runs");
            let drain = started.elapsed();
            assert!(status.success(), "journal sink --drain exited {status}");
            runtime.block_on(sql.audit(&hot, units));
            let into = DbRound {
                cpu: [live.3, sale.redis_cpu_us],
                live: live.0,
                backlog: live.1,
                catch_up: live.2,
                journaled: sale.throughput(),
                drain,
            };
            eprintln!(
                "sink run {round} into {}: sale {:.0}/s off, {:.0}/s on (backlog at most {}, caught up {:.0?} after), drain {:.0} entries/s; Redis CPU per request {:.2} µs off, {:.2?} µs on (live, no sink)",
                books.engine,
                measured.plain,
                into.live,
                into.backlog,
                into.catch_up,
                units as f64 / into.drain.as_secs_f64(),
                measured.plain_cpu,
                into.cpu,
            );
            measured.into.push(into);
        }
        rounds.push(measured);
        fleet::check_alive("sink-journal-off", &mut plain);
        fleet::check_alive("sink-journal-on", &mut journaled);
    }
    let many: Vec<(f64, f64)> = databases
        .iter_mut()
        .map(|(books, sql)| {
            many_skus_drain(
                runtime,
                &knobs.stockgate_bin,
                &seeds,
                &books.url(),
                sql,
                &dir,
            )
        })
        .collect();
    println!("{}", table(units, connections, &engines, &rounds, &many));
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
/// audited (every SKU's entry in the database once, no conflict), then
/// `stockgate reconcile` of every SKU (it must agree), SKUs per second;
/// the medians of `runs()`.
fn many_skus_drain(
    runtime: &tokio::runtime::Runtime,
    bin: &std::path::Path,
    seeds: &[String],
    database: &str,
    sql: &mut Sql,
    dir: &std::path::Path,
) -> (f64, f64) {
    let skus = many_skus();
    let file = dir.join("sink-many.csv");
    let mut csv = String::from("sku,qty\n");
    for i in 0..skus {
        csv.push_str(&format!("sink-many-{i},{}\n", 100 + i % 7));
    }
    std::fs::write(&file, csv).expect("write the import file");
    let (mut rates, mut checks) = (Vec::new(), Vec::new());
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
        let row = runtime.block_on(sql.numbers(
            "SELECT count(*), count(DISTINCT sku), \
             (SELECT count(*) FROM stockgate_journal_conflicts) \
             FROM stockgate_journal WHERE sku LIKE 'sink-many-%' AND event = 'set'",
        ));
        let (entries, distinct, conflicts) = (row[0], row[1], row[2]);
        assert_eq!(
            (entries, distinct, conflicts),
            (skus as i64, skus as i64, 0),
            "the database holds each SKU's entry once (entries, skus, conflicts)"
        );
        let rate = skus as f64 / took.as_secs_f64();
        let started = Instant::now();
        let out = stockgate_cmd(bin)
            .env("STOCKGATE_LOG", "warn")
            .args(["reconcile", "--database", database, "--upstream"])
            .arg(seeds.join(","))
            .args(["--upstream-mode", "standalone"])
            .output()
            .expect("run reconcile");
        let reconciled = started.elapsed();
        let report = String::from_utf8_lossy(&out.stdout);
        let last = report.lines().last().unwrap_or_default();
        let checked: f64 = last
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        assert!(
            out.status.success() && checked >= skus as f64 && last.contains(" 0 drift"),
            "reconcile after the drain agrees on every SKU: {last} ({})",
            out.status
        );
        let check = checked / reconciled.as_secs_f64();
        eprintln!(
            "sink many-skus run {run}: {skus} one-entry journals drained in {took:.2?}, {rate:.0} entries/s; reconcile of {checked} SKUs in {reconciled:.2?}, {check:.0} SKUs/s"
        );
        rates.push(rate);
        checks.push(check);
    }
    (median(rates), median(checks))
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

/// The bench's own session with the database, its queries the same
/// text on both (what differs is written twice).
struct Sql {
    session: Session,
    /// Whether the sink has made its tables.
    ready: &'static str,
}

impl Sql {
    async fn connect(db: &BooksDb) -> Sql {
        Sql {
            session: db.session().await,
            ready: db.sql(
                "SELECT count(*) FROM pg_tables WHERE tablename = 'stockgate_journal'",
                "SELECT count(*) FROM information_schema.tables \
                  WHERE table_schema = DATABASE() AND table_name = 'stockgate_journal'",
            ),
        }
    }

    /// The one row of numbers `sql` gives.
    async fn numbers(&mut self, sql: &str) -> Vec<i64> {
        let rows = self.session.rows(sql).await;
        rows[0]
            .iter()
            .map(|v| {
                v.as_deref()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{sql}: {rows:?}"))
            })
            .collect()
    }

    /// The sink has made its tables.
    async fn ready(&mut self) -> bool {
        let ready = self.ready;
        self.numbers(ready).await[0] > 0
    }

    /// Empties the journal tables between rows (once the sink made them).
    async fn clear(&mut self) {
        if self.ready().await {
            for table in ["stockgate_journal", "stockgate_journal_conflicts"] {
                self.session.execute(&format!("TRUNCATE {table}")).await;
            }
        }
    }

    /// Entries of `sku` in the database.
    async fn moved(&mut self, sku: &str) -> i64 {
        self.numbers(&format!(
            "SELECT count(*) FROM stockgate_journal WHERE sku = '{sku}'"
        ))
        .await[0]
    }

    /// Exactly `units` deduct entries of `sku`, each once, and no conflict.
    async fn audit(&mut self, sku: &str, units: u64) {
        let row = self
            .numbers(&format!(
                "SELECT count(*), count(DISTINCT request_id), coalesce(sum(stock_change), 0), \
                 (SELECT count(*) FROM stockgate_journal_conflicts) \
                 FROM stockgate_journal WHERE sku = '{sku}' AND event = 'deduct'"
            ))
            .await;
        let units = units as i64;
        assert_eq!(
            row,
            [units, units, -units, 0],
            "the database holds each deduction once (entries, ids, stock change, conflicts)"
        );
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn table(
    units: u64,
    connections: usize,
    engines: &[Engine],
    rounds: &[Round],
    many: &[(f64, f64)],
) -> String {
    let med = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
    let plain = med(&|r| r.plain);
    let plain_cpu = med(&|r| r.plain_cpu);
    let mut out = format!(
        "\n### The sink against a flash sale ({units} units, {connections} connections, median of {} runs)\n\n",
        rounds.len()
    );
    out.push_str(
        "| row | entries or deductions per second | × the sale, journal off | Redis CPU per request (µs) | × |\n|---|---:|---:|---:|---:|\n",
    );
    out.push_str(&format!(
        "| sale, journal off (the rate to keep up with) | {plain:.0} | 1.00× | {plain_cpu:.2} | 1.00× |\n"
    ));
    let mut notes = String::new();
    for (i, &engine) in engines.iter().enumerate() {
        let name = title(engine);
        let m = |f: &dyn Fn(&DbRound) -> f64| med(&|r| f(&r.into[i]));
        let rows = [
            (
                format!("{name}: sale, journal on, sink live"),
                m(&|r| r.live),
                Some(m(&|r| r.cpu[0])),
            ),
            (
                format!("{name}: sale, journal on, no sink"),
                m(&|r| r.journaled),
                Some(m(&|r| r.cpu[1])),
            ),
            (
                format!("{name}: sink --drain of the sale's journal"),
                m(&|r| units as f64 / r.drain.as_secs_f64()),
                None,
            ),
            (
                format!(
                    "{name}: sink --drain of {} SKUs' journals, one entry each",
                    many_skus()
                ),
                many[i].0,
                None,
            ),
            (
                format!("{name}: reconcile of those SKUs (SKUs per second)"),
                many[i].1,
                None,
            ),
        ];
        for (row, rate, cpu) in rows {
            let cpu = cpu.map_or(" | ".to_owned(), |c| {
                format!("{c:.2} | {:.2}×", c / plain_cpu)
            });
            out.push_str(&format!(
                "| {row} | {rate:.0} | {:.2}× | {cpu} |\n",
                rate / plain
            ));
        }
        notes.push_str(&format!(
            "\nInto {name}, with the sink live, the hot SKU's journal held at most {:.0} entries not yet moved (of {units}; sampled every 5 ms), and {name} held every entry {:.0} ms after the sale's audit.\n",
            m(&|r| r.backlog as f64),
            m(&|r| r.catch_up.as_secs_f64() * 1e3),
        ));
    }
    out.push_str(&notes);
    out
}

//! The throughput rows: a closed loop (`depth` requests in flight per
//! connection) that finds the most each target serves, every target
//! interleaved and rotated over `BENCH_REPEATS` runs, then the table of
//! medians and ratios.
//!
//! ```sh
//! cargo bench --bench side_by_side -- throughput
//! ```
//!
//! [`measure`] (one closed-loop run of one target and its audit) is what
//! the memory and instructions modes measure with too; the latency mode
//! audits its open loop with [`audit`].

use crate::Knobs;
use crate::db::Db;
use crate::fleet::{self, Fleet, Proxies};
use crate::loadgen::{self, Conn};
use crate::report::{self, Run};
use crate::target::{Target, plan};

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

/// The side-by-side table.
pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) {
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

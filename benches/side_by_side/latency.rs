//! Latency at a fixed rate, open loop: what a sidecar sees most of its
//! life, far below saturation.
//!
//! ```sh
//! cargo bench --bench side_by_side -- latency
//! BENCH_LATENCY_SECONDS=3 BENCH_RATES=2000 cargo bench --bench side_by_side -- latency
//! ```
//!
//! For each rate of `BENCH_RATES` and each target, one row: requests go
//! out at that total rate, request `i` due at `t0 + i / rate` on connection
//! `i % BENCH_CONNECTIONS` (so a connection whose earlier replies are still
//! out pipelines the next request behind them), for `BENCH_LATENCY_SECONDS`.
//! A request's latency is from its intended send time to its reply, not
//! from its actual write: when the server (or the load generator) stalls,
//! every request due meanwhile is late by the stall, as it would be for a
//! real client, instead of the closed loop's one slow reply and a pause in
//! sending (coordinated omission). See [`crate::loadgen::open_loop`].
//!
//! The requests are the throughput rows' (DEDUCT through stockgate, the
//! same EVALSHA direct and through twemproxy, fresh request_ids), and
//! after each row the same audit: every reply code 0, and Redis holding
//! exactly that many records and that much less stock.
//!
//! One thread of the load generator sends and reads for every connection,
//! at normal priority unless `BENCH_LATENCY_PRIORITY` says otherwise. A
//! prioritized thread keeps its sends on time (send lag p99 ~70 µs with
//! `SCHED_FIFO`, against 0.1–3.7 ms at normal priority on the shared
//! 2-core machine), but preempts Redis and the proxy at every reply they
//! write, and turns their batches into ping-pong: at 20,000 req/s,
//! direct-standalone's p99 went from 2.7–7.5 ms (normal) to 18–56 ms
//! (`fifo`), stockgate-standalone's from 7–13 ms to 52–140 ms (`fifo`,
//! `nice`). A load generator must not change what it measures; a late
//! send is measured (the latency counts from the intended time) and
//! reported.
//!
//! The load generator reports how well it kept to the schedule: the rate
//! it achieved and how late its writes began (send lag). A row whose
//! achieved rate is under 99% of the rate asked for, or whose send lag
//! p99 is over [`LATE_LAG_P99_US`], is marked: its latencies then measure
//! the load generator as much as the target.
//!
//! What this machine allows: a `SCHED_FIFO` thread alone on the idle
//! 2-core VM, sleeping to absolute times 200 µs apart with 1 ns timer
//! slack, woke 34 µs late at p50, 68 µs at p99, 1.5 ms at p99.9 and 2.8 ms
//! at worst (at normal priority: 28 µs, 0.95 ms, 7.8 ms, 9.4 ms). Every
//! process here pays such a wake-up per event, the proxies' included, so
//! a proxy's hops (client to proxy, Redis to proxy) cost about that much
//! each whatever its code does; twemproxy's row is the reference for what
//! a proxy hop costs on the machine.

use crate::Knobs;
use crate::fleet::{Fleet, Proxies};
use crate::loadgen;
use crate::target::{TargetId, plan};
use crate::throughput::{audit, measure, probe};
use hdrhistogram::Histogram;
use std::fmt::Write;

/// A send lag p99 above this marks a row: the load generator's own
/// lateness is then a sizeable part of the p99 being measured (the target
/// for what stockgate adds at p99 is 200 µs).
pub const LATE_LAG_P99_US: f64 = 100.0;

/// One open-loop row: the runs of one (target, rate), merged.
#[derive(Debug, Clone)]
pub struct LatencyRun {
    pub target: TargetId,
    /// The rate asked for, requests per second.
    pub rate: u64,
    pub requests: u64,
    /// The rate the load generator achieved (see [`loadgen::Pacing`]),
    /// over all the runs.
    pub achieved: f64,
    /// Percentiles of every request of every run.
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// The lowest and highest p99 of a single run: how much the machine's
    /// noise moved it.
    pub p99_runs_us: (f64, f64),
    /// When writes began minus when they were due.
    pub lag_p99_us: f64,
    pub lag_max_us: f64,
    /// What the load generator's thread ran at (the lowest over the runs).
    pub priority: loadgen::Priority,
    pub proxy_cpu_us: Option<f64>,
}

impl LatencyRun {
    /// The load generator did not keep to the schedule: it fell behind the
    /// rate, or its sends were often late.
    pub fn late(&self) -> bool {
        self.achieved < 0.99 * self.rate as f64 || self.lag_p99_us > LATE_LAG_P99_US
    }
}

/// One measured run, kept whole so that runs merge into a row.
struct Slice {
    target: TargetId,
    rate: u64,
    requests: u64,
    latency: Histogram<u64>,
    lag: Histogram<u64>,
    /// How long the sends took at the achieved rate (requests / achieved).
    span: f64,
    proxy_cpu_seconds: Option<f64>,
    priority: loadgen::Priority,
}

/// The row of `slices` (of one target and rate).
fn merge(slices: &[&Slice]) -> LatencyRun {
    let first = slices[0];
    let mut latency = loadgen::histogram();
    let mut lag = loadgen::lag_histogram();
    for slice in slices {
        latency.add(&slice.latency).expect("same bounds");
        lag.add(&slice.lag).expect("same bounds");
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let p99s: Vec<f64> = slices.iter().map(|s| us(&s.latency, 0.99)).collect();
    let requests: u64 = slices.iter().map(|s| s.requests).sum();
    let cpu: Option<f64> = slices.iter().map(|s| s.proxy_cpu_seconds).sum();
    LatencyRun {
        target: first.target,
        rate: first.rate,
        requests,
        achieved: requests as f64 / slices.iter().map(|s| s.span).sum::<f64>(),
        p50_us: us(&latency, 0.50),
        p99_us: us(&latency, 0.99),
        p999_us: us(&latency, 0.999),
        max_us: latency.max() as f64 / 1e3,
        p99_runs_us: (
            p99s.iter().copied().fold(f64::MAX, f64::min),
            p99s.iter().copied().fold(0.0, f64::max),
        ),
        lag_p99_us: us(&lag, 0.99),
        lag_max_us: lag.max() as f64 / 1e3,
        priority: slices
            .iter()
            .map(|s| s.priority)
            .min_by_key(|p| *p as u8)
            .expect("a slice"),
        proxy_cpu_us: cpu.map(|c| c * 1e6 / requests as f64),
    }
}

/// Runs every (rate, target) row, prints their table, and returns them.
///
/// Each row's `BENCH_LATENCY_SECONDS` are split into `BENCH_REPEATS` runs,
/// interleaved with the other targets' (rotated each round, as the
/// throughput rows are), and their histograms merged: on a shared machine
/// noise comes in bursts (another engineer's compile), and a burst then
/// falls on every target's row rather than on one.
pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) -> Vec<LatencyRun> {
    let mut proxies = Proxies::start(knobs, fleet);
    let targets = proxies.targets(knobs, fleet);
    // A short unreported closed-loop warm-up per target, as the throughput
    // rows have: connections, script caches, allocator pools.
    for (n, target) in targets.iter().enumerate() {
        let db = fleet.db(target.id);
        db.reset();
        let conns = plan(
            target,
            db,
            knobs.connections,
            20,
            &format!("lw{n}"),
            n as u64,
        );
        measure(runtime, target, db, conns, 16).checked();
    }
    let mut slices = Vec::new();
    let mut row = 0u64;
    for &rate in &knobs.rates {
        // Every connection carries the same number of requests (the
        // schedule is round-robin), so a run may last a little longer.
        let seconds = knobs.latency_seconds / knobs.repeats as f64;
        let wanted = (rate as f64 * seconds).ceil() as usize;
        let per_conn = wanted.div_ceil(knobs.connections).max(1);
        for round in 0..knobs.repeats {
            for k in 0..targets.len() {
                let target = &targets[(k + round) % targets.len()];
                let name = target.id.name();
                let db = fleet.db(target.id);
                db.reset();
                let conns = plan(
                    target,
                    db,
                    knobs.connections,
                    per_conn,
                    &format!("l{row}"),
                    1000 + row,
                );
                row += 1;
                let requests: u64 = conns.iter().map(|c| c.requests.len() as u64).sum();
                let (outcome, pacing, before, after) = runtime
                    .block_on(loadgen::open_loop(
                        conns,
                        rate,
                        knobs.latency_priority,
                        || probe(target.proxy, db),
                    ))
                    .unwrap_or_else(|e| panic!("{name}: the load generator failed: {e}"));
                let problems = audit(target, db, &outcome, requests);
                if !problems.is_empty() {
                    panic!("{name}, {rate} req/s: {}", problems.join("; "));
                }
                let slice = Slice {
                    target: target.id,
                    rate,
                    requests,
                    latency: outcome.latency,
                    lag: pacing.lag,
                    span: requests as f64 / pacing.achieved,
                    proxy_cpu_seconds: before.proxy.zip(after.proxy).map(|(b, a)| a - b),
                    priority: pacing.priority,
                };
                let alone = merge(&[&slice]);
                eprintln!("{}", progress(round, &alone));
                if alone.late() {
                    eprintln!(
                        "warning: {name} at {rate} req/s: the load generator's sends were late \
                         (achieved {:.0} req/s, send lag p99 {:.0} µs, max {:.0} µs)",
                        alone.achieved, alone.lag_p99_us, alone.lag_max_us
                    );
                }
                slices.push(slice);
                proxies.check_alive();
            }
        }
    }
    let mut runs = Vec::new();
    for &rate in &knobs.rates {
        for target in &targets {
            let mine: Vec<&Slice> = slices
                .iter()
                .filter(|s| s.target == target.id && s.rate == rate)
                .collect();
            if !mine.is_empty() {
                runs.push(merge(&mine));
            }
        }
    }
    println!("{}", table(knobs, &runs));
    let logs = proxies.logs();
    if !logs.is_empty() {
        println!("{logs}");
    }
    runs
}

/// One line per open-loop run, on stderr, while the benchmark goes on.
fn progress(round: usize, run: &LatencyRun) -> String {
    format!(
        "latency run {round} {:<21} {:>6} req/s, {} requests: achieved {:>6.0}  p50 {:>6.0} µs  p99 {:>6.0} µs  p99.9 {:>6.0} µs  max {:>7.0} µs  send lag p99 {:.0} µs, max {:.0} µs",
        run.target.name(),
        run.rate,
        run.requests,
        run.achieved,
        run.p50_us,
        run.p99_us,
        run.p999_us,
        run.max_us,
        run.lag_p99_us,
        run.lag_max_us,
    )
}

/// The open-loop table, and what stockgate adds over direct at the same
/// rate on the same Redis, against the targets.
fn table(knobs: &Knobs, runs: &[LatencyRun]) -> String {
    let mut out = format!(
        "**Latency at a fixed rate** (open loop): {conns} connections, request i due at \
         t0 + i / rate on connection i mod {conns}, {seconds} s per row in {repeats} interleaved \
         runs, {skus} skus, qty 1, fresh request_ids; latency from each request's intended send \
         time to its reply, so a stall counts against every request due during it. The load \
         generator's thread {priority}.\n\n\
         | target | req/s | achieved req/s | p50 µs | p99 µs | p99.9 µs | max µs | p99 of one run µs | send lag p99 µs | send lag max µs | proxy CPU µs/req |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        conns = knobs.connections,
        seconds = knobs.latency_seconds,
        repeats = knobs.repeats,
        skus = knobs.skus,
        priority = {
            let asked = knobs.latency_priority;
            let got = runs.iter().map(|r| r.priority).min_by_key(|p| *p as u8);
            match got {
                Some(got) if got != asked => format!(
                    "ran at {} priority (BENCH_LATENCY_PRIORITY={} was not permitted)",
                    got.name(),
                    asked.name()
                ),
                _ => format!("ran at {} priority", asked.name()),
            }
        },
    );
    let find =
        |target: TargetId, rate: u64| runs.iter().find(|r| r.target == target && r.rate == rate);
    let mark = |late: bool| if late { " †" } else { "" };
    for &rate in &knobs.rates {
        for &target in &knobs.targets {
            let Some(r) = find(target, rate) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {}{} | {rate} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0}–{:.0} | {:.0} | {:.0} | {} |",
                target.name(),
                mark(r.late()),
                r.achieved,
                r.p50_us,
                r.p99_us,
                r.p999_us,
                r.max_us,
                r.p99_runs_us.0,
                r.p99_runs_us.1,
                r.lag_p99_us,
                r.lag_max_us,
                r.proxy_cpu_us.map_or("-".into(), |v| format!("{v:.1}")),
            );
        }
    }
    let _ = write!(
        out,
        "\nsend lag: when the load generator's write of a request began minus when it was due; it \
         is part of the latencies. †: the load generator was late (achieved under 99% of the rate, \
         or send lag p99 over {:.0} µs), so its own wake-ups weigh in the figures. Proxy CPU: user \
         + system time over the runs / requests.\n\n\
         | added (same Redis, same rate) | req/s | p50 µs | ≤ 50 µs | p99 µs | ≤ 200 µs |\n\
         |---|---:|---:|---|---:|---|\n",
        LATE_LAG_P99_US,
    );
    // (proxied, direct, whether the targets apply)
    let pairs = [
        (
            TargetId::StockgateStandalone,
            TargetId::DirectStandalone,
            true,
        ),
        (TargetId::StockgateCluster, TargetId::DirectCluster, true),
        (
            TargetId::TwemproxyStandalone,
            TargetId::DirectStandalone,
            false,
        ),
    ];
    let verdict = |added: f64, limit: f64, applies: bool| {
        if !applies {
            "-"
        } else if added <= limit {
            "met"
        } else {
            "not met"
        }
    };
    for &rate in &knobs.rates {
        for (a, b, applies) in pairs {
            if let (Some(x), Some(y)) = (find(a, rate), find(b, rate)) {
                let (p50, p99) = (x.p50_us - y.p50_us, x.p99_us - y.p99_us);
                let _ = writeln!(
                    out,
                    "| {} − {}{} | {rate} | {p50:+.0} | {} | {p99:+.0} | {} |",
                    a.name(),
                    b.name(),
                    mark(x.late() || y.late()),
                    verdict(p50, 50.0, applies),
                    verdict(p99, 200.0, applies),
                );
            }
        }
    }
    out
}

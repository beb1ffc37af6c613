//! Allocations per second: DEDUCT.AT over two and three locations beside
//! DEDUCT, through `stockgate-cluster`, in the same run.
//!
//! ```sh
//! cargo bench --bench side_by_side -- allocation
//! BENCH_REQUESTS=20000 BENCH_REPEATS=1 cargo bench --bench side_by_side -- allocation
//! ```
//!
//! Three shapes of one deduction of qty 1, same connections, depth and
//! skus, each on a fresh database:
//!
//! - `DEDUCT`: the skus keep one number (the hot path: pre-encoded node
//!   pipe calls).
//! - `DEDUCT.AT, 2 locations` and `3 locations`: the same skus kept by
//!   location, every location stocked, the call naming them all (`SPLIT`),
//!   the first giving the unit: one `lua/allocate.lua` call, a call on one
//!   request like DEDUCT's, pre-encoded on the node pipes.
//!
//! A row's audit: every reply code 0, and Redis's stock (or locations'
//! units) down by exactly the replies that said 0. The table shows the
//! medians over `BENCH_REPEATS` and each allocation row's ratio to DEDUCT.

use crate::Knobs;
use crate::db::Db;
use crate::fleet::{self, Fleet, Stockgate};
use crate::loadgen::{self, Conn, Encoded};
use crate::target::Rng;
use crate::throughput::probe;
use std::fmt::Write;

/// DEDUCT (0 locations) and DEDUCT.AT over 2 and 3.
const SHAPES: [usize; 3] = [0, 2, 3];

fn name(locations: usize) -> String {
    match locations {
        0 => "DEDUCT".into(),
        n => format!("DEDUCT.AT, {n} locations"),
    }
}

pub(crate) struct AllocationRun {
    locations: usize,
    depth: usize,
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
    stockgate_cpu_us: f64,
    redis_cpu_us: f64,
}

pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) {
    let mut stockgate = fleet.start_stockgate(knobs, "stockgate-allocation", true);
    let db = &mut fleet.cluster_db;
    let per_conn = knobs.requests.min(20_000).div_ceil(knobs.connections);
    let mut row = 0u64;
    for locations in SHAPES {
        let conns = plan(
            &stockgate,
            db,
            locations,
            knobs.connections,
            (per_conn / 10).max(1),
            row,
        );
        measure(runtime, &stockgate, db, conns, locations, 16);
        row += 1;
    }
    let mut runs = Vec::new();
    for repeat in 0..knobs.repeats {
        for &depth in &knobs.depths {
            let mut shapes = SHAPES;
            if repeat % 2 == 1 {
                shapes.reverse();
            }
            for locations in shapes {
                let conns = plan(&stockgate, db, locations, knobs.connections, per_conn, row);
                let run = measure(runtime, &stockgate, db, conns, locations, depth);
                eprintln!(
                    "run {repeat} {:<24} depth {depth:>2}: {:>8.0}/s  p50 {:>7.1} µs  p99 {:>7.1} µs  stockgate CPU {:.1} µs  Redis CPU {:.1} µs",
                    name(locations),
                    run.per_second,
                    run.p50_us,
                    run.p99_us,
                    run.stockgate_cpu_us,
                    run.redis_cpu_us,
                );
                runs.push(run);
                row += 1;
                fleet::check_alive("stockgate-allocation", &mut stockgate);
            }
        }
    }
    println!("{}", table(knobs, per_conn * knobs.connections, &runs));
}

/// `per_conn` deductions of qty 1 on each connection, fresh ids, skus
/// drawn by `row` alone (every shape of a row takes the same skus).
pub(crate) fn plan(
    stockgate: &Stockgate,
    db: &Db,
    locations: usize,
    conns: usize,
    per_conn: usize,
    row: u64,
) -> Vec<Conn> {
    let named: Vec<String> = (1..=locations).map(|w| format!("w{w}")).collect();
    (0..conns)
        .map(|c| {
            let mut rng = Rng::new(row.wrapping_mul(0x9E37) ^ ((c as u64) << 32));
            let mut requests = Encoded::default();
            for n in 0..per_conn {
                let id = format!("a{row}-{c}-{n}");
                let sku = db.skus[rng.below(db.skus.len())].0.as_bytes();
                if locations == 0 {
                    requests.push(&[b"DEDUCT", sku, b"1", id.as_bytes()]);
                } else {
                    let mut args: Vec<&[u8]> =
                        vec![b"DEDUCT.AT", sku, b"1", id.as_bytes(), b"SPLIT"];
                    args.extend(named.iter().map(|w| w.as_bytes()));
                    requests.push(&args);
                }
            }
            Conn {
                addr: stockgate.addr,
                requests,
            }
        })
        .collect()
}

fn measure(
    runtime: &tokio::runtime::Runtime,
    stockgate: &Stockgate,
    db: &mut Db,
    conns: Vec<Conn>,
    locations: usize,
    depth: usize,
) -> AllocationRun {
    measure_with(runtime, stockgate, db, conns, locations, depth, &mut || {})
}

/// [`measure`], calling `hook` where the load generator probes: once the
/// connections are open, and once every reply is in (the instructions
/// mode zeroes and dumps its counters there).
pub(crate) fn measure_with(
    runtime: &tokio::runtime::Runtime,
    stockgate: &Stockgate,
    db: &mut Db,
    conns: Vec<Conn>,
    locations: usize,
    depth: usize,
    hook: &mut dyn FnMut(),
) -> AllocationRun {
    let requests: u64 = conns.iter().map(|c| c.requests.len() as u64).sum();
    let pid = stockgate.pid();
    db.reset();
    if locations > 0 {
        db.locate(locations);
    }
    let (outcome, before, after) = runtime
        .block_on(loadgen::run_grouped(conns, depth, 1, || {
            hook();
            probe(Some(pid), db)
        }))
        .unwrap_or_else(|e| {
            panic!(
                "allocation, {}: the load generator failed: {e}",
                name(locations)
            )
        });
    assert!(
        outcome.errors == 0 && outcome.codes[0] == requests,
        "allocation, {}: expected {requests} code-0 replies, got codes {:?} and {} errors (first: {:?})",
        name(locations),
        outcome.codes,
        outcome.errors,
        outcome.first_error
    );
    let decrease = if locations == 0 {
        db.audit().stock_decrease
    } else {
        db.located_decrease(locations)
    };
    assert_eq!(
        decrease,
        requests,
        "allocation, {}: Redis took {decrease} units for {requests} replies of 0",
        name(locations)
    );
    let per = |seconds: f64| seconds * 1e6 / requests as f64;
    AllocationRun {
        locations,
        depth,
        per_second: requests as f64 / outcome.elapsed.as_secs_f64(),
        p50_us: outcome.latency.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: outcome.latency.value_at_quantile(0.99) as f64 / 1e3,
        stockgate_cpu_us: per(after.proxy.unwrap_or(0.0) - before.proxy.unwrap_or(0.0)),
        redis_cpu_us: per(after.redis - before.redis),
    }
}

fn table(knobs: &Knobs, requests: usize, runs: &[AllocationRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Allocation: DEDUCT.AT beside DEDUCT, through stockgate-cluster\n\n\
         {requests} deductions of qty 1 per row, {conns} connections, median of {repeats} runs; \
         CPU per request.\n\n\
         | depth | shape | requests/s | p50 µs | p99 µs | stockgate CPU µs | Redis CPU µs | requests/s vs DEDUCT |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|",
        conns = knobs.connections,
        repeats = knobs.repeats,
    );
    for &depth in &knobs.depths {
        let medians = |locations: usize| {
            let mine: Vec<&AllocationRun> = runs
                .iter()
                .filter(|r| r.locations == locations && r.depth == depth)
                .collect();
            let of = |f: &dyn Fn(&AllocationRun) -> f64| {
                crate::report::median(mine.iter().map(|r| f(r)).collect()).unwrap_or(f64::NAN)
            };
            [
                of(&|r| r.per_second),
                of(&|r| r.p50_us),
                of(&|r| r.p99_us),
                of(&|r| r.stockgate_cpu_us),
                of(&|r| r.redis_cpu_us),
            ]
        };
        let deduct = medians(0)[0];
        for locations in SHAPES {
            let m = medians(locations);
            let _ = writeln!(
                out,
                "| {depth} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.2}× |",
                name(locations),
                m[0],
                m[1],
                m[2],
                m[3],
                m[4],
                m[0] / deduct
            );
        }
    }
    out
}

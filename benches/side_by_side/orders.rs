//! Orders per second: one 3-line ORDER against the same work as three
//! DEDUCTs (issue 15), and ORDER.HOLD + ORDER.CONFIRM against the same
//! work as three HOLDs, then three CONFIRMs (issue 46), through
//! `stockgate-cluster`.
//!
//! ```sh
//! cargo bench --bench side_by_side -- orders
//! BENCH_ORDERS=2000 BENCH_REPEATS=1 cargo bench --bench side_by_side -- orders
//! ```
//!
//! Every order has three lines of qty 1, one sku from each primary's slots
//! (so its lines are on three different primaries), and a fresh id. Four
//! shapes of the same order, same connections and depth:
//!
//! - `ORDER`: `ORDER <id> <sku a> 1 <sku b> 1 <sku c> 1`, all or nothing,
//!   the saga in stockgate (begin, take every line, done: three script
//!   rounds, the lines of a round in parallel).
//! - `ORDER.HOLD + ORDER.CONFIRM`: the same lines held (ttl 600 s), then
//!   confirmed by an ORDER.CONFIRM that names them: both written at once,
//!   the connection running the CONFIRM after the HOLD answered (they
//!   touch the same order) and alongside the orders of other SKUs; the
//!   order done at the CONFIRM's reply.
//! - `3 × DEDUCT`: the caller's own saga without its compensation: three
//!   `DEDUCT <sku> 1 <id>-<k> <order_no>` written at once, pipelined on one
//!   connection (stockgate sends them to their primaries in parallel), the
//!   order done at the last of the three replies. Cheaper, and not the
//!   same guarantee: on a shortage or a crash between them, the caller
//!   has to find out what was applied and revert it.
//! - `3 × HOLD, then 3 × CONFIRM`: the checkout flow done by the caller
//!   line by line, the baseline of ORDER.HOLD + ORDER.CONFIRM: three
//!   `HOLD <sku> 1 <id>-<k> 600000 <order_no>` written at once, and once
//!   all three have answered, the three `CONFIRM <sku> <id>-<k>` written at
//!   once (a staged request, `loadgen::run_staged`); the order done at the
//!   last CONFIRM's reply. The same guarantee missing as for the DEDUCTs.
//!
//! `depth` is orders in flight per connection (so up to `3 × depth`
//! DEDUCTs, HOLDs or CONFIRMs). A row's latency is per order, from its
//! first write to its last reply; CPU is per order, stockgate's from
//! `/proc`, Redis's from `INFO cpu` summed over the primaries. After every
//! row the audit: every reply code 0 (every one counted, a HOLD's as a
//! CONFIRM's), and the stock decrease, summed over every sku, exactly 3 ×
//! the orders (each answered 0), with no unit left on hold (the SKUs'
//! `:held` counters all 0: every hold confirmed). Rows are interleaved
//! over `BENCH_REPEATS`, and the table shows the medians, with the ratios
//! ORDER / 3 × DEDUCT, ORDER.HOLD + ORDER.CONFIRM / 3 × DEDUCT and
//! ORDER.HOLD + ORDER.CONFIRM / 3 × HOLD + 3 × CONFIRM, then each ratio
//! against its targets (issues 25 and 46).
//!
//! `BENCH_ORDERS` (default the smaller of 20,000 and `BENCH_REQUESTS`)
//! orders per row; `BENCH_CONNECTIONS`, `BENCH_DEPTHS`, `BENCH_REPEATS`
//! and `BENCH_SKUS` as for the throughput rows.

use crate::Knobs;
use crate::db::Db;
use crate::fleet::{self, Fleet, Stockgate};
use crate::loadgen::{self, Conn, Encoded};
use crate::target::Rng;
use crate::throughput::probe;
use std::fmt::Write;

/// Lines per order in the `orders` mode (the `instructions` mode also
/// counts orders of other sizes).
pub const LINES: usize = 3;

/// How long the holds of an order last, ORDER.HOLD's and the caller's
/// own HOLDs alike: far longer than any row runs.
const HOLD_TTL_MS: &[u8] = b"600000";

/// The shapes of one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Order,
    /// ORDER.HOLD then ORDER.CONFIRM naming the same lines, written at
    /// once (the connection runs the CONFIRM after its ORDER.HOLD, and
    /// alongside the orders of other SKUs).
    HoldConfirm,
    Deducts,
    /// Three HOLDs written at once, then, once all three answered, their
    /// three CONFIRMs (a staged request, [`loadgen::run_staged`]).
    HoldsConfirms,
}

impl Shape {
    const ALL: [Shape; 4] = [
        Shape::Order,
        Shape::HoldConfirm,
        Shape::Deducts,
        Shape::HoldsConfirms,
    ];

    fn name(self) -> &'static str {
        match self {
            Shape::Order => "ORDER (3 lines)",
            Shape::HoldConfirm => "ORDER.HOLD + ORDER.CONFIRM",
            Shape::Deducts => "3 × DEDUCT, pipelined",
            Shape::HoldsConfirms => "3 × HOLD, then 3 × CONFIRM, pipelined",
        }
    }

    /// The shape as the baseline of a ratio.
    fn baseline_name(self) -> &'static str {
        match self {
            Shape::Deducts => "3 × DEDUCT",
            Shape::HoldsConfirms => "3 × HOLD + 3 × CONFIRM",
            other => other.name(),
        }
    }

    /// The shape in a file name.
    pub fn label(self) -> &'static str {
        match self {
            Shape::Order => "order",
            Shape::HoldConfirm => "hold-confirm",
            Shape::Deducts => "3-deducts",
            Shape::HoldsConfirms => "3-holds-3-confirms",
        }
    }

    /// Commands, hence replies, per order of `lines` lines.
    fn group(self, lines: usize) -> usize {
        match self {
            Shape::Order => 1,
            Shape::HoldConfirm => 2,
            Shape::Deducts => lines,
            Shape::HoldsConfirms => 2 * lines,
        }
    }
}

/// The ratios the table shows: an order shape over the caller's own
/// commands that do the same work.
const PAIRS: [(Shape, Shape); 3] = [
    (Shape::Order, Shape::Deducts),
    (Shape::HoldConfirm, Shape::Deducts),
    (Shape::HoldConfirm, Shape::HoldsConfirms),
];

/// One target: (the ratio's pair, what, column in the medians, the bound,
/// whether the ratio must stay at or below it, the depth it applies to,
/// every depth when `None`).
type Target = (
    (Shape, Shape),
    &'static str,
    usize,
    f64,
    bool,
    Option<usize>,
);

/// The targets: an ORDER against the three DEDUCTs it replaces (p50 at
/// depth 1 only: at depth 16 an order's rounds queue behind each other),
/// and ORDER.HOLD + ORDER.CONFIRM against the HOLDs and CONFIRMs it is
/// made of. ORDER.HOLD + ORDER.CONFIRM against three DEDUCTs is shown,
/// with no target: a HOLD and a CONFIRM each cost more than a DEDUCT.
const TARGETS: [Target; 8] = [
    (PAIRS[0], "Redis CPU per order", 4, 1.5, true, None),
    (PAIRS[0], "stockgate CPU per order", 3, 2.0, true, None),
    (PAIRS[0], "orders/s", 0, 0.6, false, None),
    (PAIRS[0], "p50", 1, 2.0, true, Some(1)),
    (PAIRS[2], "Redis CPU per order", 4, 1.4, true, None),
    (PAIRS[2], "stockgate CPU per order", 3, 2.0, true, None),
    (PAIRS[2], "orders/s", 0, 0.6, false, None),
    (PAIRS[2], "p50", 1, 2.0, true, None),
];

/// One measured row.
#[derive(Debug, Clone)]
pub struct OrdersRun {
    pub shape: Shape,
    pub depth: usize,
    pub orders: u64,
    pub seconds: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub stockgate_cpu_us: f64,
    pub redis_cpu_us: f64,
}

impl OrdersRun {
    fn per_second(&self) -> f64 {
        self.orders as f64 / self.seconds
    }
}

/// Orders per row: `BENCH_ORDERS`, else the smaller of 20,000 and
/// `BENCH_REQUESTS`.
fn orders_per_row(knobs: &Knobs) -> usize {
    match std::env::var("BENCH_ORDERS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("BENCH_ORDERS={v:?} is not a number")),
        Err(_) => knobs.requests.min(20_000),
    }
    .max(knobs.connections)
}

/// Runs the rows and prints the table.
pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) {
    let mut stockgate = fleet.start_stockgate(knobs, "stockgate-orders", true);
    let db = &mut fleet.cluster_db;
    let by_node = skus_by_node(db);
    let per_conn = orders_per_row(knobs).div_ceil(knobs.connections);
    let mut row = 0u64;
    // An unreported warm-up of each shape.
    for shape in Shape::ALL {
        let conns = plan(
            &stockgate,
            db,
            &by_node,
            shape,
            LINES,
            knobs.connections,
            (per_conn / 10).max(1),
            row,
        );
        measure(runtime, &stockgate, db, conns, shape, 16);
        row += 1;
    }
    let mut runs = Vec::new();
    for repeat in 0..knobs.repeats {
        for &depth in &knobs.depths {
            let mut shapes = Shape::ALL;
            if repeat % 2 == 1 {
                shapes.reverse();
            }
            for shape in shapes {
                let conns = plan(
                    &stockgate,
                    db,
                    &by_node,
                    shape,
                    LINES,
                    knobs.connections,
                    per_conn,
                    row,
                );
                let run = measure(runtime, &stockgate, db, conns, shape, depth);
                eprintln!(
                    "run {repeat} {:<22} depth {:>2}: {:>8.0} orders/s  p50 {:>7.1} µs  p99 {:>7.1} µs  stockgate CPU {:.1} µs/order  Redis CPU {:.1} µs/order",
                    shape.name(),
                    depth,
                    run.per_second(),
                    run.p50_us,
                    run.p99_us,
                    run.stockgate_cpu_us,
                    run.redis_cpu_us,
                );
                runs.push(run);
                row += 1;
                fleet::check_alive("stockgate-orders", &mut stockgate);
            }
        }
    }
    println!("{}", table(knobs, per_conn * knobs.connections, &runs));
    if let Some(log) = fleet::log_summary("stockgate-orders", &stockgate.log()) {
        println!("stockgate-orders logged (warnings and errors): {log}\n");
    }
}

/// The skus of each of the cluster's three primaries (indices into the
/// db's skus): an order's lines go round them.
pub fn skus_by_node(db: &Db) -> Vec<Vec<usize>> {
    let by_node: Vec<Vec<usize>> = (0..3)
        .map(|node| {
            (0..db.skus.len())
                .filter(|&s| db.skus[s].1 == node)
                .collect()
        })
        .collect();
    assert!(
        by_node.iter().all(|skus| !skus.is_empty()),
        "orders: every primary needs skus (raise BENCH_SKUS)"
    );
    by_node
}

/// The orders of one row: `per_conn` on each of `conns` connections, each
/// of `lines` lines of qty 1 on distinct skus, dealt to the primaries in
/// turn (see [`order_skus`]); ids `o<row>-<connection>-<n>` (DEDUCT `k` of one: `...-<n>-<k>`).
/// The choice of skus follows from `row` and `lines` alone, so every shape
/// of one `row` takes the same skus.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    stockgate: &Stockgate,
    db: &Db,
    by_node: &[Vec<usize>],
    shape: Shape,
    lines: usize,
    conns: usize,
    per_conn: usize,
    row: u64,
) -> Vec<Conn> {
    assert!(lines >= 1, "orders: an order of no line");
    assert!(
        by_node
            .iter()
            .all(|owned| owned.len() >= lines.div_ceil(by_node.len())),
        "orders: {lines} distinct skus per order need more skus per primary (raise BENCH_SKUS)"
    );
    (0..conns)
        .map(|c| {
            let mut rng = Rng::new(row.wrapping_mul(0x9E37) ^ ((c as u64) << 32));
            let mut requests = Encoded::default();
            for n in 0..per_conn {
                let id = format!("o{row}-{c}-{n}");
                let skus: Vec<&[u8]> = order_skus(by_node, n * lines, lines, &mut rng)
                    .into_iter()
                    .map(|s| db.skus[s].0.as_bytes())
                    .collect();
                let order_lines = || skus.iter().flat_map(|&sku| [sku, b"1"]);
                match shape {
                    Shape::Order => {
                        let order: Vec<&[u8]> = [&b"ORDER"[..], id.as_bytes()]
                            .into_iter()
                            .chain(order_lines())
                            .collect();
                        requests.push(&order);
                    }
                    Shape::HoldConfirm => {
                        let hold: Vec<&[u8]> = [&b"ORDER.HOLD"[..], id.as_bytes(), HOLD_TTL_MS]
                            .into_iter()
                            .chain(order_lines())
                            .collect();
                        // Naming its lines, as a pipelining client does: a
                        // bare ORDER.CONFIRM names no SKU, and waits for
                        // every request before it on the connection.
                        let confirm: Vec<&[u8]> = [&b"ORDER.CONFIRM"[..], id.as_bytes()]
                            .into_iter()
                            .chain(order_lines())
                            .collect();
                        requests.push_group(&[&hold, &confirm]);
                    }
                    Shape::Deducts => {
                        let order_no = format!("ORD-{c}-{n}");
                        let ids: Vec<String> = (0..lines).map(|k| format!("{id}-{k}")).collect();
                        let commands: Vec<[&[u8]; 5]> = (0..lines)
                            .map(|k| {
                                [
                                    &b"DEDUCT"[..],
                                    skus[k],
                                    b"1",
                                    ids[k].as_bytes(),
                                    order_no.as_bytes(),
                                ]
                            })
                            .collect();
                        let commands: Vec<&[&[u8]]> = commands.iter().map(|c| &c[..]).collect();
                        requests.push_group(&commands);
                    }
                    Shape::HoldsConfirms => {
                        let order_no = format!("ORD-{c}-{n}");
                        let ids: Vec<String> = (0..lines).map(|k| format!("{id}-{k}")).collect();
                        let holds: Vec<[&[u8]; 6]> = (0..lines)
                            .map(|k| {
                                [
                                    &b"HOLD"[..],
                                    skus[k],
                                    b"1",
                                    ids[k].as_bytes(),
                                    HOLD_TTL_MS,
                                    order_no.as_bytes(),
                                ]
                            })
                            .collect();
                        let confirms: Vec<[&[u8]; 3]> = (0..lines)
                            .map(|k| [&b"CONFIRM"[..], skus[k], ids[k].as_bytes()])
                            .collect();
                        let holds: Vec<&[&[u8]]> = holds.iter().map(|c| &c[..]).collect();
                        let confirms: Vec<&[&[u8]]> = confirms.iter().map(|c| &c[..]).collect();
                        requests.push_staged(&[&holds, &confirms]);
                    }
                }
            }
            Conn {
                addr: stockgate.addr,
                requests,
            }
        })
        .collect()
}

/// One order's skus (indices into the db's skus), its lines dealt to the
/// primaries in turn from the connection's `dealt` lines before it: line
/// `k` a random sku of primary `(dealt + k) mod 3` not already in the
/// order. So every primary takes its share of 1-line orders, and a 3-line
/// order is one draw per primary in the primaries' order.
fn order_skus(by_node: &[Vec<usize>], dealt: usize, lines: usize, rng: &mut Rng) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::with_capacity(lines);
    for k in 0..lines {
        let owned = &by_node[(dealt + k) % by_node.len()];
        loop {
            let sku = owned[rng.below(owned.len())];
            if !chosen.contains(&sku) {
                chosen.push(sku);
                break;
            }
        }
    }
    chosen
}

/// One row, from a fresh database, and its audit: a failed audit stops
/// the benchmark.
fn measure(
    runtime: &tokio::runtime::Runtime,
    stockgate: &Stockgate,
    db: &mut Db,
    conns: Vec<Conn>,
    shape: Shape,
    depth: usize,
) -> OrdersRun {
    measure_with(runtime, stockgate, db, conns, shape, LINES, depth, || {})
}

/// [`measure`] of orders of `lines` lines (as [`plan`] built them),
/// calling `at_probe` right before the load starts (with the connections
/// open) and right after its last reply.
#[allow(clippy::too_many_arguments)]
pub fn measure_with(
    runtime: &tokio::runtime::Runtime,
    stockgate: &Stockgate,
    db: &mut Db,
    conns: Vec<Conn>,
    shape: Shape,
    lines: usize,
    depth: usize,
    mut at_probe: impl FnMut(),
) -> OrdersRun {
    let orders: u64 = conns.iter().map(|c| c.requests.len() as u64).sum();
    let group = shape.group(lines);
    let replies = orders * group as u64;
    let pid = stockgate.pid();
    db.reset();
    let probed = || {
        at_probe();
        probe(Some(pid), db)
    };
    let (outcome, before, after) = runtime
        .block_on(async {
            match shape {
                Shape::HoldsConfirms => loadgen::run_staged(conns, depth, probed).await,
                _ => loadgen::run_grouped(conns, depth, group, probed).await,
            }
        })
        .unwrap_or_else(|e| panic!("orders, {}: the load generator failed: {e}", shape.name()));
    let name = shape.name();
    assert_eq!(outcome.replies(), replies, "{name}: replies counted");
    let mut problems = Vec::new();
    if outcome.errors != 0 || outcome.codes[0] != replies {
        problems.push(format!(
            "expected {replies} code-0 replies, got codes {:?} and {} errors (first: {:?})",
            outcome.codes, outcome.errors, outcome.first_error
        ));
    }
    // A held unit is out of the stock too: the decrease is deducted for
    // good only with nothing left on hold (every hold confirmed).
    let applied = db.audit();
    let decrease = applied.stock_decrease;
    let answered_orders = outcome.codes[0] / group as u64;
    if decrease != lines as u64 * answered_orders || applied.held != 0 {
        problems.push(format!(
            "the stock went down by {decrease} with {} units still on hold, for {answered_orders} orders of {lines} lines answered 0",
            applied.held
        ));
    }
    assert!(
        problems.is_empty(),
        "orders, {name}, {lines} lines, depth {depth}: {}",
        problems.join("; ")
    );
    let per = |seconds: f64| seconds * 1e6 / orders as f64;
    OrdersRun {
        shape,
        depth,
        orders,
        seconds: outcome.elapsed.as_secs_f64(),
        p50_us: outcome.latency.value_at_quantile(0.50) as f64 / 1e3,
        p99_us: outcome.latency.value_at_quantile(0.99) as f64 / 1e3,
        stockgate_cpu_us: per(after.proxy.unwrap_or(0.0) - before.proxy.unwrap_or(0.0)),
        redis_cpu_us: per(after.redis - before.redis),
    }
}

/// The medians per (shape, depth), and the ratios, as markdown.
fn table(knobs: &Knobs, orders: usize, runs: &[OrdersRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Orders: one 3-line ORDER against three DEDUCTs, ORDER.HOLD + ORDER.CONFIRM against \
         three HOLDs then three CONFIRMs, through stockgate-cluster\n\n\
         {orders} orders per row (3 lines of qty 1, each on its own primary, fresh ids), \
         {conns} connections, median of {repeats} runs. Latency and CPU per order.\n\n\
         | depth | shape | orders/s | p50 µs | p99 µs | stockgate CPU µs/order | Redis CPU µs/order |\n\
         |---:|---|---:|---:|---:|---:|---:|",
        conns = knobs.connections,
        repeats = knobs.repeats,
    );
    let mut ratio_rows = Vec::new();
    for &depth in &knobs.depths {
        let medians = |shape: Shape| {
            let mine: Vec<&OrdersRun> = runs
                .iter()
                .filter(|r| r.shape == shape && r.depth == depth)
                .collect();
            let of = |f: &dyn Fn(&OrdersRun) -> f64| {
                crate::report::median(mine.iter().map(|r| f(r)).collect()).unwrap_or(f64::NAN)
            };
            [
                of(&|r| r.per_second()),
                of(&|r| r.p50_us),
                of(&|r| r.p99_us),
                of(&|r| r.stockgate_cpu_us),
                of(&|r| r.redis_cpu_us),
            ]
        };
        for shape in Shape::ALL {
            let m = medians(shape);
            let _ = writeln!(
                out,
                "| {depth} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |",
                shape.name(),
                m[0],
                m[1],
                m[2],
                m[3],
                m[4]
            );
        }
        for pair @ (shape, baseline) in PAIRS {
            let r = ratios(&medians(shape), &medians(baseline));
            let _ = writeln!(
                out,
                "| {depth} | ratio {} | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {:.2}× |",
                ratio_name(pair),
                r[0],
                r[1],
                r[2],
                r[3],
                r[4]
            );
            ratio_rows.push((depth, pair, r));
        }
    }
    let _ = writeln!(
        out,
        "\n### Orders against their targets (ratios within this run)\n\n\
         | depth | shape | target | bound | ratio | met |\n|---:|---|---|---:|---:|---|"
    );
    for &(depth, pair, r) in &ratio_rows {
        for (of, what, column, bound, at_most, only) in TARGETS {
            if of != pair || only.is_some_and(|d| d != depth) {
                continue;
            }
            let ratio = r[column];
            let met = if at_most {
                ratio <= bound
            } else {
                ratio >= bound
            };
            let _ = writeln!(
                out,
                "| {depth} | {} | {what} | {}{bound:.1}× | {ratio:.2}× | {} |",
                ratio_name(pair),
                if at_most { "≤ " } else { "≥ " },
                if met { "yes" } else { "**no**" }
            );
        }
    }
    out
}

/// Each median of an order shape over its baseline's (`[orders/s, p50,
/// p99, stockgate CPU, Redis CPU]`).
fn ratios(order: &[f64; 5], baseline: &[f64; 5]) -> [f64; 5] {
    std::array::from_fn(|i| order[i] / baseline[i])
}

/// `<shape> / <baseline>`, as the table names a ratio.
fn ratio_name((shape, baseline): (Shape, Shape)) -> String {
    format!("{} / {}", shape.name(), baseline.baseline_name())
}

//! Instructions per request, counted by `valgrind --tool=callgrind`: the
//! noise-free figure. Times on these shared machines move by ±20% between
//! runs; an instruction count is the same whatever else the cores do, so a
//! change to the hot path is A/B'd by this number.
//!
//! ```sh
//! cargo bench --bench side_by_side -- instructions
//! BENCH_CALLGRIND_REQUESTS=20000 BENCH_DEPTHS=1,16 cargo bench --bench side_by_side -- instructions
//! BENCH_TARGETS=stockgate-standalone BENCH_DEPTHS=1 BENCH_CALLGRIND_KEEP=/tmp/cg \
//!     cargo bench --bench side_by_side -- instructions   # then callgrind_annotate /tmp/cg/<dump>
//! BENCH_TARGETS=stockgate-cluster cargo bench --bench side_by_side -- instructions   # with the ORDER rows
//! ```
//!
//! Each proxy (stockgate in front of the standalone Redis and in front of
//! the cluster, and twemproxy in front of the standalone Redis, the
//! baseline) runs under callgrind for the whole scenario. Per depth, with
//! the connections open and idle, its counters are zeroed
//! (`callgrind_control --zero`); the fixed load runs (the same requests as
//! the throughput rows: a DEDUCT, or for twemproxy the same EVALSHA, each
//! a fresh request_id); then the counters are dumped and their total is
//! divided by the requests. What the process does besides requests while
//! the load runs (stockgate's health checks, a timer) is counted too; at
//! these loads it is well under 1% of the total.
//!
//! The ORDER rows, on the same stockgate-cluster after its DEDUCT rows:
//! per depth, `BENCH_CALLGRIND_REQUESTS / 3` 3-line ORDERs (qty 1 on one
//! sku of each primary, a fresh id each, as the `orders` mode builds
//! them), counted the same way; then the same orders' lines as three
//! DEDUCTs written at once (the same skus, fresh ids), counted the same
//! way; each load audited as the `orders` mode audits it. `depth` is
//! orders in flight per connection. The ratio of the two counts is how
//! much more of stockgate an ORDER costs than the three DEDUCTs it
//! replaces. Then the checkout flow, the same way: the same orders as
//! ORDER.HOLD + ORDER.CONFIRM (written at once), against the same lines
//! as three HOLDs, then, once all three answered, their three CONFIRMs
//! (the `orders` mode's staged request; fresh ids), each load counted and
//! audited the same way, and their ratio.
//!
//! An ORDER by its number of lines, on a stockgate-cluster of its own
//! under callgrind after the ORDER rows: per depth, for 1, 3 and 10
//! lines, `BENCH_CALLGRIND_REQUESTS / 3` ORDERs (qty 1 on distinct skus,
//! the lines dealt to the primaries in turn, so a 3-line order is the
//! ORDER rows' shape and a 10-line one has three or four skus of each
//! primary; a fresh id each), then the same lines as that many DEDUCTs
//! written at once (fresh ids); each load counted and audited as the
//! ORDER rows are, and their ratio: what an order's own cost comes to as
//! its lines grow.

use crate::Knobs;
use crate::allocation;
use crate::fleet::{Fleet, Stockgate, Twemproxy, start_stockgate};
use crate::orders;
use crate::target::{Shape, Target, TargetId, plan};
use crate::throughput::{measure, measure_with};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the mode counted, for the report.
pub struct Counts {
    /// Per target and depth: a DEDUCT (twemproxy: its EVALSHA).
    pub requests: Vec<Count>,
    /// Per depth, through stockgate-cluster: an ORDER against three DEDUCTs.
    pub orders: Vec<OrderCount>,
    /// Per depth, through stockgate-cluster: a DEDUCT.AT over two
    /// locations against a DEDUCT.
    pub allocations: Vec<AllocationCount>,
    /// Per depth and number of lines, through stockgate-cluster: an ORDER
    /// against as many DEDUCTs as it has lines.
    pub order_lines: Vec<OrderLinesCount>,
}

/// The numbers of lines of the orders counted by [`count_order_lines`].
const ORDER_LINES: [usize; 3] = [1, 3, 10];

/// Two counted loads of the same orders of `lines` lines at one depth:
/// each an ORDER, then each as `lines` DEDUCTs written at once.
pub struct OrderLinesCount {
    pub depth: usize,
    pub lines: usize,
    pub orders: u64,
    /// Counted over the ORDERs.
    pub order: u64,
    /// Counted over the DEDUCTs, `lines` per order.
    pub deducts: u64,
}

impl OrderLinesCount {
    pub fn per_order(&self) -> f64 {
        self.order as f64 / self.orders as f64
    }

    pub fn per_deducts(&self) -> f64 {
        self.deducts as f64 / self.orders as f64
    }

    /// stockgate's instructions per ORDER over its lines' DEDUCTs'.
    pub fn ratio(&self) -> f64 {
        self.order as f64 / self.deducts as f64
    }
}

/// Two counted loads at one depth on one stockgate-cluster: DEDUCTs, then
/// the same skus kept by two locations, DEDUCT.ATs naming both.
pub struct AllocationCount {
    pub depth: usize,
    pub requests: u64,
    /// Counted over the DEDUCTs.
    pub deduct: u64,
    /// Counted over the DEDUCT.ATs.
    pub deduct_at: u64,
}

/// One counted load of single requests.
pub struct Count {
    pub target: TargetId,
    pub depth: usize,
    pub requests: u64,
    pub instructions: u64,
}

impl Count {
    pub fn per_request(&self) -> f64 {
        self.instructions as f64 / self.requests as f64
    }
}

/// Four counted loads of the same orders at one depth: each a 3-line
/// ORDER, then each as three DEDUCTs written at once; each an ORDER.HOLD
/// and its ORDER.CONFIRM, then each as three HOLDs and, once they
/// answered, their three CONFIRMs.
pub struct OrderCount {
    pub depth: usize,
    pub orders: u64,
    /// Counted over the ORDERs.
    pub order: u64,
    /// Counted over the DEDUCTs, three per order.
    pub deducts: u64,
    /// Counted over the ORDER.HOLDs and ORDER.CONFIRMs, one each per order.
    pub hold_confirm: u64,
    /// Counted over the HOLDs and CONFIRMs, three each per order.
    pub holds_confirms: u64,
}

impl OrderCount {
    fn per(&self, instructions: u64) -> f64 {
        instructions as f64 / self.orders as f64
    }

    pub fn per_order(&self) -> f64 {
        self.per(self.order)
    }

    pub fn per_three_deducts(&self) -> f64 {
        self.per(self.deducts)
    }

    /// stockgate's instructions per ORDER over three DEDUCTs'.
    pub fn ratio(&self) -> f64 {
        self.order as f64 / self.deducts as f64
    }

    /// stockgate's instructions per ORDER.HOLD + ORDER.CONFIRM over three
    /// HOLDs' and three CONFIRMs'.
    pub fn hold_ratio(&self) -> f64 {
        self.hold_confirm as f64 / self.holds_confirms as f64
    }
}

/// The callgrind command line a proxy runs under; its counters go to
/// `<dir>/<name>.callgrind`, and each dump to a numbered file beside it.
pub(crate) fn callgrind(dir: &Path, name: &str) -> Vec<String> {
    vec![
        "valgrind".into(),
        "--tool=callgrind".into(),
        "--quiet".into(),
        format!(
            "--callgrind-out-file={}",
            dir.join(format!("{name}.callgrind")).display()
        ),
    ]
}

pub(crate) fn control(args: &[&str], pid: u32) {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run callgrind_control ({e}): install valgrind (apt-get install valgrind)"
            )
        });
    assert!(
        out.status.success(),
        "callgrind_control {args:?} {pid}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The instructions counted since the last zeroing, from a fresh dump.
pub(crate) fn dump_total(dir: &Path, name: &str, pid: u32) -> u64 {
    let before = dumps(dir, name);
    control(&["--dump"], pid);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = dumps(dir, name);
        if let Some(new) = now.iter().find(|p| !before.contains(p)) {
            // The dump may still be being written; its summary line comes
            // near the top, its totals at the end.
            if let Some(total) = std::fs::read_to_string(new).ok().and_then(|t| total_of(&t)) {
                return total;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no callgrind dump of {name} appeared in {}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn dumps(dir: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}.callgrind");
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The `totals:` (or `summary:`) line of a callgrind profile: instructions.
fn total_of(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Runs `load` with the counters of `pid` zeroed at its first call of the
/// hook it is given (the connections open) and dumped at its second (every
/// reply in): what `load` returned, and the instructions counted between.
fn counted<T>(
    dir: &Path,
    name: &str,
    pid: u32,
    load: impl FnOnce(&mut dyn FnMut()) -> T,
) -> (T, u64) {
    let mut counted = None;
    let mut calls = 0;
    let out = load(&mut || {
        calls += 1;
        if calls == 1 {
            control(&["--zero"], pid);
        } else {
            counted = Some(dump_total(dir, name, pid));
        }
    });
    (out, counted.expect("the probe dumped the counters"))
}

/// `BENCH_CALLGRIND_KEEP=<dir>`: keeps each dump of `name` so far, prefixed
/// `label-`, for `callgrind_annotate <dir>/<file>` (where the instructions
/// go).
fn keep_dumps(dir: &Path, name: &str, label: &str) {
    if let Some(keep) = std::env::var_os("BENCH_CALLGRIND_KEEP") {
        let keep = PathBuf::from(keep);
        std::fs::create_dir_all(&keep).expect("BENCH_CALLGRIND_KEEP is a directory");
        for dump in dumps(dir, name) {
            let file = dump.file_name().expect("a file name");
            let kept = keep.join(format!("{label}-{}", file.to_string_lossy()));
            let _ = std::fs::copy(&dump, kept);
        }
    }
}

/// Runs the counted loads and returns them, for the report.
pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet) -> Counts {
    let requests: usize = std::env::var("BENCH_CALLGRIND_REQUESTS")
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .expect("BENCH_CALLGRIND_REQUESTS: a number")
        })
        .unwrap_or(20_000);
    let dir = fleet.dir.path().to_path_buf();
    let wanted = [
        TargetId::StockgateStandalone,
        TargetId::StockgateCluster,
        TargetId::TwemproxyStandalone,
    ];
    let mut counts = Counts {
        requests: Vec::new(),
        orders: Vec::new(),
        allocations: Vec::new(),
        order_lines: Vec::new(),
    };
    for id in wanted.into_iter().filter(|id| knobs.targets.contains(id)) {
        let name = format!("{}-callgrind", id.name());
        let wrap = callgrind(&dir, &name);
        let (addr, pid, stockgate, twemproxy) = match id {
            TargetId::TwemproxyStandalone => {
                let t = Twemproxy::start_wrapped(
                    &wrap,
                    &knobs.nutcracker_bin,
                    &name,
                    fleet.standalone.node.port,
                    &dir,
                );
                (t.addr, t.proc.pid, None, Some(t))
            }
            _ => {
                let on_cluster = id == TargetId::StockgateCluster;
                let (seeds, mode) = if on_cluster {
                    (fleet.cluster.seeds(), "cluster")
                } else {
                    (vec![fleet.standalone.url()], "standalone")
                };
                let s = start_stockgate(&wrap, &knobs.stockgate_bin, &name, &seeds, mode, &[]);
                (s.addr, s.pid(), Some(s), None)
            }
        };
        let target = Target {
            id,
            shape: match id {
                TargetId::TwemproxyStandalone => Shape::Evalsha,
                _ => Shape::Deduct,
            },
            routes: fleet.routes(id, Some(addr)),
            proxy: Some(pid),
        };
        // Warm up: connections, script caches, allocator pools, JIT-free
        // but cold code paths.
        let db = fleet.db(id);
        db.reset();
        let warm = plan(
            &target,
            db,
            knobs.connections,
            20,
            &format!("cgw-{name}"),
            7,
        );
        measure(runtime, &target, db, warm, 16).checked();
        for &depth in &knobs.depths {
            let db = fleet.db(id);
            db.reset();
            let per_conn = requests.div_ceil(knobs.connections);
            let conns = plan(
                &target,
                db,
                knobs.connections,
                per_conn,
                &format!("cg{depth}-{name}"),
                11,
            );
            let total: u64 = conns.iter().map(|c| c.requests.len() as u64).sum();
            // The load generator's probe runs once the connections are open
            // (zero the counters) and once every reply is in (dump them).
            let ((run, _), instructions) = counted(&dir, &name, pid, |hook| {
                measure_with(runtime, &target, fleet.db(id), conns, depth, hook).checked()
            });
            keep_dumps(&dir, &name, &format!("depth{depth}"));
            let count = Count {
                target: id,
                depth,
                requests: total,
                instructions,
            };
            eprintln!(
                "{:<22} depth {:>2}: {} requests, {:.0} instructions per request ({:.1} s under callgrind)",
                id.name(),
                depth,
                total,
                count.per_request(),
                run.seconds
            );
            counts.requests.push(count);
        }
        drop((stockgate, twemproxy));
    }
    if knobs.targets.contains(&TargetId::StockgateCluster) {
        counts.orders = count_orders(runtime, knobs, fleet, requests / 3);
        counts.allocations = count_allocations(runtime, knobs, fleet, requests);
        counts.order_lines = count_order_lines(runtime, knobs, fleet, requests / 3);
    }
    counts
}

/// The DEDUCT.AT rows: per depth, `requests` DEDUCTs of qty 1, then as
/// many DEDUCT.ATs over two locations (the first gives), on the same skus
/// kept by location, through a stockgate-cluster of their own under
/// callgrind; each load counted as the DEDUCT rows are and audited as the
/// allocation mode audits it.
fn count_allocations(
    runtime: &tokio::runtime::Runtime,
    knobs: &Knobs,
    fleet: &mut Fleet,
    requests: usize,
) -> Vec<AllocationCount> {
    let name = "stockgate-cluster-allocation-callgrind";
    let dir = fleet.dir.path().to_path_buf();
    let stockgate = start_stockgate(
        &callgrind(&dir, name),
        &knobs.stockgate_bin,
        name,
        &fleet.cluster.seeds(),
        "cluster",
        &[],
    );
    let pid = stockgate.pid();
    let db = &mut fleet.cluster_db;
    let per_conn = requests.div_ceil(knobs.connections);
    // Warm up both shapes.
    for (row, locations) in [(9500, 0), (9501, 2)] {
        let conns = allocation::plan(&stockgate, db, locations, knobs.connections, 10, row);
        allocation::measure_with(runtime, &stockgate, db, conns, locations, 16, &mut || {});
    }
    let mut counts = Vec::new();
    for &depth in &knobs.depths {
        let row = 9600 + depth as u64;
        let mut load = |locations: usize| {
            let conns =
                allocation::plan(&stockgate, db, locations, knobs.connections, per_conn, row);
            let total: u64 = conns.iter().map(|c| c.requests.len() as u64).sum();
            let (_, instructions) = counted(&dir, name, pid, |hook| {
                allocation::measure_with(runtime, &stockgate, db, conns, locations, depth, hook)
            });
            (total, instructions)
        };
        let (total, deduct) = load(0);
        let (_, deduct_at) = load(2);
        let count = AllocationCount {
            depth,
            requests: total,
            deduct,
            deduct_at,
        };
        eprintln!(
            "stockgate-cluster depth {depth:>2}: {:.0} instructions per DEDUCT, {:.0} per DEDUCT.AT over 2 locations",
            count.deduct as f64 / total as f64,
            count.deduct_at as f64 / total as f64,
        );
        counts.push(count);
    }
    counts
}

/// A stockgate-cluster under callgrind for counting orders, with
/// `--timeout 60s`: under callgrind, 16 ORDERs in flight on each
/// connection take longer than the default second to come to rest, and an
/// order past its deadline is answered UPSTREAM and left to recovery.
fn start_orders_stockgate(knobs: &Knobs, fleet: &Fleet, name: &str) -> Stockgate {
    start_stockgate(
        &callgrind(fleet.dir.path(), name),
        &knobs.stockgate_bin,
        name,
        &fleet.cluster.seeds(),
        "cluster",
        &["--timeout", "60s"],
    )
}

/// What the order rows share: a stockgate-cluster of their own under
/// callgrind ([`start_orders_stockgate`]), and which skus each primary
/// owns.
struct OrderLoads<'a> {
    runtime: &'a tokio::runtime::Runtime,
    stockgate: Stockgate,
    by_node: Vec<Vec<usize>>,
    dir: PathBuf,
    name: &'static str,
    connections: usize,
}

impl<'a> OrderLoads<'a> {
    fn start(
        runtime: &'a tokio::runtime::Runtime,
        knobs: &Knobs,
        fleet: &Fleet,
        name: &'static str,
    ) -> OrderLoads<'a> {
        OrderLoads {
            runtime,
            stockgate: start_orders_stockgate(knobs, fleet, name),
            by_node: orders::skus_by_node(&fleet.cluster_db),
            dir: fleet.dir.path().to_path_buf(),
            name,
            connections: knobs.connections,
        }
    }

    /// Ten orders of `shape` per connection at depth 16, not counted: the
    /// paths they take warm.
    fn warm(&self, db: &mut crate::db::Db, shape: orders::Shape, lines: usize, row: u64) {
        let conns = orders::plan(
            &self.stockgate,
            db,
            &self.by_node,
            shape,
            lines,
            self.connections,
            10,
            row,
        );
        orders::measure_with(
            self.runtime,
            &self.stockgate,
            db,
            conns,
            shape,
            lines,
            16,
            || {},
        );
    }

    /// `per_conn` orders of `shape` per connection at `depth`, counted as
    /// the DEDUCT rows are and audited as the orders mode audits them; the
    /// dumps kept under `label` (`BENCH_CALLGRIND_KEEP`).
    #[allow(clippy::too_many_arguments)]
    fn count(
        &self,
        db: &mut crate::db::Db,
        shape: orders::Shape,
        lines: usize,
        per_conn: usize,
        depth: usize,
        row: u64,
        label: &str,
    ) -> (orders::OrdersRun, u64) {
        let conns = orders::plan(
            &self.stockgate,
            db,
            &self.by_node,
            shape,
            lines,
            self.connections,
            per_conn,
            row,
        );
        let pid = self.stockgate.pid();
        let counted = counted(&self.dir, self.name, pid, |hook| {
            orders::measure_with(
                self.runtime,
                &self.stockgate,
                db,
                conns,
                shape,
                lines,
                depth,
                hook,
            )
        });
        keep_dumps(&self.dir, self.name, label);
        counted
    }
}

/// The ORDER rows: per depth, `orders` 3-line ORDERs (one sku of each
/// primary, as the orders mode builds them), then the same orders as
/// three DEDUCTs each, written at once (the same skus, fresh ids); then
/// the same orders as ORDER.HOLD + ORDER.CONFIRM, then as three HOLDs and
/// their three CONFIRMs; each load counted as the DEDUCT rows are and
/// audited as the orders mode audits it. They run on a stockgate-cluster
/// of their own ([`start_orders_stockgate`]).
fn count_orders(
    runtime: &tokio::runtime::Runtime,
    knobs: &Knobs,
    fleet: &mut Fleet,
    orders: usize,
) -> Vec<OrderCount> {
    let name = "stockgate-cluster-orders-callgrind";
    let loads = OrderLoads::start(runtime, knobs, fleet, name);
    let db = &mut fleet.cluster_db;
    let per_conn = orders.max(1).div_ceil(knobs.connections);
    // Warm up every shape: the intent calls and the order's paths are cold.
    for (row, shape) in [
        (9000, orders::Shape::Order),
        (9001, orders::Shape::Deducts),
        (9002, orders::Shape::HoldConfirm),
        (9003, orders::Shape::HoldsConfirms),
    ] {
        loads.warm(db, shape, orders::LINES, row);
    }
    let mut counts = Vec::new();
    for &depth in &knobs.depths {
        // One row number for every shape: the same skus for each order.
        let row = 9100 + depth as u64;
        let mut load = |shape: orders::Shape| {
            let label = format!("{}-depth{depth}", shape.label());
            loads.count(db, shape, orders::LINES, per_conn, depth, row, &label)
        };
        let (order_run, order) = load(orders::Shape::Order);
        let (deducts_run, deducts) = load(orders::Shape::Deducts);
        let (hold_confirm_run, hold_confirm) = load(orders::Shape::HoldConfirm);
        let (holds_confirms_run, holds_confirms) = load(orders::Shape::HoldsConfirms);
        let count = OrderCount {
            depth,
            orders: order_run.orders,
            order,
            deducts,
            hold_confirm,
            holds_confirms,
        };
        for run in [&deducts_run, &hold_confirm_run, &holds_confirms_run] {
            assert_eq!(order_run.orders, run.orders, "the same orders");
        }
        eprintln!(
            "stockgate-cluster      depth {:>2}: {} orders, {:.0} instructions per ORDER, {:.0} per 3 DEDUCTs, {:.2}x ({:.1} s and {:.1} s under callgrind)",
            depth,
            count.orders,
            count.per_order(),
            count.per_three_deducts(),
            count.ratio(),
            order_run.seconds,
            deducts_run.seconds,
        );
        eprintln!(
            "stockgate-cluster      depth {:>2}: {} orders, {:.0} instructions per ORDER.HOLD + ORDER.CONFIRM, {:.0} per 3 HOLDs + 3 CONFIRMs, {:.2}x ({:.1} s and {:.1} s under callgrind)",
            depth,
            count.orders,
            count.per(count.hold_confirm),
            count.per(count.holds_confirms),
            count.hold_ratio(),
            hold_confirm_run.seconds,
            holds_confirms_run.seconds,
        );
        counts.push(count);
    }
    counts
}

/// The rows of an ORDER by its number of lines: for each of
/// [`ORDER_LINES`], per depth, `orders` ORDERs of that many lines (qty 1 on
/// distinct skus dealt to the primaries in turn, as [`orders::plan`] builds
/// them), then the same orders' lines as DEDUCTs written at once (the same
/// skus, fresh ids); each load counted as the DEDUCT rows are and audited
/// as the orders mode audits it, on a stockgate-cluster of their own
/// ([`start_orders_stockgate`]) after a warm-up of every size.
fn count_order_lines(
    runtime: &tokio::runtime::Runtime,
    knobs: &Knobs,
    fleet: &mut Fleet,
    orders: usize,
) -> Vec<OrderLinesCount> {
    let name = "stockgate-cluster-order-lines-callgrind";
    let loads = OrderLoads::start(runtime, knobs, fleet, name);
    let db = &mut fleet.cluster_db;
    let per_conn = orders.max(1).div_ceil(knobs.connections);
    let shapes = [orders::Shape::Order, orders::Shape::Deducts];
    for lines in ORDER_LINES {
        for shape in shapes {
            loads.warm(db, shape, lines, 19_000 + lines as u64);
        }
    }
    let mut counts = Vec::new();
    for &depth in &knobs.depths {
        for lines in ORDER_LINES {
            // One row number for both shapes: the same skus for each order.
            let row = 20_000 + 100 * lines as u64 + depth as u64;
            let mut load = |shape: orders::Shape| {
                let label = format!("{}-{lines}-lines-depth{depth}", shape.label());
                loads.count(db, shape, lines, per_conn, depth, row, &label)
            };
            let (order_run, order) = load(orders::Shape::Order);
            let (deducts_run, deducts) = load(orders::Shape::Deducts);
            assert_eq!(order_run.orders, deducts_run.orders, "the same orders");
            let count = OrderLinesCount {
                depth,
                lines,
                orders: order_run.orders,
                order,
                deducts,
            };
            eprintln!(
                "stockgate-cluster      depth {:>2}: {} {lines}-line orders, {:.0} instructions per ORDER, {:.0} per {lines} DEDUCTs, {:.2}x ({:.1} s and {:.1} s under callgrind)",
                depth,
                count.orders,
                count.per_order(),
                count.per_deducts(),
                count.ratio(),
                order_run.seconds,
                deducts_run.seconds,
            );
            counts.push(count);
        }
    }
    counts
}

/// The instruction counts, and each stockgate's against twemproxy's at the
/// same depth (the baseline of the same run); then the ORDER rows, an
/// ORDER's against three DEDUCTs'.
pub fn render(counts: &Counts) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "Instructions per request (valgrind --tool=callgrind; the whole proxy process, zeroed with the connections open):\n\n\
         | target | depth | requests | instructions / request | vs twemproxy |\n|---|---:|---:|---:|---:|\n",
    );
    for count in &counts.requests {
        let baseline = counts
            .requests
            .iter()
            .find(|c| c.target == TargetId::TwemproxyStandalone && c.depth == count.depth);
        let ratio = baseline
            .filter(|b| b.target != count.target)
            .map_or("-".to_owned(), |b| {
                format!("{:.2}x", count.per_request() / b.per_request())
            });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} |",
            count.target.name(),
            count.depth,
            count.requests,
            count.per_request(),
            ratio
        );
    }
    if !counts.allocations.is_empty() {
        out.push_str(
            "\nInstructions per DEDUCT.AT (a stockgate-cluster of its own under callgrind, as \
             above): over two locations, the first giving the unit, against a DEDUCT of the same \
             skus:\n\n\
             | depth | requests | instructions / DEDUCT | instructions / DEDUCT.AT | DEDUCT.AT / DEDUCT |\n\
             |---:|---:|---:|---:|---:|\n",
        );
        for count in &counts.allocations {
            let per = |n: u64| n as f64 / count.requests as f64;
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {:.2}x |",
                count.depth,
                count.requests,
                per(count.deduct),
                per(count.deduct_at),
                count.deduct_at as f64 / count.deduct as f64
            );
        }
    }
    if !counts.orders.is_empty() {
        out.push_str(
            "\nInstructions per ORDER (stockgate-cluster under callgrind, as above): a 3-line ORDER \
             (one sku of each primary) against the same lines as three DEDUCTs written at once:\n\n\
             | depth | orders | instructions / ORDER | instructions / 3 DEDUCTs | ORDER / 3 DEDUCTs |\n\
             |---:|---:|---:|---:|---:|\n",
        );
        for count in &counts.orders {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {:.2}x |",
                count.depth,
                count.orders,
                count.per_order(),
                count.per_three_deducts(),
                count.ratio()
            );
        }
        out.push_str(
            "\nInstructions per ORDER.HOLD + ORDER.CONFIRM (the same stockgate-cluster, as above): \
             the same orders held, then confirmed (both written at once), against the same lines \
             as three HOLDs written at once and, once all three answered, their three CONFIRMs:\n\n\
             | depth | orders | instructions / ORDER.HOLD + ORDER.CONFIRM | instructions / 3 HOLDs + 3 CONFIRMs | ORDER.HOLD + ORDER.CONFIRM / (3 HOLDs + 3 CONFIRMs) |\n\
             |---:|---:|---:|---:|---:|\n",
        );
        for count in &counts.orders {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.0} | {:.2}x |",
                count.depth,
                count.orders,
                count.per(count.hold_confirm),
                count.per(count.holds_confirms),
                count.hold_ratio()
            );
        }
    }
    if !counts.order_lines.is_empty() {
        out.push_str(
            "\nInstructions per ORDER by its number of lines (a stockgate-cluster of its own under \
             callgrind, as above): an ORDER of 1, 3 or 10 lines (qty 1, distinct skus dealt to the \
             primaries in turn) against the same lines as that many DEDUCTs written at once:\n\n\
             | depth | lines | orders | instructions / ORDER | instructions / lines × DEDUCT | ORDER / lines × DEDUCT |\n\
             |---:|---:|---:|---:|---:|---:|\n",
        );
        for count in &counts.order_lines {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {:.0} | {:.2}x |",
                count.depth,
                count.lines,
                count.orders,
                count.per_order(),
                count.per_deducts(),
                count.ratio()
            );
        }
    }
    out
}

//! The markdown the benchmark prints: the machine, the table of medians,
//! the ratios and the instruction counts (the open-loop tables are
//! `latency.rs`'s own).

use crate::Knobs;
use crate::target::TargetId;
use std::fmt::Write;
use std::process::Command;

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

/// One line on the machine and one on the load, so a table is never read
/// without knowing where it came from.
pub fn machine(fd_limit: u64, knobs: &Knobs) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let version = |bin: &std::path::Path, arg: &str| {
        Command::new(bin)
            .arg(arg)
            .output()
            .map(|o| {
                let text = [o.stdout, o.stderr].concat();
                String::from_utf8_lossy(&text)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_else(|e| format!("not found ({e})"))
    };
    let loadavg = read("/proc/loadavg");
    let loadavg: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    format!(
        "**Machine:** nproc {nproc}, {cpu}, Linux {kernel}, load average {load} at start; \
         {redis}; {nutcracker}; stockgate `{bin}`; RLIMIT_NOFILE {fd_limit}.\n\n\
         **Load:** {conns} connections, depth {depths} (requests in flight per connection), \
         {requests} requests per run, {skus} skus, qty 1, fresh request_ids; \
         median of {repeats} runs per row.\n",
        kernel = read("/proc/sys/kernel/osrelease"),
        load = loadavg.join(" "),
        redis = version(std::path::Path::new("redis-server"), "--version"),
        nutcracker = version(&knobs.nutcracker_bin, "--version"),
        bin = knobs.stockgate_bin.display(),
        conns = knobs.connections,
        depths = knobs
            .depths
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        requests = knobs.requests,
        skus = knobs.skus,
        repeats = knobs.repeats,
    )
}

/// One line per run, on stderr, while the benchmark goes on.
pub fn progress(repeat: usize, run: &Run) -> String {
    format!(
        "run {repeat} {:<21} depth {:>2}: {:>8.0} req/s  p50 {:>7.1} µs  p99 {:>7.1} µs  proxy CPU {}  Redis CPU {:.1} µs/req",
        run.target.name(),
        run.depth,
        run.throughput(),
        run.p50_us,
        run.p99_us,
        run.proxy_cpu_us
            .map_or("-".into(), |v| format!("{v:.1} µs/req")),
        run.redis_cpu_us,
    )
}

pub fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// The medians of one (target, depth).
struct Row {
    throughput: f64,
    /// (max - min) / median throughput over the runs, in percent.
    spread: f64,
    p50: f64,
    p99: f64,
    proxy_cpu: Option<f64>,
    proxy_peak: Option<f64>,
    redis_cpu: f64,
    loadgen_cpu: f64,
}

fn row(runs: &[Run], target: TargetId, depth: usize) -> Option<Row> {
    let mine: Vec<&Run> = runs
        .iter()
        .filter(|r| r.target == target && r.depth == depth)
        .collect();
    let of = |f: &dyn Fn(&Run) -> f64| median(mine.iter().map(|r| f(r)).collect());
    let of_opt =
        |f: &dyn Fn(&Run) -> Option<f64>| median(mine.iter().filter_map(|r| f(r)).collect());
    let throughput = of(&|r| r.throughput())?;
    let (lo, hi) = mine
        .iter()
        .map(|r| r.throughput())
        .fold((f64::MAX, 0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    Some(Row {
        throughput,
        spread: (hi - lo) / throughput * 100.0,
        p50: of(&|r| r.p50_us)?,
        p99: of(&|r| r.p99_us)?,
        proxy_cpu: of_opt(&|r| r.proxy_cpu_us),
        proxy_peak: of_opt(&|r| r.proxy_peak_mib),
        redis_cpu: of(&|r| r.redis_cpu_us)?,
        loadgen_cpu: of(&|r| r.loadgen_cpu_us)?,
    })
}

/// The table of medians and the ratios, as markdown.
pub fn table(knobs: &Knobs, runs: &[Run]) -> String {
    let mut out = String::new();
    out.push_str(
        "| target | depth | req/s | spread | p50 µs | p99 µs | proxy CPU µs/req | proxy peak RSS MiB | Redis CPU µs/req | loadgen CPU µs/req |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let dash = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    for &depth in &knobs.depths {
        for &target in &knobs.targets {
            let Some(r) = row(runs, target, depth) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {depth} | {:.0} | {:.0}% | {:.0} | {:.0} | {} | {} | {:.1} | {:.1} |",
                target.name(),
                r.throughput,
                r.spread,
                r.p50,
                r.p99,
                dash(r.proxy_cpu, 1),
                dash(r.proxy_peak, 1),
                r.redis_cpu,
                r.loadgen_cpu,
            );
        }
    }
    out.push_str(
        "\nspread: (max - min) / median throughput over the runs. CPU: user + system time over the \
         measured interval / requests; Redis summed over its primaries.\n\n\
         | ratio (medians) | depth | throughput | p50 | Redis CPU |\n|---|---:|---:|---:|---:|\n",
    );
    let pairs = [
        (TargetId::StockgateCluster, TargetId::DirectCluster),
        (TargetId::StockgateStandalone, TargetId::DirectStandalone),
        (TargetId::StockgateStandalone, TargetId::TwemproxyStandalone),
        (TargetId::TwemproxyStandalone, TargetId::DirectStandalone),
        // What holds cost a DEDUCT on a SKU that has none.
        (TargetId::DirectStandalone, TargetId::DirectStandaloneV3),
    ];
    for &depth in &knobs.depths {
        for (a, b) in pairs {
            if let (Some(x), Some(y)) = (row(runs, a, depth), row(runs, b, depth)) {
                let _ = writeln!(
                    out,
                    "| {} / {} | {depth} | {:.2} | {:.2} | {:.2} |",
                    a.name(),
                    b.name(),
                    x.throughput / y.throughput,
                    x.p50 / y.p50,
                    x.redis_cpu / y.redis_cpu,
                );
            }
        }
    }
    out
}

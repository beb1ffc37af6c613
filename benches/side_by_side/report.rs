//! The markdown the benchmark prints: the machine, the table of medians,
//! the ratios, the open-loop latencies and what stockgate adds to them.

use crate::latency::LatencyRun;
use crate::{Knobs, Run, TargetId};
use std::fmt::Write;
use std::process::Command;

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

/// The instruction counts, and each stockgate's against twemproxy's at the
/// same depth (the baseline of the same run).
pub fn instructions(counts: &[crate::instructions::Count]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "Instructions per request (valgrind --tool=callgrind; the whole proxy process, zeroed with the connections open):\n\n\
         | target | depth | requests | instructions / request | vs twemproxy |\n|---|---:|---:|---:|---:|\n",
    );
    for count in counts {
        let baseline = counts
            .iter()
            .find(|c| c.target == crate::TargetId::TwemproxyStandalone && c.depth == count.depth);
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
    out
}

/// One line per open-loop run, on stderr, while the benchmark goes on.
pub fn latency_progress(round: usize, run: &LatencyRun) -> String {
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
pub fn latency(knobs: &Knobs, runs: &[LatencyRun]) -> String {
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
        crate::latency::LATE_LAG_P99_US,
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

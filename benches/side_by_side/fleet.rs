//! Everything the benchmark starts besides the load: the Redis servers
//! ([`Fleet`]), the proxies as separate processes ([`Proxies`], for the
//! throughput and latency rows), and what `/proc` says about a process's
//! CPU and memory.

use crate::Knobs;
use crate::db::{self, Db};
use crate::launch::Launch;
pub use crate::launch::Stockgate;
use crate::target::{Shape, Target, TargetId};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::dev::{LocalCluster, LocalRedis, RedisOptions};

// ---------------------------------------------------------------- the fleet

/// Everything the benchmark starts, stopped when dropped.
pub struct Fleet {
    pub cluster: LocalCluster,
    pub standalone: LocalRedis,
    pub cluster_db: Db,
    pub standalone_db: Db,
    pub dir: tempfile::TempDir,
}

impl Fleet {
    pub fn start(knobs: &Knobs) -> Fleet {
        // Clients come from many loopback addresses (see
        // `loadgen::connect_all`), which protected mode would refuse; the
        // servers still listen on 127.0.0.1 only. Room for the memory
        // scenarios' clients, plus the harness's own.
        let options = RedisOptions {
            extra_args: vec![
                "--protected-mode".into(),
                "no".into(),
                "--maxclients".into(),
                (knobs.many_clients.max(knobs.idle_clients) + 1000).to_string(),
            ],
            ..RedisOptions::default()
        };
        let cluster = LocalCluster::start(3, 0, &options)
            .unwrap_or_else(|e| panic!("cannot start the Redis Cluster: {e}"));
        let standalone = LocalRedis::start(&options)
            .unwrap_or_else(|e| panic!("cannot start the standalone Redis: {e}"));
        let primaries: Vec<u16> = cluster.nodes[..cluster.masters]
            .iter()
            .map(|n| n.port)
            .collect();
        let cluster_db = Db::new(&primaries, knobs.skus, db::slot_owner(&primaries));
        let standalone_db = Db::new(&[standalone.node.port], knobs.skus, |_| 0);
        let dir = tempfile::Builder::new()
            .prefix("stockgate-bench-")
            .tempdir()
            .expect("a temp dir");
        Fleet {
            cluster,
            standalone,
            cluster_db,
            standalone_db,
            dir,
        }
    }

    pub fn db(&mut self, id: TargetId) -> &mut Db {
        if id.on_cluster() {
            &mut self.cluster_db
        } else {
            &mut self.standalone_db
        }
    }

    pub fn start_stockgate(&self, knobs: &Knobs, name: &str, on_cluster: bool) -> Stockgate {
        let (seeds, mode) = if on_cluster {
            (self.cluster.seeds(), "cluster")
        } else {
            (vec![self.standalone.url()], "standalone")
        };
        start_stockgate(&[], &knobs.stockgate_bin, name, &seeds, mode, &[])
    }

    pub fn start_twemproxy(&self, knobs: &Knobs, name: &str) -> Twemproxy {
        Twemproxy::start(
            &knobs.nutcracker_bin,
            name,
            self.standalone.node.port,
            self.dir.path(),
        )
    }

    /// Where a target's connections go: one proxy address, or (direct to
    /// the cluster) one route per primary with the skus it owns.
    pub fn routes(&self, id: TargetId, proxy: Option<SocketAddr>) -> Vec<(SocketAddr, Vec<usize>)> {
        let db = if id.on_cluster() {
            &self.cluster_db
        } else {
            &self.standalone_db
        };
        let all: Vec<usize> = (0..db.skus.len()).collect();
        match (id, proxy) {
            (_, Some(addr)) => vec![(addr, all)],
            (TargetId::DirectCluster, None) => db
                .ports()
                .into_iter()
                .enumerate()
                .map(|(node, port)| {
                    let owned = all
                        .iter()
                        .copied()
                        .filter(|&s| db.skus[s].1 == node)
                        .collect();
                    (SocketAddr::from(([127, 0, 0, 1], port)), owned)
                })
                .collect(),
            (_, None) => vec![(SocketAddr::from(([127, 0, 0, 1], db.ports()[0])), all)],
        }
    }
}

/// The proxies of the wanted targets, as the throughput and latency rows
/// go through them; stopped when dropped.
pub struct Proxies {
    stockgate_cluster: Option<Stockgate>,
    stockgate_standalone: Option<Stockgate>,
    twemproxy: Option<Twemproxy>,
}

impl Proxies {
    pub fn start(knobs: &Knobs, fleet: &Fleet) -> Proxies {
        let wanted = |id: TargetId| knobs.targets.contains(&id);
        Proxies {
            stockgate_cluster: wanted(TargetId::StockgateCluster)
                .then(|| fleet.start_stockgate(knobs, "stockgate-cluster", true)),
            stockgate_standalone: wanted(TargetId::StockgateStandalone)
                .then(|| fleet.start_stockgate(knobs, "stockgate-standalone", false)),
            twemproxy: wanted(TargetId::TwemproxyStandalone)
                .then(|| fleet.start_twemproxy(knobs, "twemproxy-standalone")),
        }
    }

    /// Where a proxied target's clients connect, and the proxy's pid.
    fn proxy_of(&self, id: TargetId) -> Option<(SocketAddr, u32)> {
        match id {
            TargetId::StockgateCluster => {
                self.stockgate_cluster.as_ref().map(|s| (s.addr, s.pid()))
            }
            TargetId::StockgateStandalone => self
                .stockgate_standalone
                .as_ref()
                .map(|s| (s.addr, s.pid())),
            TargetId::TwemproxyStandalone => self.twemproxy.as_ref().map(|t| (t.addr, t.proc.pid)),
            _ => None,
        }
    }

    /// The wanted targets, in the order of `BENCH_TARGETS`.
    pub fn targets(&self, knobs: &Knobs, fleet: &Fleet) -> Vec<Target> {
        knobs
            .targets
            .iter()
            .map(|&id| {
                let proxy = self.proxy_of(id);
                Target {
                    id,
                    shape: match id {
                        TargetId::StockgateCluster | TargetId::StockgateStandalone => Shape::Deduct,
                        TargetId::DirectStandaloneV3 => Shape::EvalshaV3,
                        _ => Shape::Evalsha,
                    },
                    routes: fleet.routes(id, proxy.map(|p| p.0)),
                    proxy: proxy.map(|p| p.1),
                }
            })
            .collect()
    }

    fn stockgates(&mut self) -> impl Iterator<Item = (&'static str, &mut Stockgate)> {
        [
            ("stockgate-cluster", self.stockgate_cluster.as_mut()),
            ("stockgate-standalone", self.stockgate_standalone.as_mut()),
        ]
        .into_iter()
        .filter_map(|(name, gate)| Some((name, gate?)))
    }

    /// Fails loudly if a proxy has died.
    pub fn check_alive(&mut self) {
        self.stockgates()
            .for_each(|(name, gate)| check_alive(name, gate));
        if let Some(twemproxy) = &mut self.twemproxy {
            twemproxy.proc.check_alive();
        }
    }

    /// What the proxies logged (warnings and errors), as a markdown
    /// paragraph, or nothing when they logged nothing.
    pub fn logs(&mut self) -> String {
        let mut logs: Vec<String> = self
            .stockgates()
            .filter_map(|(name, gate)| log_summary(name, &gate.log()))
            .collect();
        logs.extend(self.twemproxy.as_ref().and_then(|t| t.proc.log_summary()));
        if logs.is_empty() {
            String::new()
        } else {
            let lines: Vec<String> = logs.iter().map(|line| format!("- {line}")).collect();
            format!(
                "Proxy logs (warnings and errors):\n\n{}\n",
                lines.join("\n")
            )
        }
    }
}

// ---------------------------------------------------------------- /proc

/// CPU time (user + system, all threads) a process has used, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/stat: {e}"));
    // Fields after the parenthesised command name, which may hold spaces:
    // state is field 3, utime 14 and stime 15.
    let after = &stat[stat.rfind(')').expect("stat has a comm field") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a constant.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// A process's resident memory now and its peak (since start or the last
/// [`reset_peak`]), in KiB.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss_kib: u64,
    pub peak_kib: u64,
}

pub fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/status: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    Memory {
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
    }
}

/// Resets VmHWM to the current RSS (`clear_refs` value 5, Linux 4.0+), so
/// each row reports its own peak. Needs to own the process or be root.
pub fn reset_peak(pid: u32) {
    if let Err(err) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        eprintln!("warning: cannot reset the peak RSS of pid {pid}: {err}; peaks are since start");
    }
}

/// Raises this process's open-file limit to its hard limit, so it (and
/// every proxy it starts, which inherit it) can hold 10,000 connections.
/// Returns the new limit.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            eprintln!("warning: cannot raise RLIMIT_NOFILE");
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

// ---------------------------------------------------------------- processes

/// A child process, killed when dropped, and killed by the kernel if this
/// process dies first.
pub struct Proc {
    pub name: String,
    pub pid: u32,
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> std::io::Result<Proc> {
        let out = std::fs::File::create(&log)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        Ok(Proc {
            name: name.to_owned(),
            pid: child.id(),
            log,
            child,
        })
    }

    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited with {status}; its log ({}):\n{}",
                self.name,
                self.log.display(),
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )),
            _ => None,
        }
    }

    /// What the process logged, summed up in one line ([`log_summary`]).
    pub fn log_summary(&self) -> Option<String> {
        log_summary(
            &self.name,
            &std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }

    /// Fails loudly if the process has died.
    pub fn check_alive(&mut self) {
        if let Some(why) = self.exited() {
            panic!("{why}");
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `bin`, or `wrap` running it.
fn wrapped(wrap: &[String], bin: &Path) -> Command {
    match wrap.split_first() {
        None => Command::new(bin),
        Some((first, rest)) => {
            let mut cmd = Command::new(first);
            cmd.args(rest).arg(bin);
            cmd
        }
    }
}

pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// Waits until `ok()` or the process exits; the error says which.
fn wait(proc: &mut Proc, within: Duration, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(why) = proc.exited() {
            return Err(why);
        }
        if ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{} not ready within {within:?}", proc.name))
}

/// What a process logged (stockgate runs at `warn`, nutcracker at `-v 4`,
/// warnings: so any line is worth reading), summed up in one line, or
/// `None` when the log is empty.
pub fn log_summary(name: &str, log: &str) -> Option<String> {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    let first = lines.first()?;
    let mut shown: String = first.chars().take(300).collect();
    if lines.len() > 1 {
        let last: String = lines[lines.len() - 1].chars().take(300).collect();
        shown = format!("{shown} ... last: {last}");
    }
    Some(format!("{name}: {} log lines; first: {shown}", lines.len()))
}

/// Fails loudly if the stockgate `name` has died.
pub fn check_alive(name: &str, gate: &mut Stockgate) {
    if let Some(status) = gate.exited() {
        panic!("{name} exited with {status}; its log:\n{}", gate.log());
    }
}

/// `stockgate serve --upstream <seeds> --upstream-mode <mode>` on free
/// ports, ready (`/readyz` 200) before this returns: `bin` under `wrap` (a
/// command and its arguments that run the binary, e.g. valgrind, with the
/// time a slow start needs), with `args` after every other flag
/// (`BENCH_STOCKGATE_ARGS` included), so they win.
pub fn start_stockgate(
    wrap: &[String],
    bin: &Path,
    name: &str,
    seeds: &[String],
    mode: &str,
    args: &[&str],
) -> Stockgate {
    let mut last = String::new();
    for _ in 0..5 {
        let mut launch = Launch::program(wrapped(wrap, bin), "serve");
        // Only the flags below configure it: no STOCKGATE_* from the
        // caller's environment.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("STOCKGATE_") {
                launch = launch.env_remove(key);
            }
        }
        launch = launch
            .env("STOCKGATE_LOG", "warn")
            .args(["--upstream", &seeds.join(",")])
            .args(["--upstream-mode", mode])
            .dies_with_thread()
            .ready_within(Duration::from_secs(if wrap.is_empty() { 20 } else { 120 }));
        // Extra flags to compare settings in one run, e.g.
        // BENCH_STOCKGATE_ARGS="--worker-threads 1".
        if let Ok(extra) = std::env::var("BENCH_STOCKGATE_ARGS") {
            launch = launch.args(extra.split_whitespace());
        }
        match launch.args(args).try_start() {
            Ok(gate) => return gate,
            Err(why) => last = why,
        }
    }
    panic!("{name} did not start: {last}");
}

/// twemproxy (nutcracker) in front of one Redis, as a plain Redis pool.
pub struct Twemproxy {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Twemproxy {
    pub fn start(bin: &Path, name: &str, redis_port: u16, dir: &Path) -> Twemproxy {
        Twemproxy::start_wrapped(&[], bin, name, redis_port, dir)
    }

    /// [`Twemproxy::start`] under `wrap`.
    pub fn start_wrapped(
        wrap: &[String],
        bin: &Path,
        name: &str,
        redis_port: u16,
        dir: &Path,
    ) -> Twemproxy {
        let mut last = String::new();
        for attempt in 0..5 {
            let (addr, stats) = (free_addr(), free_addr());
            let conf = dir.join(format!("{name}-{attempt}.yml"));
            // One server connection (nutcracker's default), as stockgate
            // multiplexes every client onto one connection per node; the
            // same 1 s timeout as stockgate's default `--timeout`.
            std::fs::write(
                &conf,
                format!(
                    "bench:\n  listen: {addr}\n  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n  \
                     timeout: 1000\n  preconnect: true\n  auto_eject_hosts: false\n  server_connections: 1\n  \
                     servers:\n   - 127.0.0.1:{redis_port}:1\n"
                ),
            )
            .expect("write the nutcracker config");
            let mut cmd = wrapped(wrap, bin);
            cmd.arg("--conf-file")
                .arg(&conf)
                .arg("--stats-addr")
                .arg("127.0.0.1")
                .arg("--stats-port")
                .arg(stats.port().to_string())
                .arg("--verbose")
                .arg("4");
            let log = dir.join(format!("{name}-{attempt}.log"));
            let mut proc = Proc::spawn(name, cmd, log).unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); install it with deploy/install-bench-deps.sh \
                     (Debian package nutcracker) or set NUTCRACKER_BIN",
                    bin.display()
                )
            });
            let within = Duration::from_secs(if wrap.is_empty() { 10 } else { 60 });
            match wait(&mut proc, within, || ping(addr)) {
                Ok(()) => return Twemproxy { proc, addr },
                Err(why) => last = why,
            }
        }
        panic!("{name} did not start: {last}");
    }
}

/// PING answered with PONG, on a fresh connection.
fn ping(addr: SocketAddr) -> bool {
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    conn.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
        && conn.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

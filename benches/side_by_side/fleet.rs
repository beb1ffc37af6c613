//! Everything the benchmark runs besides the load: the proxies as separate
//! processes, the Redis data each row starts from and is audited against,
//! and what `/proc` says about a process's CPU and memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::keys::{self, KeyLayout};
use stockgate::params::Sku;
use stockgate::script::{LuaScript, Scripts};

/// Stock every sku starts each row with: far more than any row deducts,
/// so every reply is code 0, and within Lua's exact integer range.
pub const START_STOCK: i64 = 1_000_000_000_000;

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

    /// What the process logged (stockgate runs at `warn`, nutcracker at
    /// `-v 4`, warnings: so any line is worth reading), summed up in one
    /// line, or `None` when the log is empty.
    pub fn log_summary(&self) -> Option<String> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        let first = lines.first()?;
        let mut shown: String = first.chars().take(300).collect();
        if lines.len() > 1 {
            let last: String = lines[lines.len() - 1].chars().take(300).collect();
            shown = format!("{shown} ... last: {last}");
        }
        Some(format!(
            "{}: {} log lines; first: {shown}",
            self.name,
            lines.len()
        ))
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

/// A stockgate release binary serving on loopback.
pub struct Stockgate {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

impl Stockgate {
    /// `stockgate serve --upstream <seeds> --upstream-mode <mode>` on free
    /// ports, ready (`/readyz` 200) before this returns.
    pub fn start(bin: &Path, name: &str, seeds: &[String], mode: &str, dir: &Path) -> Stockgate {
        Stockgate::start_wrapped(&[], bin, name, seeds, mode, dir)
    }

    /// [`Stockgate::start`] under `wrap` (a command and its arguments that
    /// run the binary, e.g. valgrind), with the time a slow start needs.
    pub fn start_wrapped(
        wrap: &[String],
        bin: &Path,
        name: &str,
        seeds: &[String],
        mode: &str,
        dir: &Path,
    ) -> Stockgate {
        Stockgate::start_with(wrap, bin, name, seeds, mode, dir, &[])
    }

    /// [`Stockgate::start_wrapped`] with `args` after every other flag
    /// (`BENCH_STOCKGATE_ARGS` included), so they win.
    pub fn start_with(
        wrap: &[String],
        bin: &Path,
        name: &str,
        seeds: &[String],
        mode: &str,
        dir: &Path,
        args: &[&str],
    ) -> Stockgate {
        let mut last = String::new();
        for attempt in 0..5 {
            let (addr, admin) = (free_addr(), free_addr());
            let mut cmd = wrapped(wrap, bin);
            // Only the flags below configure it: no STOCKGATE_* from the
            // caller's environment.
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("STOCKGATE_") {
                    cmd.env_remove(key);
                }
            }
            cmd.env("STOCKGATE_LOG", "warn")
                .arg("serve")
                .arg("--upstream")
                .arg(seeds.join(","))
                .arg("--upstream-mode")
                .arg(mode)
                .arg("--listen")
                .arg(addr.to_string())
                .arg("--admin-listen")
                .arg(admin.to_string());
            // Extra flags to compare settings in one run, e.g.
            // BENCH_STOCKGATE_ARGS="--worker-threads 1".
            if let Ok(extra) = std::env::var("BENCH_STOCKGATE_ARGS") {
                cmd.args(extra.split_whitespace());
            }
            cmd.args(args);
            let log = dir.join(format!("{name}-{attempt}.log"));
            let mut proc = Proc::spawn(name, cmd, log)
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
            let within = Duration::from_secs(if wrap.is_empty() { 20 } else { 120 });
            match wait(&mut proc, within, || {
                http_get(admin, "/readyz").is_ok_and(|(status, _)| status == 200)
            }) {
                Ok(()) => return Stockgate { proc, addr, admin },
                Err(why) => last = why,
            }
        }
        panic!("{name} did not start: {last}");
    }

    /// The value of the `/metrics` line that starts with `series ` (a
    /// name with its labels), or `None` when there is none.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = http_get(self.admin, "/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
    }

    /// `stockgate_client_connections` from `/metrics`.
    pub fn client_connections(&self) -> Option<u64> {
        let (_, body) = http_get(self.admin, "/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix("stockgate_client_connections "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    }
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

/// A minimal HTTP/1.1 GET: status and body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

// ---------------------------------------------------------------- Redis data

/// The Redis servers one target writes to (a cluster's primaries, or one
/// standalone), the skus seeded on each, and the audit after a row.
pub struct Db {
    nodes: Vec<Node>,
    /// Every sku's name and the index of the node that owns its slot.
    pub skus: Vec<(String, usize)>,
    layout: KeyLayout,
    script: std::sync::Arc<LuaScript>,
    /// The DEDUCT script of script version 3, for `direct-standalone-v3`.
    v3: LuaScript,
}

struct Node {
    port: u16,
    conn: redis::Connection,
}

/// What a row actually changed in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Idempotency records created (keys beyond the seeded stock keys).
    pub records: u64,
    /// Total stock decrease over every sku.
    pub stock_decrease: u64,
}

impl Db {
    /// `ports` are the primaries (one for a standalone Redis); a sku goes to
    /// the primary `owner(slot)` names.
    pub fn new(ports: &[u16], sku_count: usize, owner: impl Fn(u16) -> usize) -> Db {
        let layout = KeyLayout::new("stock").expect("stockgate's default prefix");
        let nodes = ports
            .iter()
            .map(|&port| Node {
                port,
                conn: connect(port),
            })
            .collect();
        let skus = (0..sku_count)
            .map(|i| {
                let sku = format!("sku-{i:05}");
                let slot = keys::slot(&layout.stock_key(&Sku::parse(sku.clone().into()).unwrap()));
                (sku, owner(slot))
            })
            .collect();
        Db {
            nodes,
            skus,
            layout,
            script: Scripts::new().deduct,
            v3: {
                let body = include_str!("../../tests/compat/v3/deduct.lua").replacen(
                    "--@common\n",
                    include_str!("../../tests/compat/v3/common.lua"),
                    1,
                );
                LuaScript::from_body("deduct-v3", body, true)
            },
        }
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    pub fn sha(&self) -> &str {
        &self.script.sha
    }

    pub fn v3_sha(&self) -> &str {
        &self.v3.sha
    }

    /// Empties every node, loads the script, and seeds every sku with
    /// [`START_STOCK`]: each row starts from the same state.
    pub fn reset(&mut self) {
        for (index, node) in self.nodes.iter_mut().enumerate() {
            redis::cmd("FLUSHALL")
                .arg("SYNC")
                .query::<()>(&mut node.conn)
                .unwrap_or_else(|e| panic!("FLUSHALL on {}: {e}", node.port));
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&self.script.body)
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("SCRIPT LOAD on {}: {e}", node.port));
            assert_eq!(sha, self.script.sha, "the script's SHA1");
            let v3: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(&self.v3.body)
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("SCRIPT LOAD on {}: {e}", node.port));
            assert_eq!(v3, self.v3.sha, "the version 3 script's SHA1");
            let mut pipe = redis::pipe();
            for (sku, _) in self.skus.iter().filter(|(_, n)| *n == index) {
                pipe.set(stock_key(&self.layout, sku), START_STOCK).ignore();
            }
            pipe.query::<()>(&mut node.conn)
                .unwrap_or_else(|e| panic!("seeding on {}: {e}", node.port));
        }
    }

    /// Counts what the row changed, from Redis itself.
    pub fn audit(&mut self) -> Applied {
        let mut applied = Applied {
            records: 0,
            stock_decrease: 0,
        };
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let skus: Vec<&String> = self
                .skus
                .iter()
                .filter(|(_, n)| *n == index)
                .map(|(s, _)| s)
                .collect();
            let keys: u64 = redis::cmd("DBSIZE")
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("DBSIZE on {}: {e}", node.port));
            // The sweep leader's lease and active list (a stockgate in front
            // of this node writes them even when no hold is placed) are not
            // records. A primary that doesn't own their slot answers MOVED:
            // they are not there.
            let sweeper: u64 = match redis::cmd("EXISTS")
                .arg(self.layout.sweep_lease())
                .arg(self.layout.sweep_active())
                .query(&mut node.conn)
            {
                Ok(n) => n,
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => 0,
                Err(e) => panic!("EXISTS on {}: {e}", node.port),
            };
            applied.records += keys - sweeper - skus.len() as u64;
            let mut pipe = redis::pipe();
            for sku in &skus {
                pipe.get(stock_key(&self.layout, sku));
            }
            let stocks: Vec<i64> = pipe
                .query(&mut node.conn)
                .unwrap_or_else(|e| panic!("reading stock on {}: {e}", node.port));
            applied.stock_decrease += stocks.iter().map(|s| (START_STOCK - s) as u64).sum::<u64>();
        }
        applied
    }

    /// CPU seconds every node has used (`INFO cpu`: the whole process,
    /// microsecond resolution).
    pub fn cpu_seconds(&mut self) -> f64 {
        self.nodes
            .iter_mut()
            .map(|node| {
                let info: String = redis::cmd("INFO")
                    .arg("cpu")
                    .query(&mut node.conn)
                    .unwrap_or_else(|e| panic!("INFO cpu on {}: {e}", node.port));
                ["used_cpu_sys:", "used_cpu_user:"]
                    .iter()
                    .map(|field| {
                        info.lines()
                            .find_map(|l| l.strip_prefix(field))
                            .and_then(|v| v.trim().parse::<f64>().ok())
                            .unwrap_or(0.0)
                    })
                    .sum::<f64>()
            })
            .sum()
    }
}

pub fn stock_key(layout: &KeyLayout, sku: &str) -> Vec<u8> {
    layout.stock_key(&Sku::parse(sku.to_owned().into()).expect("valid sku"))
}

/// A plain connection to one Redis on loopback, with a generous read
/// timeout.
pub fn connect(port: u16) -> redis::Connection {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a valid URL");
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("cannot connect to redis on {port}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set a timeout");
    conn
}

/// The cluster's slot ranges and the primary (by index into `ports`) that
/// serves each, from `CLUSTER SLOTS`.
pub fn slot_owner(ports: &[u16]) -> impl Fn(u16) -> usize + use<> {
    let mut conn = connect(ports[0]);
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .expect("CLUSTER SLOTS");
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => *i,
        other => panic!("CLUSTER SLOTS: expected an integer, got {other:?}"),
    };
    // Each range: [first, last, [ip, port, id, ...] (the primary), replicas...].
    let ranges: Vec<(u16, u16, u16)> = slots
        .iter()
        .map(|range| {
            let redis::Value::Array(items) = range else {
                panic!("CLUSTER SLOTS: a range is not an array: {range:?}");
            };
            let redis::Value::Array(primary) = &items[2] else {
                panic!("CLUSTER SLOTS: no primary in {range:?}");
            };
            (
                int(&items[0]) as u16,
                int(&items[1]) as u16,
                int(&primary[1]) as u16,
            )
        })
        .collect();
    let ports = ports.to_vec();
    move |slot| {
        let (_, _, port) = ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} is not served"));
        ports
            .iter()
            .position(|p| p == port)
            .unwrap_or_else(|| panic!("slot {slot} is served by unknown port {port}"))
    }
}

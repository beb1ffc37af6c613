//! stockgate as its own process: the built binary on free loopback ports,
//! its stderr collected all along (a pipe nobody reads fills at 64 KiB,
//! and then the log writer can only drop lines) and printed if the test
//! fails, killed when dropped. The one way the tests, and the
//! side-by-side bench (which includes this file), start it.
//!
//! ```ignore
//! let gate = Launch::serve(&cluster.seeds()).args(["--max-clients", "8"]).start();
//! redis_cli(gate.addr.port(), &["PING"]);
//! let (status, log) = gate.stop();
//! ```

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The stockgate binary cargo built for these tests (or this bench).
pub fn stockgate_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_stockgate"))
}

/// How a [`Stockgate`] is started.
pub struct Launch {
    command: Command,
    /// The program and subcommand, for messages (the arguments and
    /// environment may hold a password).
    what: String,
    addr: SocketAddr,
    admin: SocketAddr,
    ports_in_env: bool,
    ready_within: Option<Duration>,
    printed: bool,
}

impl Launch {
    /// `stockgate serve` in front of `seeds`.
    pub fn serve(seeds: &[String]) -> Launch {
        Launch::new("serve").args(["--upstream", &seeds.join(",")])
    }

    /// `stockgate <subcommand>` with nothing more than its ports: the
    /// caller adds the rest (its upstream too, by flag or environment).
    pub fn new(subcommand: &str) -> Launch {
        Launch::program(Command::new(stockgate_bin()), subcommand)
    }

    /// [`Launch::new`] run by `program`: another build of stockgate, or a
    /// wrapper (valgrind) with the binary as its last argument.
    pub fn program(mut program: Command, subcommand: &str) -> Launch {
        let what = format!("{} {subcommand}", program.get_program().to_string_lossy());
        program
            .arg(subcommand)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Launch {
            command: program,
            what,
            addr: ([127, 0, 0, 1], super::free_port()).into(),
            admin: ([127, 0, 0, 1], super::free_port()).into(),
            ports_in_env: false,
            ready_within: Some(Duration::from_secs(20)),
            printed: false,
        }
    }

    /// Listens for clients on `addr` (a fixed port, to start again there).
    pub fn listen(mut self, addr: SocketAddr) -> Launch {
        self.addr = addr;
        self
    }

    /// Serves /metrics, /healthz and /readyz on `addr`.
    pub fn admin_listen(mut self, addr: SocketAddr) -> Launch {
        self.admin = addr;
        self
    }

    /// Names the ports in STOCKGATE_LISTEN and STOCKGATE_ADMIN_LISTEN, as
    /// an operator's environment does, instead of by flag.
    pub fn ports_in_env(mut self) -> Launch {
        self.ports_in_env = true;
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Launch {
        self.command.arg(arg);
        self
    }

    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Launch {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Launch {
        self.command.env(key, value);
        self
    }

    pub fn envs<K: AsRef<OsStr>, V: AsRef<OsStr>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Launch {
        self.command.envs(vars);
        self
    }

    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Launch {
        self.command.env_remove(key);
        self
    }

    /// Starts it with no variable of this process's environment.
    pub fn env_clear(mut self) -> Launch {
        self.command.env_clear();
        self
    }

    /// Makes the kernel kill it (SIGKILL) when the thread that starts it
    /// ends, even without Drop (a test process killed), as the dev Redis
    /// servers are. Only for a thread that lives as long as the test: a
    /// pool's thread that ends when idle would take stockgate with it.
    pub fn dies_with_thread(mut self) -> Launch {
        // SAFETY: prctl is async-signal-safe; nothing else runs in pre_exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut self.command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self
    }

    /// How long [`Launch::start`] waits for /readyz (20 s unless told).
    pub fn ready_within(mut self, within: Duration) -> Launch {
        self.ready_within = Some(within);
        self
    }

    /// Collects what it prints on stdout too ([`Stockgate::printed`]).
    pub fn printed(mut self) -> Launch {
        self.printed = true;
        self.command.stdout(Stdio::piped());
        self
    }

    /// Returns once the process runs, without waiting for /readyz.
    pub fn unready(mut self) -> Launch {
        self.ready_within = None;
        self
    }

    /// Starts it; unless [`Launch::unready`], waits until /readyz says
    /// Redis is reachable and the scripts are loaded. Fails the test if it
    /// exits or is not ready in time, with its log.
    pub fn start(self) -> Stockgate {
        self.try_start().unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`Launch::start`], for a caller that tries again (on other ports).
    pub fn try_start(mut self) -> Result<Stockgate, String> {
        let (addr, admin) = (self.addr.to_string(), self.admin.to_string());
        if self.ports_in_env {
            self.command
                .env("STOCKGATE_LISTEN", addr)
                .env("STOCKGATE_ADMIN_LISTEN", admin);
        } else {
            self.command
                .args(["--listen", &addr])
                .args(["--admin-listen", &admin]);
        }
        let what = self.what;
        let mut child = self
            .command
            .spawn()
            .map_err(|e| format!("cannot run {what}: {e}"))?;
        let log = Collected::from(child.stderr.take().expect("stderr is piped"));
        let printed = self
            .printed
            .then(|| Collected::from(child.stdout.take().expect("stdout is piped")));
        let mut gate = Stockgate {
            child,
            addr: self.addr,
            admin: self.admin,
            log,
            printed,
        };
        let Some(within) = self.ready_within else {
            return Ok(gate);
        };
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = gate.exited() {
                return Err(format!(
                    "{what} exited with {status}; its log:\n{}",
                    gate.wait().1
                ));
            }
            if http_get(gate.admin.port(), "/readyz").is_ok_and(|(status, _)| status == 200) {
                return Ok(gate);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{what} was not ready within {within:?}; its log:\n{}",
                    gate.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A running stockgate.
pub struct Stockgate {
    child: Child,
    /// Where clients connect (RESP).
    pub addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served.
    pub admin: SocketAddr,
    log: Collected,
    printed: Option<Collected>,
}

impl Stockgate {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (libc's number) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill takes no pointers.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// The value of one series of its /metrics (`series` as the
    /// Prometheus text spells it, labels included), if it answers.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = http_get(self.admin.port(), "/metrics").ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// One `<field>: <n> kB` line of /proc/<pid>/status (VmRSS, VmSize,
    /// VmHWM), in KiB.
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("reads /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    /// How many file descriptors it has open now.
    pub fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("reads /proc/<pid>/fd")
            .count()
    }

    /// Its TCP sockets now, as the kernel lists them.
    ///
    /// The kernel writes /proc/net/tcp a page at a time, so a read while
    /// other processes open and close sockets can list one socket twice,
    /// or miss one: each socket is kept once (by its inode), and the list
    /// is read until two reads in a row agree.
    pub fn sockets(&self) -> Vec<Socket> {
        let mut last = self.sockets_once();
        for _ in 0..20 {
            let now = self.sockets_once();
            if now == last {
                break;
            }
            last = now;
        }
        last.into_values().collect()
    }

    /// One read of its sockets, by inode.
    fn sockets_once(&self) -> std::collections::BTreeMap<String, Socket> {
        let mut inodes = std::collections::HashSet::new();
        for fd in
            std::fs::read_dir(format!("/proc/{}/fd", self.pid())).expect("reads /proc/<pid>/fd")
        {
            let Ok(fd) = fd else {
                continue;
            };
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|t| t.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
        let mut sockets = std::collections::BTreeMap::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.len() > 9 && inodes.contains(fields[9]) {
                    sockets.insert(
                        fields[9].to_owned(),
                        Socket {
                            local: kernel_address(fields[1]),
                            remote: kernel_address(fields[2]),
                            listening: fields[3] == "0A",
                        },
                    );
                }
            }
        }
        sockets
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// What it has printed on stdout so far ([`Launch::printed`]).
    pub fn printed(&self) -> String {
        self.printed.as_ref().expect("Launch::printed").text()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waits for stockgate")
    }

    /// SIGTERM (the graceful drain), then its exit status and everything
    /// it logged.
    pub fn stop(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    /// SIGKILL (a crash: no drain, nothing said to anyone), then its exit
    /// status and everything it logged.
    pub fn kill(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGKILL);
        self.wait()
    }

    /// Waits for it to exit by itself: its status and everything logged.
    pub fn wait(&mut self) -> (ExitStatus, String) {
        let status = self.child.wait().expect("waits for stockgate");
        self.log.finish();
        (status, self.log())
    }
}

impl Drop for Stockgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            self.log.finish();
            eprintln!("stockgate (pid {}) logged:\n{}", self.pid(), self.log());
        }
    }
}

/// A pipe read to its end by a thread of its own (bytes, so a character
/// cut between two reads is whole again).
struct Collected {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Collected {
    fn from(mut pipe: impl Read + Send + 'static) -> Collected {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    bytes.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            })
        };
        Collected {
            bytes,
            reader: Some(reader),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().unwrap()).into_owned()
    }

    /// Waits for the end of the pipe (the process has exited).
    fn finish(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// `GET path` on 127.0.0.1:`port`: the status and the body. HTTP/1.0, so
/// no server answers with a chunked body.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP head in {response:?}")))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, body.to_owned()))
}

/// One TCP socket of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub listening: bool,
}

/// An address as /proc/net/tcp{,6} writes it: the address's 32-bit words in
/// the machine's byte order, then the port, in hex.
fn kernel_address(text: &str) -> SocketAddr {
    let (ip, port) = text.split_once(':').expect("address:port");
    let port = u16::from_str_radix(port, 16).expect("a hex port");
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).expect("hex words"))
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).unwrap().into(),
        _ => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap());
            v6.to_ipv4_mapped().map_or(v6.into(), Into::into)
        }
    };
    SocketAddr::new(ip, port)
}

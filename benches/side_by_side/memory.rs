//! Memory scenarios: a proxy's RSS with many idle clients, with 10,000
//! concurrent clients, and after they all leave.
//!
//! Each proxy is started fresh, then:
//!
//! 1. idle after start (ready, no client yet);
//! 2. warm: `BENCH_CONNECTIONS` clients, depth 1, `BENCH_REQUESTS / 10`
//!    DEDUCTs, then they leave: the baseline (allocator pools warm);
//! 3. `BENCH_IDLE_CLIENTS` clients connected, of which `BENCH_CONNECTIONS`
//!    send DEDUCTs at depth 1: RSS with all connected, and the peak. Each
//!    idle client first does what a real client library does on connect
//!    ([`Handshake::Identify`]: HELLO 3, CLIENT SETINFO LIB-NAME and
//!    LIB-VER, as redis-py 5+, go-redis 9, Lettuce 6.3+ and node-redis do,
//!    and CLIENT SETNAME), then PING; `BENCH_IDLE_HANDSHAKE=ping` sends the
//!    PING alone. What a client sent decides what the proxy keeps for it:
//!    measured with 5,000 idle clients, names that kept a slice of their
//!    connection's read buffer alive cost 41.0 MiB against 21.6 MiB for
//!    PING alone. twemproxy closes the connection on HELLO and CLIENT, so
//!    its idle clients only PING (as clients configured for it must);
//! 4. `BENCH_MANY_CLIENTS` clients connect and each sends one DEDUCT at the
//!    same time, all held open: RSS and peak; every reply must be code 0
//!    and Redis must show exactly that many deductions;
//! 5. all leave: RSS once the proxy has seen them go;
//! 6. steps 4 and 5 again (`BENCH_MANY_ROUNDS` times in all), to tell
//!    allocator retention (flat) from a leak (growing).
//!
//! For context, the same burst of concurrent clients then goes straight to
//! Redis (direct-cluster, direct-standalone): how long Redis itself takes.
//!
//! The harness raises its own `RLIMIT_NOFILE` soft limit to the hard limit
//! with `setrlimit`, and the proxies inherit it. Kubernetes has no pod
//! field for it: a container gets the container runtime's limit (often
//! 1048576 with containerd on systemd nodes, sometimes 1024 soft), so raise
//! the soft limit in the process at start, or in the entrypoint with
//! `ulimit -n`.

use crate::Knobs;
use crate::fleet::{self, Fleet, Memory};
use crate::loadgen::{self, Conn};
use crate::target::{Target, TargetId, plan};
use crate::throughput::{Measured, measure};
use futures_util::future::try_join_all;
use std::fmt::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// File descriptors the harness keeps for itself beyond the clients.
const FD_RESERVE: u64 = 256;

/// What an idle client sends when it connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    /// PING, and nothing else.
    Ping,
    /// A client library's handshake: HELLO 3, CLIENT SETINFO LIB-NAME and
    /// LIB-VER (the libraries' own values, in turn), CLIENT SETNAME, then
    /// PING. Every reply must be a success.
    Identify,
}

impl Handshake {
    fn name(self) -> &'static str {
        match self {
            Handshake::Ping => "PING only",
            Handshake::Identify => "HELLO 3 + CLIENT SETINFO + CLIENT SETNAME + PING",
        }
    }
}

/// What the client libraries that send CLIENT SETINFO on connect say
/// about themselves (LIB-NAME, LIB-VER), as recent releases do.
const LIBRARIES: [(&str, &str); 4] = [
    ("redis-py", "5.2.1"),
    ("go-redis(,go1.23.4)", "9.7.0"),
    ("Lettuce", "6.5.1.RELEASE/netty"),
    ("node-redis", "4.7.0"),
];

/// A proxy under test: its pid, where clients connect, and (stockgate
/// only) its own count of open client connections.
struct Subject<'a> {
    id: TargetId,
    pid: u32,
    addr: SocketAddr,
    clients: Box<dyn Fn() -> Option<u64> + 'a>,
}

/// What one proxy's scenarios measured.
struct Result {
    id: TargetId,
    idle: Memory,
    warm: Memory,
    idle_clients: Memory,
    many: Vec<Memory>,
    left: Vec<Memory>,
    many_count: usize,
    notes: Vec<String>,
    /// A check failed: the benchmark exits non-zero after the table.
    failed: bool,
}

pub fn run(runtime: &tokio::runtime::Runtime, knobs: &Knobs, fleet: &mut Fleet, fd_limit: u64) {
    let mut many = knobs.many_clients;
    if fd_limit < many as u64 + FD_RESERVE {
        many = fd_limit.saturating_sub(FD_RESERVE) as usize;
        eprintln!(
            "warning: RLIMIT_NOFILE is {fd_limit}: {many} concurrent clients instead of {}",
            knobs.many_clients
        );
    }
    let mut results = Vec::new();
    for id in [
        TargetId::StockgateCluster,
        TargetId::StockgateStandalone,
        TargetId::TwemproxyStandalone,
    ] {
        if !knobs.targets.contains(&id) {
            continue;
        }
        eprintln!("memory: {}", id.name());
        let result = match id {
            TargetId::TwemproxyStandalone => {
                let proxy = fleet.start_twemproxy(knobs, "twemproxy-memory");
                let subject = Subject {
                    id,
                    pid: proxy.proc.pid,
                    addr: proxy.addr,
                    clients: Box::new(|| None),
                };
                let mut result = scenarios(runtime, knobs, fleet, &subject, many);
                result.notes.extend(proxy.proc.log_summary());
                result
            }
            _ => {
                let name = format!("{}-memory", id.name());
                let proxy = fleet.start_stockgate(knobs, &name, id == TargetId::StockgateCluster);
                let subject = Subject {
                    id,
                    pid: proxy.pid(),
                    addr: proxy.addr,
                    clients: Box::new(|| {
                        proxy
                            .metric("stockgate_client_connections")
                            .map(|v| v as u64)
                    }),
                };
                let mut result = scenarios(runtime, knobs, fleet, &subject, many);
                result.notes.extend(fleet::log_summary(&name, &proxy.log()));
                result
            }
        };
        results.push(result);
    }
    let context = direct_bursts(runtime, fleet, many);
    println!("{}{}", table(knobs, &results), context.join("\n"));
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.failed)
        .map(|r| r.id.name())
        .collect();
    if !failed.is_empty() {
        panic!(
            "memory scenarios failed their checks for {}: see the notes above",
            failed.join(", ")
        );
    }
}

fn scenarios(
    runtime: &tokio::runtime::Runtime,
    knobs: &Knobs,
    fleet: &mut Fleet,
    subject: &Subject,
    many: usize,
) -> Result {
    let target = Target {
        id: subject.id,
        shape: match subject.id {
            TargetId::TwemproxyStandalone => crate::target::Shape::Evalsha,
            _ => crate::target::Shape::Deduct,
        },
        routes: fleet.routes(subject.id, Some(subject.addr)),
        proxy: Some(subject.pid),
    };
    let mut notes = Vec::new();
    let mut tag = 0;
    let mut next_tag = || {
        tag += 1;
        format!("m{tag}")
    };
    let idle = fleet::memory(subject.pid);

    // 2. Warm up, then everyone leaves: the baseline.
    let db = fleet.db(subject.id);
    db.reset();
    let per_conn = (knobs.requests / 10).div_ceil(knobs.connections).max(1);
    let conns = plan(&target, db, knobs.connections, per_conn, &next_tag(), 1);
    drop(measure(runtime, &target, db, conns, 1).checked());
    settle(subject, &mut notes);
    let warm = fleet::memory(subject.pid);

    // 3. Many connected, few active.
    fleet::reset_peak(subject.pid);
    let idle_count = knobs.idle_clients.saturating_sub(knobs.connections);
    let handshake = match subject.id {
        TargetId::TwemproxyStandalone => Handshake::Ping,
        _ => knobs.idle_handshake,
    };
    let idle_streams = runtime
        .block_on(connect_idle(subject.addr, idle_count, handshake))
        .unwrap_or_else(|e| panic!("{}: {idle_count} idle clients: {e}", subject.id.name()));
    notes.push(format!(
        "{idle_count} idle clients sent {} on connect",
        handshake.name()
    ));
    db.reset();
    let conns = plan(&target, db, knobs.connections, per_conn, &next_tag(), 2);
    let (_, outcome) = measure(runtime, &target, db, conns, 1).checked();
    let idle_clients = fleet::memory(subject.pid);
    drop((idle_streams, outcome));
    settle(subject, &mut notes);

    // 4-6. Many concurrent clients, one DEDUCT each, twice.
    let (mut many_mem, mut left) = (Vec::new(), Vec::new());
    let mut failed = false;
    for round in 0..knobs.many_rounds.max(1) {
        fleet::reset_peak(subject.pid);
        db.reset();
        let conns: Vec<Conn> = plan(&target, db, many, 1, &next_tag(), 3 + round as u64);
        let measured = measure(runtime, &target, db, conns, 1);
        many_mem.push(fleet::memory(subject.pid));
        if let Some(open) = (subject.clients)()
            && open != many as u64
        {
            notes.push(format!(
                "round {round}: stockgate_client_connections was {open} with {many} clients connected"
            ));
        }
        notes.push(format!("round {round}: {}", burst(&measured)));
        if let Some(problem) = &measured.problem {
            notes.push(format!("round {round}: FAILED: {problem}"));
            failed = true;
        }
        let outcome = measured.outcome;
        drop(outcome);
        settle(subject, &mut notes);
        left.push(fleet::memory(subject.pid));
    }
    Result {
        id: subject.id,
        idle,
        warm,
        idle_clients,
        many: many_mem,
        left,
        many_count: many,
        notes,
        failed,
    }
}

/// How a burst of clients went: connecting, answering, latency.
fn burst(measured: &Measured) -> String {
    let run = &measured.run;
    format!(
        "{} clients connected in {:.1?}, all answered {:.1?} later; latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        run.requests,
        measured.outcome.connecting,
        measured.outcome.elapsed,
        run.p50_us / 1e3,
        run.p99_us / 1e3,
        run.max_us / 1e3
    )
}

/// The same burst straight to Redis: what the proxies are up against.
fn direct_bursts(runtime: &tokio::runtime::Runtime, fleet: &mut Fleet, many: usize) -> Vec<String> {
    let mut notes = Vec::new();
    for id in [TargetId::DirectCluster, TargetId::DirectStandalone] {
        let target = Target {
            id,
            shape: crate::target::Shape::Evalsha,
            routes: fleet.routes(id, None),
            proxy: None,
        };
        let db = fleet.db(id);
        db.reset();
        let conns = plan(&target, db, many, 1, &format!("d{}", id.name()), 99);
        let measured = measure(runtime, &target, db, conns, 1);
        notes.push(format!(
            "- {} (no proxy, for context): {}",
            id.name(),
            burst(&measured)
        ));
        if let Some(problem) = measured.problem {
            notes.push(format!("- {}: FAILED: {problem}", id.name()));
        }
    }
    notes
}

/// Waits until the proxy has seen every client go (stockgate says so in
/// its metrics; for twemproxy, a fixed pause), then one upkeep period.
fn settle(subject: &Subject, notes: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match (subject.clients)() {
            None => {
                std::thread::sleep(Duration::from_secs(2));
                break;
            }
            Some(0) => break,
            Some(open) if Instant::now() > deadline => {
                notes.push(format!(
                    "stockgate_client_connections still {open} 10 s after every client left"
                ));
                break;
            }
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    // stockgate hands freed memory back every 5 s (malloc_trim in its
    // upkeep task); wait one period so "after they left" sees it.
    std::thread::sleep(Duration::from_millis(6_000));
}

/// Opens `count` connections and has each send `handshake`, as a client
/// library does on connect.
async fn connect_idle(
    addr: SocketAddr,
    count: usize,
    handshake: Handshake,
) -> std::io::Result<Vec<TcpStream>> {
    let mut streams = loadgen::connect_all(&vec![addr; count]).await?;
    let greetings = streams
        .iter_mut()
        .enumerate()
        .map(|(i, stream)| greet(stream, i, handshake));
    try_join_all(greetings).await?;
    Ok(streams)
}

/// Client `i`'s `handshake`, pipelined; fails unless every reply is a
/// success (a map for HELLO, OK, PONG).
async fn greet(stream: &mut TcpStream, i: usize, handshake: Handshake) -> std::io::Result<()> {
    use redis_protocol::resp3::types::BytesFrame;
    let mut requests = crate::loadgen::Encoded::default();
    if handshake == Handshake::Identify {
        let (lib, version) = LIBRARIES[i % LIBRARIES.len()];
        let name = format!("idle-client-{i}");
        requests.push(&[b"HELLO", b"3"]);
        requests.push(&[b"CLIENT", b"SETINFO", b"LIB-NAME", lib.as_bytes()]);
        requests.push(&[b"CLIENT", b"SETINFO", b"LIB-VER", version.as_bytes()]);
        requests.push(&[b"CLIENT", b"SETNAME", name.as_bytes()]);
    }
    requests.push(&[b"PING"]);
    stream.write_all(requests.as_bytes()).await?;
    let replies = read_replies(stream, requests.len());
    let answers = tokio::time::timeout(Duration::from_secs(10), replies)
        .await
        .map_err(|_| std::io::Error::other("no reply to the handshake within 10 s"))??;
    match answers.iter().find(|answer| {
        matches!(
            answer,
            BytesFrame::SimpleError { .. } | BytesFrame::BlobError { .. }
        )
    }) {
        Some(refused) => Err(std::io::Error::other(format!(
            "the handshake was refused: {refused:?}"
        ))),
        None => Ok(()),
    }
}

/// Reads `count` replies (RESP2 or RESP3) from `stream`.
async fn read_replies(
    stream: &mut TcpStream,
    count: usize,
) -> std::io::Result<Vec<redis_protocol::resp3::types::BytesFrame>> {
    use redis_protocol::resp3::decode::complete::decode_bytes_mut;
    let mut buf = bytes::BytesMut::with_capacity(1024);
    let mut frames = Vec::with_capacity(count);
    while frames.len() < count {
        match decode_bytes_mut(&mut buf).map_err(std::io::Error::other)? {
            Some((frame, _, _)) => frames.push(frame),
            None => {
                if stream.read_buf(&mut buf).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
        }
    }
    Ok(frames)
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn table(knobs: &Knobs, results: &[Result]) -> String {
    let mut out = String::new();
    let many = results.first().map_or(knobs.many_clients, |r| r.many_count);
    let rounds = results.first().map_or(1, |r| r.many.len());
    let _ = write!(
        out,
        "\n**Memory** (RSS in MiB; peak = VmHWM since the step began):\n\n\
         | proxy | idle after start | warm, 0 clients | {idle} clients ({active} active) | peak | \
         {many} clients | peak | all left | {many} clients, left, x{rounds} | KiB per client |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
        idle = knobs.idle_clients,
        active = knobs.connections,
    );
    for r in results {
        let per_client =
            (r.many[0].rss_kib as f64 - r.warm.rss_kib as f64) / r.many_count.max(1) as f64;
        let each: Vec<String> = r
            .many
            .iter()
            .zip(&r.left)
            .map(|(m, l)| format!("{}, {}", mib(m.rss_kib), mib(l.rss_kib)))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {per_client:.1} |",
            r.id.name(),
            mib(r.idle.rss_kib),
            mib(r.warm.rss_kib),
            mib(r.idle_clients.rss_kib),
            mib(r.idle_clients.peak_kib),
            mib(r.many[0].rss_kib),
            mib(r.many[0].peak_kib),
            mib(r.left[0].rss_kib),
            each.join("; "),
        );
    }
    let _ = writeln!(
        out,
        "\nKiB per client: (RSS with all clients connected - warm RSS) / clients. Every client's \
         DEDUCT was checked against Redis. The x{rounds} column: RSS with the clients connected, and \
         after they left, per round.\n",
    );
    for r in results {
        for note in &r.notes {
            let _ = writeln!(out, "- {}: {note}", r.id.name());
        }
    }
    out
}

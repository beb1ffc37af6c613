//! Fault 9: clients that leave. One disconnects while its DEDUCT is in
//! flight (closing, or resetting, the socket); thousands connect and
//! vanish mid-conversation. stockgate runs as its own process here, so its
//! memory (VmRSS) can be read; `stockgate_client_connections` and the
//! memory must come back to their baseline, and a load afterwards must
//! still audit green (dropped requests left the shared upstream
//! connection in step).

use crate::checker::{Policy, Workload};
use crate::harness::*;
use crate::relay::{Mode, Relay};
use crate::support::{Launch, Stockgate};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `stockgate_client_connections` now.
fn connections(gate: &Stockgate) -> f64 {
    gate.metric("stockgate_client_connections")
        .expect("stockgate_client_connections")
}

/// Waits until the open connections are back to `baseline`; how long it took.
fn wait_connections(gate: &Stockgate, baseline: f64, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let now = connections(gate);
        if now <= baseline {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "stockgate_client_connections stuck at {now}, baseline {baseline}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// One client that connects and vanishes, in one of five ways.
async fn vanish(addr: SocketAddr, n: usize, sku: &str) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return;
    };
    let id = format!("churn-{n}");
    let deduct = resp(&["DEDUCT", sku, "1", &id]);
    match n % 5 {
        // Connect, then leave.
        0 => {}
        // A whole DEDUCT, then leave without reading the reply.
        1 => {
            let _ = stream.write_all(&deduct).await;
        }
        // Half a request, then leave.
        2 => {
            let _ = stream.write_all(&deduct[..deduct.len() / 2]).await;
        }
        // A DEDUCT, then a reset (SO_LINGER 0) while it is in flight.
        3 => {
            let _ = stream.write_all(&deduct).await;
            let _ = stream.set_zero_linger();
        }
        // A polite PING, its reply read, then leave.
        _ => {
            let _ = stream.write_all(b"PING\r\n").await;
            let mut buf = [0u8; 16];
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
        }
    }
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanishing_clients_leak_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    // A slow path to one primary, so a request is still in flight when its
    // client leaves.
    let slow_sku = skus_where(&cluster, "leak_slow", 1, |o| o == victim).remove(0);
    seed(&cluster, std::slice::from_ref(&slow_sku), 100);
    let churn_skus = skus_on_every_primary(&cluster, "churn", 4);
    seed(&cluster, &churn_skus, 1_000_000_000);
    let relay = Relay::start(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let seeds: Vec<String> = cluster.nodes[1..].iter().map(|n| n.url()).collect();
    // Its own process, so its memory is its own; dies with the test
    // thread, like the Redis servers.
    let gate = Launch::serve(&seeds)
        .env("STOCKGATE_LOG", "warn")
        .dies_with_thread()
        .start();

    // One client leaves while its DEDUCT is in flight (FIN), one resets.
    relay.set(Mode::Delay(Duration::from_millis(300)));
    for (id, reset) in [("mid-fin", false), ("mid-rst", true)] {
        let mut stream = TcpStream::connect(gate.addr).await.unwrap();
        stream
            .write_all(&resp(&["DEDUCT", &slow_sku, "3", id]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        if reset {
            stream.set_zero_linger().unwrap();
        }
        drop(stream);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    relay.set(Mode::Pass);
    let mut retry = redis::Client::open(format!("redis://{}", gate.addr))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut last = None;
    for id in ["mid-fin", "mid-rst"] {
        let reply = crate::support::parse(
            crate::support::deduct(&mut retry, &slow_sku, "3", id, None)
                .await
                .unwrap(),
        );
        eprintln!(
            "[leak] {id}: the client left mid-request; its retry answered {} (1: the first call had run)",
            reply.code
        );
        assert!(matches!(reply.code, 0 | 1), "{reply:?}");
        last = Some(reply.remain);
    }
    assert_eq!(last, Some(94), "each deducted once");
    assert_eq!(crate::support::get_stock(&cluster, &slow_sku), Some(94));
    drop(retry);

    // No client is connected now: the baseline is zero.
    let baseline = 0.0;
    wait_connections(&gate, baseline, Duration::from_secs(5));
    let rss_start = gate.status_kib("VmRSS");
    let rounds = if long_faults() { 10 } else { 3 };
    let mut rss = Vec::new();
    let mut drained_in = Vec::new();
    for round in 0..rounds {
        // 1,000 clients, at most 250 at a time.
        for batch in 0..4 {
            let tasks: Vec<_> = (0..250)
                .map(|i| {
                    let n = round * 1000 + batch * 250 + i;
                    let sku = churn_skus[n % churn_skus.len()].clone();
                    let addr = gate.addr;
                    tokio::spawn(async move { vanish(addr, n, &sku).await })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        }
        drained_in.push(wait_connections(&gate, baseline, Duration::from_secs(15)));
        rss.push(gate.status_kib("VmRSS"));
    }
    eprintln!(
        "[leak] {rounds} rounds of 1,000 vanishing clients: connections back to {baseline} after {:?}; VmRSS {} KiB before, after each round {:?} KiB",
        drained_in.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
        rss_start,
        rss,
    );
    // Allocators keep some memory; a leak grows with every round. From the
    // first round on, the resident set must stay flat (a loose 8 MiB for
    // 2,000 more connections: a leak of even 4 KiB each would exceed it).
    let growth = rss.last().unwrap().saturating_sub(rss[0]);
    assert!(
        growth < 8 * 1024,
        "VmRSS grew {growth} KiB over {} rounds: {rss:?}",
        rounds - 1
    );

    // A load after the churn still audits green: requests dropped mid-way
    // left the shared upstream connections in step.
    let mut load = Workload::new(
        "afterchurn",
        skus_on_every_primary(&cluster, "afterchurn", 4),
        TIMEOUT,
    );
    load.clients = 8;
    load.seed(&cluster);
    let running = load.start(gate.addr).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    running
        .stop()
        .await
        .audit(&cluster, Policy::default())
        .assert_green();
    let churn = crate::checker::conservation(&cluster, "churn", &churn_skus, 1_000_000_000);
    assert!(churn.is_empty(), "churn skus: {churn:?}");
    wait_connections(&gate, baseline, Duration::from_secs(15));
}

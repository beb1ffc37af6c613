//! Redis at its limits on one shard: out of memory, and busy running
//! another client's long script.

use crate::checker::{Attempt, History, Policy};
use crate::harness::*;
use std::time::{Duration, Instant};
use stockgate::dev::RedisNode;

fn between(h: &History, from: Instant, to: Instant) -> Vec<&Attempt> {
    h.attempts
        .iter()
        .filter(|a| a.started >= from && a.ended() < to)
        .collect()
}

/// What a node holds, coarsely: its key count and the stock of `skus`.
fn snapshot(node: &RedisNode, skus: &[String]) -> (u64, Vec<Option<i64>>) {
    let mut conn = node.connection().expect("node");
    let keys: u64 = redis::cmd("DBSIZE").query(&mut conn).expect("DBSIZE");
    let stock = skus
        .iter()
        .map(|sku| {
            redis::cmd("GET")
                .arg(crate::support::stock_key(sku))
                .query(&mut conn)
                .expect("GET")
        })
        .collect();
    (keys, stock)
}

/// Fault 7: a primary out of memory (`maxmemory` under its use, with
/// `noeviction`). The flagged script is refused before it runs: every
/// request on that shard is an error, nothing at all is written (no
/// partial record), the other shards are served, and when memory is given
/// back the retries settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_primary_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let (fault, rest) = lanes(&cluster, "oom", victim);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    let phase = if long_faults() {
        Duration::from_secs(8)
    } else {
        Duration::from_millis(1500)
    };
    tokio::time::sleep(phase).await;

    let node = &cluster.nodes[victim];
    let used: u64 = info_field(node, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory");
    let limit = used / 2;
    for (name, value) in [
        ("maxmemory-policy", "noeviction".to_owned()),
        ("maxmemory", limit.to_string()),
    ] {
        assert_eq!(
            text(node, &["CONFIG", "SET", name, &value]).as_deref(),
            Some("OK")
        );
    }
    let oom_from = Instant::now();
    // Requests already inside Redis finish; after that nothing may change.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let settled = Instant::now();
    let before = snapshot(node, &fault.skus);
    tokio::time::sleep(phase).await;
    let after = snapshot(node, &fault.skus);
    let oom_to = Instant::now();
    assert_eq!(
        text(node, &["CONFIG", "SET", "maxmemory", "0"]).as_deref(),
        Some("OK")
    );
    tokio::time::sleep(phase).await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    let during = between(&fault_history, settled, oom_to);
    let others = between(&rest_history, oom_from, oom_to);
    eprintln!(
        "[oom] maxmemory {limit} bytes (half the {used} used) for {}: this shard {:?}; other shards {:?} {}; keys on the node {} -> {}",
        ms(oom_to - oom_from),
        fault_history.by_label(during.iter().copied()),
        rest_history.by_label(others.iter().copied()),
        rest_history.latency(others.iter().copied()),
        before.0,
        after.0,
    );
    assert_eq!(before, after, "nothing written while out of memory");
    assert!(!during.is_empty(), "requests were made during the fault");
    assert!(
        during.iter().all(|a| a.outcome.label() == "oom"),
        "every request on the shard was refused as out of memory"
    );
    assert_other_shards_served(&others, "node out of memory");
    audit_lanes_and_stop(
        &cluster,
        server,
        (&fault_history, Policy::default()),
        &rest_history,
    );
}

/// Fault 8: another client runs a script for seconds on one primary
/// (`busy-reply-threshold` 100 ms there). Requests on that shard get an
/// error within the deadline (BUSY, or a timeout before the threshold),
/// the other shards are served, and everything settles afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_script_on_one_shard() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let (fault, rest) = lanes(&cluster, "busy", victim);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let node = &cluster.nodes[victim];
    assert_eq!(
        text(node, &["CONFIG", "SET", "busy-reply-threshold", "100"]).as_deref(),
        Some("OK")
    );
    let busy_for: u64 = if long_faults() { 10 } else { 3 };
    let mut conn = node.connection().expect("node");
    conn.set_read_timeout(Some(Duration::from_secs(busy_for + 30)))
        .unwrap();
    let busy_from = Instant::now();
    // A read-only script that spins on TIME for busy_for seconds.
    let spinner = std::thread::spawn(move || {
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') local stop = tonumber(t[1]) + tonumber(ARGV[1]) \
                 while tonumber(redis.call('TIME')[1]) < stop do end return 1",
            )
            .arg(0)
            .arg(busy_for)
            .query::<i64>(&mut conn)
    });
    let spun = tokio::task::spawn_blocking(move || spinner.join())
        .await
        .unwrap()
        .expect("spinner thread");
    let busy_to = Instant::now();
    assert_eq!(spun.expect("the busy script ends by itself"), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    let during = between(&fault_history, busy_from, busy_to);
    let errors: Vec<&&Attempt> = during.iter().filter(|a| !a.outcome.is_code()).collect();
    let others = between(&rest_history, busy_from, busy_to);
    eprintln!(
        "[busy] script spun {} on :{}: this shard {:?}, slowest error {} (bound {}); other shards {:?} {}; the node is still primary: {}",
        ms(busy_to - busy_from),
        node.port,
        fault_history.by_label(during.iter().copied()),
        ms(errors.iter().map(|a| a.took).max().unwrap_or_default()),
        ms(no_hang_bound(TIMEOUT)),
        rest_history.by_label(others.iter().copied()),
        rest_history.latency(others.iter().copied()),
        is_primary(node),
    );
    eprintln!(
        "[busy] errors on the shard relative to the script's start: {}",
        fault_history.error_spans(busy_from)
    );
    assert!(
        errors.iter().any(|a| a.outcome.label() == "busy"),
        "BUSY reached clients as -UPSTREAM"
    );
    assert_other_shards_served(&others, "busy script");
    audit_lanes_and_stop(
        &cluster,
        server,
        (&fault_history, Policy::default()),
        &rest_history,
    );
}

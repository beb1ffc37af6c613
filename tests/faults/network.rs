//! The network between stockgate and Redis: a node behind a faulty relay
//! (latency, a black hole, replies lost after the command ran), and the
//! whole upstream down and back.

use crate::checker::{Attempt, History, Op, Outcome, Policy, Workload};
use crate::harness::*;
use crate::relay::{Mode, Relay};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The attempts that started in `[from, to)`.
fn between(h: &History, from: Instant, to: Instant) -> Vec<&Attempt> {
    h.attempts
        .iter()
        .filter(|a| a.started >= from && a.started < to)
        .collect()
}

/// Fault 5: one primary behind a relay that every client goes through
/// (the node announces the relay's port). Latency, then a black hole, then
/// replies lost after the command ran. Errors come within the no-hang
/// bound, the other shards are untouched, and a request whose reply was
/// lost gets code 1 on its retry, its stock changed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_node_latency_and_lost_replies() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let (fault, rest) = lanes(&cluster, "relay", victim);
    let probe_sku = &skus_where(&cluster, "relay_probe", 1, |o| o == victim)[0];
    seed(&cluster, std::slice::from_ref(probe_sku), 100);
    let relay = Relay::start(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let announced = slot_ranges(&cluster.nodes[1]).expect("slots");
    assert!(
        announced.iter().any(|r| r.2 == relay.port),
        "CLUSTER SLOTS names the relay: {announced:?}"
    );
    // Seeds without the node's own port: stockgate learns the relay's from
    // the slot map, as any cluster client would.
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n.url())
        .collect();
    let server = stockgate(seeds, TIMEOUT).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    let long = long_faults();
    let step = |short: u64| Duration::from_millis(if long { short * 4 } else { short });
    tokio::time::sleep(step(1000)).await;
    let through = relay.stats.bytes_to_node.load(Ordering::Relaxed);
    eprintln!(
        "[relay] node :{} announces relay :{}; after 1 s of load the relay had {} connections and carried {through} bytes to the node",
        cluster.nodes[victim].port,
        relay.port,
        relay.stats.accepted.load(Ordering::Relaxed),
    );
    assert!(through > 0, "stockgate reaches the node through the relay");

    let added = Duration::from_millis(200);
    let delay_from = Instant::now();
    relay.set(Mode::Delay(added));
    tokio::time::sleep(step(1500)).await;
    relay.set(Mode::Pass);
    let delay_to = Instant::now();
    tokio::time::sleep(step(500)).await;

    let hole_from = Instant::now();
    relay.set(Mode::Blackhole);
    tokio::time::sleep(step(2500)).await;
    relay.set(Mode::Pass);
    let hole_to = Instant::now();
    tokio::time::sleep(step(1000)).await;

    let lose_from = Instant::now();
    relay.set(Mode::LoseReplies);
    // The probe: DEDUCTs on a sku of that shard until one fails although
    // Redis (read directly, not through the relay) holds its record: the
    // command ran and its reply was lost. (An attempt can also fail before
    // its bytes left, on a connection the relay had just cut.)
    let mut probe = crate::support::client(&server, false).await;
    let mut node = cluster.nodes[victim].connection().expect("node");
    let mut lost_probe = None;
    for i in 0..5 {
        let id = format!("probe-{i}");
        let reply = crate::support::deduct(&mut probe, probe_sku, "7", &id, None).await;
        let record: Option<String> = redis::cmd("GET")
            .arg(crate::support::record_key(probe_sku, &id))
            .query(&mut node)
            .expect("GET record");
        match (reply, record) {
            (Err(err), Some(record)) => {
                assert_eq!(err.code(), Some("UPSTREAM"), "{err:?}");
                assert_eq!(crate::support::summary(&record), "D:7:");
                lost_probe = Some(id);
                break;
            }
            // Not applied, or answered: settle it after the heal.
            (_, _) => continue,
        }
    }
    tokio::time::sleep(step(1000)).await;
    relay.set(Mode::Pass);
    let lose_to = Instant::now();
    tokio::time::sleep(step(1500)).await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    // Latency.
    let before: Vec<&Attempt> = between(&fault_history, fault_history.started, delay_from);
    eprintln!(
        "[relay] +{} per chunk: this shard before {} | during {} | other shards during {}",
        ms(added),
        fault_history.latency(before.into_iter()),
        fault_history.latency(between(&fault_history, delay_from, delay_to).into_iter()),
        rest_history.latency(between(&rest_history, delay_from, delay_to).into_iter()),
    );
    // Black hole.
    let hole = between(&fault_history, hole_from, hole_to);
    let hole_errors: Vec<&&Attempt> = hole.iter().filter(|a| !a.outcome.is_code()).collect();
    let others = between(&rest_history, hole_from, hole_to);
    eprintln!(
        "[relay] black hole for {}: this shard {:?}, slowest error {} (bound {}); other shards {:?} {}",
        ms(hole_to - hole_from),
        fault_history.by_label(hole.iter().copied()),
        ms(hole_errors.iter().map(|a| a.took).max().unwrap_or_default()),
        ms(no_hang_bound(TIMEOUT)),
        rest_history.by_label(others.iter().copied()),
        rest_history.latency(others.iter().copied()),
    );
    assert!(!hole_errors.is_empty(), "the black hole produced errors");
    assert_other_shards_served(&others, "black hole");
    // Lost replies: an id whose attempt failed during the cut, and whose
    // retry answered 1 (applied by the attempt whose reply was lost).
    let failed: HashSet<&str> = between(&fault_history, lose_from, lose_to)
        .iter()
        .filter(|a| a.op == Op::Deduct && !a.outcome.is_code())
        .map(|a| &*a.id)
        .collect();
    let answered_one = fault_history
        .attempts
        .iter()
        .filter(|a| a.op == Op::Deduct && a.retry > 0 && failed.contains(&*a.id))
        .filter(|a| a.outcome.code() == Some(1))
        .count();
    eprintln!(
        "[relay] lost replies for {}: the relay cut {} replies; {} DEDUCTs failed, {} of them answered 1 on a retry",
        ms(lose_to - lose_from),
        relay.stats.replies_lost.load(Ordering::Relaxed),
        failed.len(),
        answered_one,
    );
    assert!(answered_one > 0, "a lost reply's retry answers 1");
    let lost_probe = lost_probe.expect("a probe whose command ran and whose reply was lost");
    let mut stock_before = 100;
    for i in 0..5 {
        let id = format!("probe-{i}");
        let reply = crate::support::parse(
            crate::support::deduct(&mut probe, probe_sku, "7", &id, None)
                .await
                .unwrap(),
        );
        if id == lost_probe {
            assert_eq!(reply.code, 1, "the lost reply's retry: {reply:?}");
            eprintln!(
                "[relay] probe {id}: -UPSTREAM while Redis held D:7:, then code {} remain {} on the retry",
                reply.code, reply.remain
            );
            break;
        }
        assert!(matches!(reply.code, 0 | 1), "{reply:?}");
        stock_before -= 7;
    }
    let stock: i64 = redis::cmd("GET")
        .arg(crate::support::stock_key(probe_sku))
        .query(&mut node)
        .expect("GET stock");
    assert_eq!(stock, stock_before - 7, "each probe deducted once");

    audit_lanes_and_stop(
        &cluster,
        server,
        (&fault_history, Policy::default()),
        &rest_history,
    );
}

/// Fault 6: every Redis node killed, then restarted (with an append-only
/// file, so the data survives): errors come fast, never a code, and the
/// same stockgate serves again without a restart. The long variant goes
/// down and back six times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_upstream_down_then_back() {
    let _serial = SERIAL.lock().await;
    let mut cluster = cluster(2000, &["--appendonly", "yes", "--appendfsync", "always"]);
    let skus = skus_on_every_primary(&cluster, "outage", 8);
    let load = Workload::new("outage", skus, TIMEOUT);
    load.seed(&cluster);
    let probe_sku = skus_on_every_primary(&cluster, "outage_probe", 1);
    seed(&cluster, &probe_sku, 1_000_000);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let running = load.start(server.addr).await;
    let mut probe = crate::support::client(&server, false).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let (cycles, outage) = if long_faults() {
        (6, Duration::from_millis(2000))
    } else {
        (1, Duration::from_millis(3000))
    };
    let mut windows = Vec::new();
    for cycle in 0..cycles {
        let down = Instant::now();
        for node in &mut cluster.nodes {
            node.kill();
        }
        let mut unready_after = None;
        while down.elapsed() < outage {
            if unready_after.is_none() && !server.is_ready() {
                unready_after = Some(down.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let restarting = Instant::now();
        for node in &mut cluster.nodes {
            node.restart().expect("node restarts");
        }
        wait_stable(&cluster);
        let back = Instant::now();
        // Every primary serves again through the same stockgate, soon.
        for sku in &probe_sku {
            let id = format!("probe-{cycle}");
            loop {
                match crate::support::deduct(&mut probe, sku, "1", &id, None).await {
                    Ok(_) => break,
                    Err(err) if back.elapsed() > Duration::from_secs(15) => panic!(
                        "[outage] cycle {cycle}: {sku} not served 15 s after the cluster came back: {err:?}; stockgate ready {} ({:?}), primaries {:?}; slots as node 0 sees them: {:?}",
                        server.is_ready(),
                        server.shared().upstream.problem(),
                        server.shared().upstream.nodes(),
                        slot_ranges(&cluster.nodes[0]),
                    ),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        let served = back.elapsed();
        let ready = server.wait_ready(Duration::from_secs(20)).await;
        assert!(ready, "ready again without a restart");
        windows.push((down, restarting, back, served, unready_after));
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    let history = running.stop().await;

    for (down, restarting, back, served, unready_after) in windows {
        let during = between(&history, down, restarting);
        let errors: Vec<&&Attempt> = during.iter().filter(|a| !a.outcome.is_code()).collect();
        let mut took: Vec<Duration> = errors.iter().map(|a| a.took).collect();
        took.sort_unstable();
        eprintln!(
            "[outage] all 6 nodes down for {}: {} errors {:?}, error latency p50 {} max {} (bound {}); readiness off after {:?}; restarted and stable {} later; every primary served again {} after that",
            ms(restarting - down),
            errors.len(),
            history.by_label(errors.iter().copied().copied()),
            ms(took.get(took.len() / 2).copied().unwrap_or_default()),
            ms(took.last().copied().unwrap_or_default()),
            ms(no_hang_bound(TIMEOUT)),
            unready_after,
            ms(back - restarting),
            ms(served),
        );
        assert!(!errors.is_empty(), "the outage produced errors");
        assert!(
            errors
                .iter()
                .all(|a| matches!(&a.outcome, Outcome::Fault { word, .. } if word == "UPSTREAM")),
            "every error during the outage is UPSTREAM"
        );
    }
    history.audit(&cluster, Policy::default()).assert_green();
    server.stop_now();
}

/// Fault 5b: one primary stops reading (its receive window shut, as a
/// frozen host's does) under enough load to fill every socket buffer
/// between stockgate and it. Every request, queued or half-written, is
/// answered within the no-hang bound (it is a timeout, or an `overloaded`
/// refusal, never a hang), the other shards are served as usual, and the
/// node serves again once it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stops_reading_never_hangs_a_request() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let (_, rest) = lanes(&cluster, "frozen", victim);
    let flood_skus = skus_where(&cluster, "frozen_flood", 8, |o| o == victim);
    seed(&cluster, &flood_skus, 1_000_000_000);
    let relay = Relay::start_with_window(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
        Some(64 * 1024),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n.url())
        .collect();
    let server = stockgate(seeds, TIMEOUT).await;
    let rest_load = rest.start(server.addr).await;

    // The flood: connections each keeping 16 DEDUCTs of about 250 bytes in
    // flight on the frozen shard, every reply timed from its send.
    let stop = tokio_util::sync::CancellationToken::new();
    let slowest = std::sync::Arc::new(std::sync::Mutex::new((Duration::ZERO, 0u64, 0u64)));
    let mut flooders = Vec::new();
    for c in 0..300 {
        let addr = server.addr;
        let (stop, slowest, skus) = (stop.clone(), slowest.clone(), flood_skus.clone());
        flooders.push(tokio::spawn(async move {
            let config = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_secs(60)));
            let conn = redis::Client::open(format!("redis://{addr}"))
                .unwrap()
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .expect("flood connects");
            let order_no = "N".repeat(128);
            let mut round = 0u64;
            while !stop.is_cancelled() {
                let calls = (0..16).map(|d| {
                    let mut conn = conn.clone();
                    let sku = skus[(c + d) % skus.len()].clone();
                    // Long ids and order_nos: about 400 bytes a request,
                    // so the buffers fill fast.
                    let id = format!("flood-{c}-{round}-{d}-{}", "i".repeat(100));
                    let order_no = order_no.clone();
                    async move {
                        let sent = Instant::now();
                        let reply: redis::RedisResult<redis::Value> = redis::cmd("DEDUCT")
                            .arg(sku)
                            .arg(1)
                            .arg(id)
                            .arg(order_no)
                            .query_async(&mut conn)
                            .await;
                        (sent.elapsed(), reply)
                    }
                });
                for (took, reply) in futures_util::future::join_all(calls).await {
                    let mut slowest = slowest.lock().unwrap();
                    slowest.0 = slowest.0.max(took);
                    match reply {
                        Ok(_) => slowest.1 += 1,
                        Err(err) => {
                            assert_eq!(err.code(), Some("UPSTREAM"), "{err:?}");
                            slowest.2 += 1;
                        }
                    }
                }
                round += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = *slowest.lock().unwrap();
    let frozen_from = Instant::now();
    relay.set(Mode::Freeze);
    tokio::time::sleep(Duration::from_secs(if long_faults() { 20 } else { 8 })).await;
    let during = *slowest.lock().unwrap();
    relay.set(Mode::Pass);
    let thawed = Instant::now();
    // Served again: a probe on the frozen shard gets a code.
    let mut probe = crate::support::client(&server, false).await;
    let mut i = 0;
    let back = loop {
        let id = format!("thaw-{i}");
        match crate::support::deduct(&mut probe, &flood_skus[0], "1", &id, None).await {
            Ok(value) => {
                let reply = crate::support::parse(value);
                assert!(matches!(reply.code, 0 | 1), "{reply:?}");
                break thawed.elapsed();
            }
            Err(err) if thawed.elapsed() > Duration::from_secs(15) => {
                panic!("the shard is not served 15 s after it reads again: {err:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        i += 1;
    };
    stop.cancel();
    for flooder in flooders {
        flooder.await.expect("a flood connection failed");
    }
    let rest_history = rest_load.stop().await;
    let (slowest_reply, answered, errors) = *slowest.lock().unwrap();
    let others = between(&rest_history, frozen_from, thawed);
    eprintln!(
        "[frozen] node stopped reading for {}: flood {} answered and {} errors during and after it ({} and {} before), slowest reply {} (--timeout {}, bound {}); relay carried {} bytes to the node; other shards {:?} {}; served again {} after it read again",
        ms(thawed - frozen_from),
        answered - before.1,
        errors - before.2,
        before.1,
        before.2,
        ms(slowest_reply),
        ms(TIMEOUT),
        ms(no_hang_bound(TIMEOUT)),
        relay.stats.bytes_to_node.load(Ordering::Relaxed),
        rest_history.by_label(others.iter().copied()),
        rest_history.latency(others.iter().copied()),
        ms(back),
    );
    assert!(during.2 > before.2, "the frozen node produced errors");
    assert!(
        slowest_reply <= no_hang_bound(TIMEOUT),
        "a reply took {} while the node was frozen",
        ms(slowest_reply)
    );
    assert_other_shards_served(&others, "frozen node");
    rest_history
        .audit(&cluster, Policy::default())
        .assert_green();
    server.stop_now();
}

/// A call whose reply was lost after it ran, and that stockgate sends
/// again within its deadline (the node pipe's connection was cut; the
/// fallback client resends), answers what the first send did: 0, not
/// "duplicate"; and an operator's STOCK.ADD is applied once. The record names the call that wrote it, so the resend
/// recognises its own write. Before that, the caller's first attempt was
/// told 1, which the checker counts as a violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_resent_after_its_reply_was_lost_answers_as_it_did() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let sku = skus_where(&cluster, "resent", 1, |o| o == victim).remove(0);
    seed(&cluster, std::slice::from_ref(&sku), 100);
    let relay = Relay::start(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n.url())
        .collect();
    let server = crate::support::proxy(seeds, |c| {
        c.upstream.timeout = Duration::from_secs(3);
        c.admin_commands = true;
    })
    .await;
    let mut conn = crate::support::client(&server, false).await;
    // Warm both connections to the node (the pipe's and the fallback's).
    let warm = crate::support::parse(
        crate::support::deduct(&mut conn, &sku, "1", "warm", None)
            .await
            .unwrap(),
    );
    assert_eq!(warm.code, 0);

    let mut node = cluster.nodes[victim].connection().expect("node");
    for (step, command) in ["DEDUCT", "REVERT"].into_iter().enumerate() {
        relay.stats.one_reply_lost.store(false, Ordering::SeqCst);
        relay.set(Mode::LoseOneReply);
        let mut cmd = redis::cmd(command);
        cmd.arg(&sku);
        if command == "DEDUCT" {
            cmd.arg(5);
        }
        cmd.arg("lost-once").arg("ORD-9");
        if command == "REVERT" {
            // REVERT takes no order_no.
            cmd = redis::cmd("REVERT");
            cmd.arg(&sku).arg("lost-once");
        }
        let reply = crate::support::parse(cmd.query_async(&mut conn).await.unwrap());
        relay.set(Mode::Pass);
        assert!(
            relay.stats.one_reply_lost.load(Ordering::SeqCst),
            "step {step}: the relay cut a reply"
        );
        let stock: i64 = redis::cmd("GET")
            .arg(crate::support::stock_key(&sku))
            .query(&mut node)
            .unwrap();
        let record: String = redis::cmd("GET")
            .arg(crate::support::record_key(&sku, "lost-once"))
            .query(&mut node)
            .unwrap();
        eprintln!(
            "[resent] {command} whose reply was lost: code {}, remain {}, stock {stock}, record {record}",
            reply.code, reply.remain
        );
        assert_eq!(
            reply.code, 0,
            "{command} answers as the first send did: {reply:?}"
        );
        let (expected_stock, expected_record) = if command == "DEDUCT" {
            (94, "D:5:ORD-9")
        } else {
            (99, "R:5:ORD-9")
        };
        assert_eq!((stock, reply.remain), (expected_stock, expected_stock));
        assert_eq!(crate::support::summary(&record), expected_record);
    }
    // A later retry, a new call, is a duplicate as before.
    let again = crate::support::parse(
        redis::cmd("REVERT")
            .arg(&sku)
            .arg("lost-once")
            .query_async(&mut conn)
            .await
            .unwrap(),
    );
    assert_eq!(again.code, 1);

    // An operator's restock whose reply was lost: added once, answered 0;
    // the operator's own retry of the op_id is told it was applied (1).
    relay.stats.one_reply_lost.store(false, Ordering::SeqCst);
    relay.set(Mode::LoseOneReply);
    let add = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let sku = sku.clone();
        async move {
            crate::support::parse(
                redis::cmd("STOCK.ADD")
                    .arg(&sku)
                    .arg(50)
                    .arg("restock-7")
                    .query_async(&mut conn)
                    .await
                    .unwrap(),
            )
        }
    };
    let added = add(&mut conn).await;
    relay.set(Mode::Pass);
    assert!(relay.stats.one_reply_lost.load(Ordering::SeqCst));
    let stock: i64 = redis::cmd("GET")
        .arg(crate::support::stock_key(&sku))
        .query(&mut node)
        .unwrap();
    eprintln!(
        "[resent] STOCK.ADD whose reply was lost: code {}, stock {stock}",
        added.code
    );
    assert_eq!(
        (added.code, added.remain, stock),
        (0, 149, 149),
        "added once"
    );
    let retried = add(&mut conn).await;
    assert_eq!((retried.code, retried.remain), (1, 149));
    server.stop_now();
}

/// One deadline per order (issue 22, 3). Behind a relay that holds every
/// chunk 150 ms each way, a call on the slow node takes over 300 ms, and
/// an ORDER whose intent and first line live there makes three of them
/// (its begin, its line DEDUCTs, its move to DONE): more than one
/// `--timeout` of 500 ms. The caller is told at its deadline that
/// the outcome is unknown (before, each phase got a fresh timeout and the
/// answer came whenever the saga ended); the saga goes on by itself and
/// the order ends DONE with nobody retrying, and a retry then answers 1.
/// An HTTP client that gives up mid-saga (its connection closed after
/// 300 ms) cancels nothing either: that order ends DONE too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_has_one_deadline_and_its_saga_outlives_its_caller() {
    use std::io::Write;
    use stockgate::params::RequestId;
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let slow = skus_where(&cluster, "slow-line", 1, |o| o == victim).remove(0);
    let fast = skus_where(&cluster, "fast-line", 1, |o| o != victim).remove(0);
    seed(&cluster, &[slow.clone(), fast.clone()], 100);
    // Orders whose intent lives on the slow node, with their shard of the
    // orders in flight (the filing rides along with the intent calls).
    let layout = crate::support::layout();
    let orders: Vec<String> = (0..)
        .map(|i| format!("one-deadline-{i}"))
        .filter(|id| {
            let id = RequestId::parse(id.clone().into()).unwrap();
            let intent = stockgate::keys::slot(&layout.order_key(&id));
            let shard = &layout.sweep_shards()[layout.order_shard_index(&id)];
            owner(&cluster, intent) == victim
                && owner(&cluster, stockgate::keys::slot(&shard.orders)) == victim
        })
        .take(2)
        .collect();
    let relay = Relay::start(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n.url())
        .collect();
    let timeout = Duration::from_millis(500);
    let server = crate::support::proxy(seeds, |c| {
        c.upstream.timeout = timeout;
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let mut conn = crate::support::client(&server, false).await;
    let warm = crate::support::parse(
        crate::support::deduct(&mut conn, &slow, "1", "warm", None)
            .await
            .unwrap(),
    );
    assert_eq!(warm.code, 0);
    let phase = |id: &str| -> Option<String> {
        let mut direct = cluster.cluster_connection().expect("cluster connection");
        redis::cmd("HGET")
            .arg(layout.order_key(&RequestId::parse(id.to_owned().into()).unwrap()))
            .arg("p")
            .query(&mut direct)
            .expect("HGET the intent")
    };
    let wait_done = |id: &str| {
        let started = Instant::now();
        while phase(id).as_deref() != Some("DONE") {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{id} never ended: {:?}",
                phase(id)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    relay.set(Mode::Delay(Duration::from_millis(150)));

    let answered: redis::RedisResult<redis::Value> = redis::cmd("ORDER")
        .arg(&orders[0])
        .arg(&slow)
        .arg(1)
        .arg(&fast)
        .arg(1)
        .query_async(&mut conn)
        .await;
    let err = answered.expect_err("three slow rounds do not fit one deadline");
    eprintln!("[one deadline] ORDER behind a slow line: {err}");
    assert!(
        err.to_string().contains("did not come to rest"),
        "the documented outcome-unknown error: {err}"
    );
    wait_done(&orders[0]);
    let retry = redis::cmd("ORDER")
        .arg(&orders[0])
        .arg(&slow)
        .arg(1)
        .arg(&fast)
        .arg(1)
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap();
    assert!(
        matches!(&retry, redis::Value::Array(items) if items[0] == redis::Value::Int(1)),
        "{retry:?}"
    );

    // The HTTP client that gives up.
    let body = format!(
        r#"{{"request_id":"{}","lines":[{{"sku":"{slow}","qty":1}},{{"sku":"{fast}","qty":1}}]}}"#,
        orders[1]
    );
    let http = server.http_addr.expect("http is on");
    let mut stream = std::net::TcpStream::connect(http).unwrap();
    write!(
        stream,
        "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(stream);
    wait_done(&orders[1]);
    relay.set(Mode::Pass);
    let mut direct = cluster.cluster_connection().expect("cluster connection");
    for (sku, want) in [(&slow, 97), (&fast, 98)] {
        let stock: i64 = redis::cmd("GET")
            .arg(crate::support::stock_key(sku))
            .query(&mut direct)
            .unwrap();
        assert_eq!(stock, want, "{sku}: each order once (and the warm-up)");
    }
    server.stop_now();
}

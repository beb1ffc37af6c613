//! Issue 23, 2: a black-holed flow. A node behind a relay whose open
//! connections stop moving for good (a dropped conntrack or NAT entry, a
//! firewall that silently discards), while new connections work: the peers'
//! kernels keep the stuck connection, and nothing on it ever moves again.
//! Only a client that gives it up is served again. stockgate gives up a
//! connection on which a request timed out while bytes were unread or
//! unsent, the node pipe's and the redis crate's alike, and reconnects.
//!
//! Each test sticks the flows twice: under load (the load's own retries
//! must settle), then idle, with one probe a second, as a caller that
//! polls would (before, its writes kept the stuck pipe looking alive and
//! nothing was ever served again). Against one standalone Redis, audited
//! by [`Deductions`], and a cluster node, audited by the fault checker.

use crate::checker::Policy;
use crate::harness::*;
use crate::relay::{Mode, Relay};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stockgate::server::Server;
use tokio_util::sync::CancellationToken;

/// How long a node may stay unserved after its flows stuck before the
/// test calls it never served again: generous, the fix serves it within a
/// few seconds.
const SERVED_WITHIN: Duration = Duration::from_secs(30);

/// Sticks every flow through `relay` while idle, then probes `sku` once a
/// second (a DEDUCT, which takes the node pipe, and a STOCK.GET, which
/// takes the redis crate's connection) until both are answered. Returns
/// how long that took from the first probe that failed, and the probe
/// DEDUCTs sent, each `(request_id, answered)`.
async fn stick_idle_then_probe(
    relay: &Relay,
    server: &Server,
    sku: &str,
    name: &str,
) -> (Duration, Vec<(String, bool)>) {
    let opened = relay.stats.accepted.load(Ordering::Relaxed);
    relay.set(Mode::StickFlows);
    let mut conn = crate::support::client(server, false).await;
    let stuck = Instant::now();
    let mut probes = Vec::new();
    let mut first_failure = None;
    loop {
        let id = format!("{name}-probe-{}", probes.len());
        let deducted = crate::support::deduct(&mut conn, sku, "1", &id, None).await;
        let read: redis::RedisResult<redis::Value> = redis::cmd("STOCK.GET")
            .arg(sku)
            .query_async(&mut conn)
            .await;
        probes.push((id, deducted.is_ok()));
        if let Ok(value) = &deducted {
            let reply = crate::support::parse(value.clone());
            assert_eq!(reply.code, 0, "{name}: a new probe deducts: {reply:?}");
        }
        if deducted.is_ok() && read.is_ok() {
            break;
        }
        let failed_at = *first_failure.get_or_insert_with(Instant::now);
        if failed_at.elapsed() > SERVED_WITHIN {
            panic!(
                "[{name}] the node is not served {} after its idle flows stuck: DEDUCT {deducted:?}, STOCK.GET {read:?}; relay accepted {} connections, {} flows stuck",
                ms(SERVED_WITHIN),
                relay.stats.accepted.load(Ordering::Relaxed),
                relay.stats.flows_stuck.load(Ordering::Relaxed),
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let served = first_failure.map_or(Duration::ZERO, |at| at.elapsed());
    eprintln!(
        "[{name}] idle flows stuck: {} probes, {} failed; served again {} after the first failed ({} after the stick); the relay had {} new connections since",
        probes.len(),
        probes.iter().filter(|(_, ok)| !ok).count(),
        ms(served),
        ms(stuck.elapsed()),
        relay.stats.accepted.load(Ordering::Relaxed) - opened,
    );
    assert!(
        first_failure.is_some(),
        "[{name}] a probe on the stuck flows failed (else the fault was not there)"
    );
    assert!(
        relay.stats.accepted.load(Ordering::Relaxed) > opened,
        "[{name}] stockgate gave the stuck flows up and opened new connections"
    );
    (served, probes)
}

/// Settles the probe DEDUCTs that were not answered (the same id again,
/// until it gets a code), and checks their books on `sku`: each deducted
/// once, whatever its first send came to. `stock` reads the sku's stock
/// from Redis directly.
async fn settle_probes(
    server: &Server,
    sku: &str,
    initial: i64,
    probes: &[(String, bool)],
    stock: impl Fn() -> i64,
) {
    let mut conn = crate::support::client(server, false).await;
    for (id, answered) in probes.iter().filter(|(_, answered)| !answered) {
        let started = Instant::now();
        let reply = loop {
            match crate::support::deduct(&mut conn, sku, "1", id, None).await {
                Ok(value) => break crate::support::parse(value),
                Err(err) if started.elapsed() > SERVED_WITHIN => {
                    panic!("probe {id} never settled: {err:?}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        assert!(
            matches!(reply.code, 0 | 1),
            "probe {id} (answered {answered}): {reply:?}"
        );
    }
    assert_eq!(
        initial - stock(),
        probes.len() as i64,
        "each probe deducted once"
    );
}

/// A load of DEDUCTs for a stockgate in front of one standalone Redis,
/// where the fault checker (which reads a cluster's slots) doesn't go:
/// `clients` connections, each keeping `depth` chains going. A chain is
/// one request_id on one sku, sent again with the same id after every
/// error until it gets a code, as callers are told to.
struct Deductions {
    name: String,
    skus: Vec<String>,
    initial: i64,
    clients: usize,
    depth: usize,
}

/// One attempt: its chain's request_id, sku, qty, and its answer (`Ok`
/// the code, `Err` the error's text).
struct Sent {
    id: String,
    sku: usize,
    qty: i64,
    answer: Result<i64, String>,
}

struct Running {
    stop: CancellationToken,
    give_up: Arc<std::sync::OnceLock<Instant>>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Sent>>>,
}

impl Deductions {
    async fn start(&self, server: &Server) -> Running {
        let stop = CancellationToken::new();
        let give_up = Arc::new(std::sync::OnceLock::new());
        let mut tasks = Vec::new();
        for client in 0..self.clients {
            let conn = crate::support::client(server, false).await;
            let (stop, give_up) = (stop.clone(), give_up.clone());
            let (name, skus, depth) = (self.name.clone(), self.skus.len(), self.depth);
            let skus_named = self.skus.clone();
            tasks.push(tokio::spawn(async move {
                let lanes = (0..depth).map(|lane| {
                    let mut conn = conn.clone();
                    let (stop, give_up, name) = (stop.clone(), give_up.clone(), name.clone());
                    let skus_named = skus_named.clone();
                    async move {
                        let mut sent = Vec::new();
                        let mut chain = 0;
                        while !stop.is_cancelled() {
                            let id = format!("{name}-{client}-{lane}-{chain}");
                            let sku = (client * 7 + lane * 3 + chain) % skus;
                            let qty = 1 + (chain % 3) as i64;
                            loop {
                                let reply = crate::support::deduct(
                                    &mut conn,
                                    &skus_named[sku],
                                    &qty.to_string(),
                                    &id,
                                    None,
                                )
                                .await;
                                let answer = reply
                                    .map(|v| crate::support::parse(v).code)
                                    .map_err(|e| e.to_string());
                                let settled = answer.is_ok();
                                sent.push(Sent {
                                    id: id.clone(),
                                    sku,
                                    qty,
                                    answer,
                                });
                                let gave_up = give_up
                                    .get()
                                    .is_some_and(|at: &Instant| Instant::now() > *at);
                                if settled || gave_up {
                                    break;
                                }
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            chain += 1;
                        }
                        sent
                    }
                });
                futures_util::future::join_all(lanes)
                    .await
                    .into_iter()
                    .flatten()
                    .collect()
            }));
        }
        Running {
            stop,
            give_up,
            tasks,
        }
    }
}

impl Running {
    /// Stops new chains; those under way retry until they settle, within
    /// `settle_within`.
    async fn stop(self, settle_within: Duration) -> Vec<Sent> {
        let _ = self.give_up.set(Instant::now() + settle_within);
        self.stop.cancel();
        let mut sent = Vec::new();
        for task in self.tasks {
            sent.extend(task.await.expect("a load task"));
        }
        sent
    }
}

/// The audit of a [`Deductions`] load against what Redis holds: every
/// chain settled with one code 0 at most (a 1 only after an attempt whose
/// outcome was unknown), its record a deduction of its qty, and each sku's
/// stock down by exactly the sum of its chains' qty. The violations.
fn audit(load: &Deductions, sent: &[Sent], node: &stockgate::dev::RedisNode) -> Vec<String> {
    let mut violations = Vec::new();
    let mut chains: HashMap<&str, Vec<&Sent>> = HashMap::new();
    for attempt in sent {
        chains.entry(&attempt.id).or_default().push(attempt);
    }
    let mut conn = node.connection().expect("the node");
    let mut taken = vec![0i64; load.skus.len()];
    for (id, attempts) in &chains {
        let codes: Vec<i64> = attempts
            .iter()
            .filter_map(|a| a.answer.clone().ok())
            .collect();
        let first = attempts[0];
        if codes.is_empty() {
            violations.push(format!("{id} never settled"));
            continue;
        }
        if codes.iter().any(|c| !matches!(c, 0 | 1)) {
            violations.push(format!("{id} answered {codes:?}"));
        }
        if codes.iter().filter(|c| **c == 0).count() > 1 {
            violations.push(format!("{id} answered 0 twice: deducted twice?"));
        }
        if first.answer == Ok(1) {
            violations.push(format!("{id} answered 1 at its first send"));
        }
        let record: Option<String> = redis::cmd("GET")
            .arg(crate::support::record_key(&load.skus[first.sku], id))
            .query(&mut conn)
            .expect("GET a record");
        match record.as_deref().map(crate::support::summary) {
            Some(summary) if summary == format!("D:{}:", first.qty) => {}
            other => violations.push(format!("{id}: record {other:?}")),
        }
        taken[first.sku] += first.qty;
    }
    for (sku, taken) in load.skus.iter().zip(taken) {
        let stock: i64 = redis::cmd("GET")
            .arg(crate::support::stock_key(sku))
            .query(&mut conn)
            .expect("GET stock");
        if load.initial - stock != taken {
            violations.push(format!(
                "{sku}: stock went down by {}, its chains deducted {taken}",
                load.initial - stock
            ));
        }
    }
    violations
}

/// The attempts by answer, for the report.
fn by_answer(sent: &[Sent]) -> Vec<(String, usize)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for attempt in sent {
        let label = match &attempt.answer {
            Ok(code) => format!("code {code}"),
            Err(text) => crate::checker::fault_kind("UPSTREAM", text).to_owned(),
        };
        *counts.entry(label).or_default() += 1;
    }
    let mut counts: Vec<(String, usize)> = counts.into_iter().collect();
    counts.sort();
    counts
}

/// Issue 23, 2, as the reviewer ran it (lighter): a standalone Redis behind
/// a relay whose flows stick for good under load, then again while idle.
/// The load settles (its retries are served again), idle probes are
/// served again within a few seconds of the first that failed, and every
/// deduction happened once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_flow_is_given_up_standalone() {
    let _serial = SERIAL.lock().await;
    let redis = crate::support::standalone();
    let relay = Relay::start(format!("127.0.0.1:{}", redis.node.port).parse().unwrap()).await;
    let load = Deductions {
        name: "stuckflow_standalone".into(),
        skus: (0..8)
            .map(|i| format!("stuckflow_standalone-{i}"))
            .collect(),
        initial: 1_000_000,
        clients: 16,
        depth: 8,
    };
    let probe_sku = "stuckflow_standalone-probe";
    let mut direct = redis.node.connection().expect("the node");
    for sku in load.skus.iter().map(String::as_str).chain([probe_sku]) {
        redis::cmd("SET")
            .arg(crate::support::stock_key(sku))
            .arg(load.initial)
            .query::<()>(&mut direct)
            .expect("SET stock");
    }
    let server = stockgate(vec![format!("redis://127.0.0.1:{}", relay.port)], TIMEOUT).await;

    let running = load.start(&server).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let opened = relay.stats.accepted.load(Ordering::Relaxed);
    relay.set(Mode::StickFlows);
    let stuck = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sent = running.stop(SERVED_WITHIN).await;
    let settled = stuck.elapsed();
    eprintln!(
        "[stuckflow_standalone] flows stuck under load ({} clients x {}): {} attempts {:?}; the load settled {} after the stick; {} flows stuck, {} new connections",
        load.clients,
        load.depth,
        sent.len(),
        by_answer(&sent),
        ms(settled),
        relay.stats.flows_stuck.load(Ordering::Relaxed),
        relay.stats.accepted.load(Ordering::Relaxed) - opened,
    );
    assert!(
        sent.iter().any(|a| a.answer.is_err()),
        "the stuck flows failed requests (else the fault was not there)"
    );

    let (_, probes) =
        stick_idle_then_probe(&relay, &server, probe_sku, "stuckflow_standalone").await;
    settle_probes(&server, probe_sku, load.initial, &probes, || {
        redis::cmd("GET")
            .arg(crate::support::stock_key(probe_sku))
            .query(&mut redis.node.connection().unwrap())
            .unwrap()
    })
    .await;
    let violations = audit(&load, &sent, &redis.node);
    assert!(
        violations.is_empty(),
        "{} violations, e.g. {:?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    server.stop_now();
}

/// Issue 23, 2 on a cluster: one primary behind the relay (it announces
/// the relay's port, so the node pipe and the cluster client both go
/// through it), its flows stuck for good under the checker's load, then
/// again while idle. The load on it settles, the other shards are
/// untouched, idle probes are served again, and the audit is green.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_flow_is_given_up_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let victim = 0;
    let (fault, rest) = lanes(&cluster, "stuckflow", victim);
    let probe_sku = skus_where(&cluster, "stuckflow_probe", 1, |o| o == victim).remove(0);
    let initial = 1_000_000;
    seed(&cluster, std::slice::from_ref(&probe_sku), initial);
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
    let server = stockgate(seeds, TIMEOUT).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let opened = relay.stats.accepted.load(Ordering::Relaxed);
    relay.set(Mode::StickFlows);
    let stuck = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);
    let during: Vec<_> = fault_history
        .attempts
        .iter()
        .filter(|a| a.started >= stuck)
        .collect();
    let others: Vec<_> = rest_history
        .attempts
        .iter()
        .filter(|a| a.started >= stuck)
        .collect();
    eprintln!(
        "[stuckflow] flows stuck under load: this shard {:?}; other shards {:?} {}; {} flows stuck, {} new connections",
        fault_history.by_label(during.iter().copied()),
        rest_history.by_label(others.iter().copied()),
        rest_history.latency(others.iter().copied()),
        relay.stats.flows_stuck.load(Ordering::Relaxed),
        relay.stats.accepted.load(Ordering::Relaxed) - opened,
    );
    eprintln!(
        "[stuckflow] errors on the shard relative to the stick: {}",
        fault_history.error_spans(stuck)
    );
    assert!(
        during.iter().any(|a| !a.outcome.is_code()),
        "the stuck flows failed requests (else the fault was not there)"
    );
    assert_other_shards_served(&others, "stuck flows");

    let (_, probes) = stick_idle_then_probe(&relay, &server, &probe_sku, "stuckflow").await;
    let stock = || -> i64 {
        redis::cmd("GET")
            .arg(crate::support::stock_key(&probe_sku))
            .query(&mut cluster.nodes[victim].connection().unwrap())
            .unwrap()
    };
    settle_probes(&server, &probe_sku, initial, &probes, stock).await;
    audit_lanes_and_stop(
        &cluster,
        server,
        (&fault_history, Policy::default()),
        &rest_history,
    );
}

//! Acknowledged deductions lost in a failover, with and without
//! `--wait-replicas`, measured the way Jepsen does: cut the replication
//! link, keep writing, kill the primary, promote the replica that missed
//! those writes.
//!
//! Without WAIT every deduction acknowledged after the cut is gone after
//! the promotion: Redis replicates asynchronously. With `--wait-replicas 1`
//! none may be: a write no replica confirmed is answered `-UPSTREAM not
//! replicated`, never a code, and its retry settles on the new primary.
//! The killed primary then comes back as the new primary's replica, so WAIT
//! can be satisfied again and every request settles.

use crate::checker::{Audit, Policy};
use crate::harness::*;
use crate::relay::{Mode, Relay};
use std::time::{Duration, Instant};
use stockgate::config::Durability;

/// Runs the experiment; returns the audits of the faulted shard's load
/// (lost acknowledgements counted, not failed) and of the other shards'.
async fn failover_after_replication_cut(name: &str, wait: Option<Durability>) -> (Audit, Audit) {
    let mut cluster = cluster(1000, &[]);
    let victim = 0;
    let replica = replica_of(&cluster, victim);
    let (fault, rest) = lanes(&cluster, name, victim);
    // The primary behind a relay: its replica reconnects to the announced
    // port, so the replication link goes through the relay too.
    let relay = Relay::start(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let relayed = Instant::now() + Duration::from_secs(20);
    while info_field(&cluster.nodes[replica], "replication", "master_port")
        != Some(relay.port.to_string())
        || info_field(&cluster.nodes[replica], "replication", "master_link_status").as_deref()
            != Some("up")
    {
        assert!(
            Instant::now() < relayed,
            "the replica replicates through the relay"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let seeds: Vec<String> = cluster.nodes[1..].iter().map(|n| n.url()).collect();
    let server = stockgate_with(seeds, TIMEOUT, wait).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let cut = Instant::now();
    relay.set(Mode::Partition);
    let down = Instant::now() + Duration::from_secs(5);
    while info_field(&cluster.nodes[replica], "replication", "master_link_status").as_deref()
        != Some("down")
    {
        assert!(Instant::now() < down, "the replication link is cut");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Writes the primary accepts now never reach the replica.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    // The old primary comes back (empty: no persistence here) and rejoins
    // as the new primary's replica.
    let replicated_again = rejoin(&mut cluster, victim, replica);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    let acked_in_cut = fault_history
        .attempts
        .iter()
        .filter(|a| a.ended() >= cut && a.ended() < killed)
        .filter(|a| matches!(a.outcome.code(), Some(0 | 1)))
        .count();
    let in_cut = fault_history
        .attempts
        .iter()
        .filter(|a| a.ended() >= cut && a.ended() < killed);
    eprintln!(
        "[{name}] --wait-replicas {}: replication cut for {} before the kill; the shard answered {:?} meanwhile ({acked_in_cut} acknowledged); promoted {} after the kill; a replica again {} after the promotion",
        wait.map_or("off".to_owned(), |d| format!(
            "{} --wait-timeout {}",
            d.replicas,
            ms(d.timeout)
        )),
        ms(killed - cut),
        fault_history.by_label(in_cut),
        ms(promoted - killed),
        ms(replicated_again - promoted),
    );
    eprintln!(
        "[{name}] errors on the shard relative to the cut: {}",
        fault_history.error_spans(cut)
    );
    let fault_audit = fault_history.audit(
        &cluster,
        Policy {
            allow_lost_acks: true,
        },
    );
    let rest_audit = rest_history.audit(&cluster, Policy::default());
    server.stop_now();
    (fault_audit, rest_audit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_deductions_lost_in_failover_without_wait() {
    let _serial = SERIAL.lock().await;
    let (fault, rest) = failover_after_replication_cut("nowait", None).await;
    fault.assert_green();
    rest.assert_green();
    eprintln!(
        "[nowait] acknowledged changes lost in the failover: {} (of {} request_ids)",
        fault.lost_acks, fault.ids
    );
    assert!(
        fault.lost_acks > 0,
        "the experiment can lose acknowledged writes (else it proves nothing for WAIT)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_deduction_lost_in_failover_with_wait() {
    let _serial = SERIAL.lock().await;
    let (fault, rest) = failover_after_replication_cut("wait", Some(WAIT_ONE)).await;
    fault.assert_green();
    rest.assert_green();
    eprintln!(
        "[wait] acknowledged changes lost in the failover: {} (of {} request_ids)",
        fault.lost_acks, fault.ids
    );
    assert_eq!(
        fault.lost_acks, 0,
        "--wait-replicas 1 loses no acknowledged deduction"
    );
}

/// With `--wait-replicas`, the retry of a write no replica confirmed must
/// not be acknowledged either while the replica still can't confirm it: a
/// code 1 says "deducted", and the caller proceeds as if the deduction were
/// as safe as any other. Here the replica is cut off, the retry is
/// answered, and then the primary dies: the answer must not have been an
/// acknowledgement of a deduction the new primary never had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_not_acknowledged_before_its_write_is_replicated() {
    let _serial = SERIAL.lock().await;
    let mut cluster = cluster(1000, &[]);
    let victim = 0;
    let replica = replica_of(&cluster, victim);
    let sku = skus_where(&cluster, "unconfirmed", 1, |o| o == victim).remove(0);
    seed(&cluster, std::slice::from_ref(&sku), 100);
    let relay = Relay::start(
        format!("127.0.0.1:{}", cluster.nodes[victim].port)
            .parse()
            .unwrap(),
    )
    .await;
    announce_port(&cluster, victim, relay.port);
    let relayed = Instant::now() + Duration::from_secs(20);
    while info_field(&cluster.nodes[replica], "replication", "master_port")
        != Some(relay.port.to_string())
    {
        assert!(
            Instant::now() < relayed,
            "the replica replicates through the relay"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let seeds: Vec<String> = cluster.nodes[1..].iter().map(|n| n.url()).collect();
    let server = stockgate_with(seeds, TIMEOUT, Some(WAIT_ONE)).await;
    let mut conn = crate::support::client(&server, false).await;
    relay.set(Mode::Partition);
    let down = Instant::now() + Duration::from_secs(5);
    while info_field(&cluster.nodes[replica], "replication", "master_link_status").as_deref()
        != Some("down")
    {
        assert!(Instant::now() < down, "the replication link is cut");
        std::thread::sleep(Duration::from_millis(10));
    }

    let first = crate::support::deduct(&mut conn, &sku, "5", "unconfirmed-1", None).await;
    let first = first.expect_err("no replica can confirm the write");
    assert!(
        first
            .detail()
            .unwrap_or_default()
            .starts_with("not replicated"),
        "{first:?}"
    );
    // The primary has applied it; the replica has not. A retry now:
    let retry = crate::support::deduct(&mut conn, &sku, "5", "unconfirmed-1", None).await;
    eprintln!("[unconfirmed] first: -{first:?}; retry while still unreplicated: {retry:?}");
    // The primary dies; the replica, which never had the write, takes over.
    cluster.nodes[victim].kill();
    wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    let mut new_primary = cluster.nodes[replica].connection().unwrap();
    let record: Option<String> = redis::cmd("GET")
        .arg(crate::support::record_key(&sku, "unconfirmed-1"))
        .query(&mut new_primary)
        .unwrap();
    eprintln!("[unconfirmed] after the failover the new primary holds {record:?}");
    assert_eq!(record, None, "the write was on the old primary only");
    match retry {
        Err(err) => assert!(
            err.detail()
                .unwrap_or_default()
                .starts_with("not replicated"),
            "{err:?}"
        ),
        Ok(value) => panic!(
            "the retry acknowledged a deduction no replica had, and the failover lost it: {:?}",
            crate::support::parse(value)
        ),
    }
    server.stop_now();
}

/// With `--wait-replicas`, a shard whose replica is gone answers each
/// write `-UPSTREAM not replicated` after `--wait-timeout`, and goes on
/// serving as fast as that. WAIT blocks the connection it is sent on; sent
/// per request on the one shared connection per node, each unconfirmed
/// write held all the others for the whole wait-timeout and most requests
/// timed out at `--timeout` (82 of 86). The node pipes now end each batch
/// with one WAIT (a group commit), so a batch costs one wait-timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replica_writes_fail_fast_as_not_replicated() {
    let _serial = SERIAL.lock().await;
    let mut cluster = cluster(2000, &[]);
    let victim = 0;
    let (mut fault, rest) = lanes(&cluster, "noreplica", victim);
    fault.settle_within = Duration::from_secs(5);
    fault.seed(&cluster);
    rest.seed(&cluster);
    let server = stockgate_with(cluster.seeds(), TIMEOUT, Some(WAIT_ONE)).await;
    let replica = replica_of(&cluster, victim);
    cluster.nodes[replica].kill();
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);
    eprintln!(
        "[noreplica] this shard: {:?}, {}; other shards: {:?}",
        fault_history.by_label(fault_history.attempts.iter()),
        fault_history.latency(fault_history.attempts.iter()),
        rest_history.by_label(rest_history.attempts.iter()),
    );
    let slow: Vec<_> = fault_history
        .attempts
        .iter()
        .filter(|a| a.outcome.label() != "not_replicated")
        .collect();
    assert!(
        slow.is_empty(),
        "{} of {} requests were not a fast 'not replicated': {:?}",
        slow.len(),
        fault_history.attempts.len(),
        fault_history.by_label(slow.iter().copied())
    );
    server.stop_now();
}

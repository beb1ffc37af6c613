//! The checker itself, on each server of the upstream matrix: a load with
//! no fault must audit green with nothing but business codes, and
//! violations planted behind stockgate's back must each be found.
//!
//! The audit reads the servers directly (SCAN on every primary, GET, PTTL,
//! CLUSTER NODES for slot ownership), so this is what shows that it reads
//! Valkey as faithfully as Redis: a checker that read nothing would pass
//! every fault test.

use crate::checker::{Op, Outcome, Policy, Workload};
use crate::harness::*;
use std::time::Duration;

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_quiet_load_audits_green_and_planted_violations_are_caught }
async fn a_quiet_load_audits_green_and_planted_violations_are_caught(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("quiet-{kind}");
    let cluster = cluster_of(kind, 2000, &[]);
    let skus = skus_on_every_primary(&cluster, &name, 2);
    let mut load = Workload::new(&name, skus.clone(), TIMEOUT);
    load.clients = 8;
    load.seed(&cluster);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let running = load.start(server.addr).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let history = running.stop().await;
    server.stop_now();

    let audit = history.audit(&cluster, Policy::default());
    audit.assert_green();
    let faults: Vec<_> = audit
        .by_label
        .iter()
        .filter(|(label, _)| !label.starts_with("code"))
        .collect();
    assert!(faults.is_empty(), "no fault, yet errors: {faults:?}");
    assert!(
        audit.units_recorded > 0 && audit.units_recorded == audit.units_taken,
        "the load deducted, and the audit accounted for it: {}",
        audit.summary()
    );

    // Three violations behind stockgate's back, one of each kind the audit
    // reads from the servers.
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    redis::cmd("DECRBY")
        .arg(crate::support::stock_key(&skus[0]))
        .arg(1)
        .query::<()>(&mut conn)
        .expect("DECRBY");
    let forged = crate::support::record_key(&skus[1], "never-sent");
    redis::cmd("SET")
        .arg(&forged)
        .arg("D:1:x")
        .arg("PX")
        .arg(600_000)
        .query::<()>(&mut conn)
        .expect("SET a forged record");
    let applied = history
        .attempts
        .iter()
        .find(|a| a.op == Op::Deduct && matches!(a.outcome, Outcome::Code { code: 0, .. }))
        .expect("a DEDUCT answered 0");
    let (sku, id) = (history.sku_name(applied.sku), &*applied.id);
    let persisted: i64 = redis::cmd("PERSIST")
        .arg(crate::support::record_key(sku, id))
        .query(&mut conn)
        .expect("PERSIST");
    assert_eq!(persisted, 1, "the record of {sku} {id} had a TTL to remove");

    let audit = history.audit(&cluster, Policy::default());
    eprintln!("{} (after planting three)", audit.summary());
    let expected = [
        format!("{}: conservation broken", skus[0]),
        format!(
            "{} never-sent: a record for a request_id never sent",
            skus[1]
        ),
        format!("{sku} {id}: record without a TTL"),
    ];
    for want in &expected {
        assert!(
            audit
                .violations
                .iter()
                .any(|v| v.starts_with(want.as_str())),
            "the audit missed {want:?}; it found {:?}",
            audit.violations
        );
    }
    assert_eq!(
        audit.violations.len(),
        expected.len(),
        "only the planted violations: {:?}",
        audit.violations
    );
}

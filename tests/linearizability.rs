//! Linearizability, checked by a tool nobody here wrote (issue 23): many
//! clients send DEDUCT, retried DEDUCT, REVERT, HOLD, CONFIRM and STOCK.GET
//! on a few SKUs through two stockgates in front of a real cluster, each
//! request recorded with its call and return times, and porcupine
//! (`tests/linearizability/`, in Go) checks that every answer was possible
//! in one order consistent with real time, against a sequential model of
//! the contract. The fault suite runs the same load under a killed
//! primary, `CLUSTER FAILOVER` and live resharding, on Redis and Valkey
//! (`tests/faults/linear.rs`). SKUs kept by location (docs/locations.md)
//! have their own load and model: allocations, extensions and shrinks.
//! Both tests share one cluster.

mod support;

use support::history::{Load, LocatedLoad, Verdict, record, record_located};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_through_two_stockgates_are_linearizable() {
    let cluster = shared_cluster();
    let load = Load {
        skus: (0..4).map(|i| format!("lin-{i}")).collect(),
        initial_stock: 40,
        clients: 16,
        ops_per_client: 60,
        pause: std::time::Duration::ZERO,
        seed: std::env::var("STOCKGATE_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed),
    };
    for sku in &load.skus {
        set_stock(cluster, sku, load.initial_stock);
    }
    let a = proxy(cluster.seeds(), |_| {}).await;
    let b = proxy(cluster.seeds(), |_| {}).await;
    let history = record(&[a.addr, b.addr], &load).await;
    let answers = history.answers();
    eprintln!(
        "[linearizability] {} requests: {answers:?}",
        history.ops.len()
    );
    // The load meets the contract's interesting cells: shortage, retries,
    // revokes.
    for (cell, what) in [
        ("deduct Some(2)", "a DEDUCT short of stock"),
        ("deduct Some(1)", "a retried DEDUCT"),
        ("revert Some(4)", "an empty rollback"),
        ("hold Some(0)", "a HOLD"),
        ("confirm Some(0)", "a CONFIRM"),
    ] {
        assert!(answers.contains_key(cell), "no {what} in {answers:?}");
    }
    assert_eq!(history.check("no-faults"), Verdict::Linearizable);

    // The checker is not a rubber stamp: one answer off by one unit.
    let flipped = history.with_one_answer_flipped();
    assert!(
        matches!(flipped.check("no-faults-flipped"), Verdict::Illegal(_)),
        "one wrong remain must make the history illegal"
    );
}

/// The same for SKUs kept by location: 8 clients send DEDUCT.AT and
/// HOLD.AT (SPLIT and WHOLE over two locations with a floor), their
/// retries, REVERT, CONFIRM, HOLD.EXTEND, HOLD.SHRINK (each change sent
/// again at times) and STOCK.LOCATIONS on two SKUs through two
/// stockgates, and porcupine checks every code, remain, allocation and
/// location read against the model of `lua/allocate.lua`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_by_location_through_two_stockgates_are_linearizable() {
    let cluster = shared_cluster();
    let a = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
    let b = proxy(cluster.seeds(), |_| {}).await;
    let load = LocatedLoad {
        skus: (0..2).map(|i| format!("lin-loc-{i}")).collect(),
        places: vec![("w1".into(), 40, 3), ("w2".into(), 20, 0)],
        clients: 8,
        ops_per_client: 50,
        seed: std::env::var("STOCKGATE_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x10c5),
    };
    let mut setup = client(&a, false).await;
    for sku in &load.skus {
        for (i, (name, units, floor)) in load.places.iter().enumerate() {
            let set: redis::Value = redis::cmd("STOCK.SET")
                .arg(sku)
                .arg(units)
                .arg(format!("s{i}"))
                .arg("AT")
                .arg(name)
                .arg("FLOOR")
                .arg(floor)
                .query_async(&mut setup)
                .await
                .unwrap();
            assert_eq!(parse(set).code, 0, "{sku} {name}");
        }
    }
    let history = record_located(&[a.addr, b.addr], &load).await;
    let answers = history.answers();
    eprintln!(
        "[linearizability] {} requests by location: {answers:?}",
        history.ops.len()
    );
    for (cell, what) in [
        ("deduct_at Some(0)", "an allocation"),
        ("deduct_at Some(1)", "a retried allocation"),
        ("deduct_at Some(2)", "an allocation short above the floors"),
        ("hold_at Some(0)", "a HOLD.AT"),
        ("confirm Some(0)", "a CONFIRM"),
        ("revert Some(0)", "a REVERT"),
        ("revert Some(4)", "an empty rollback"),
        ("extend Some(0)", "an extension"),
        ("shrink Some(0)", "a shrink"),
        ("locations Some(0)", "a STOCK.LOCATIONS"),
    ] {
        assert!(answers.contains_key(cell), "no {what} in {answers:?}");
    }
    assert_eq!(history.check("by-location"), Verdict::Linearizable);

    // The model checks where the units came from, not only how many.
    let moved = history
        .with_one_allocation_moved()
        .expect("an allocation from one location");
    assert!(
        matches!(moved.check("by-location-moved"), Verdict::Illegal(_)),
        "an allocation from a location the call did not name must make the history illegal"
    );
}

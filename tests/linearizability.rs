//! Linearizability, checked by a tool nobody here wrote (issue 23): many
//! clients send DEDUCT, retried DEDUCT, REVERT, HOLD, CONFIRM and STOCK.GET
//! on a few SKUs through two stockgates in front of a real cluster, each
//! request recorded with its call and return times, and porcupine
//! (`tests/linearizability/`, in Go) checks that every answer was possible
//! in one order consistent with real time, against a sequential model of
//! the contract. The fault suite runs the same load under a killed
//! primary, `CLUSTER FAILOVER` and live resharding, on Redis and Valkey
//! (`tests/faults/linear.rs`).

mod support;

use support::history::{Load, Verdict, record};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_through_two_stockgates_are_linearizable() {
    let cluster = cluster();
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
        set_stock(&cluster, sku, load.initial_stock);
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

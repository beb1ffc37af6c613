//! `--wait-replicas`: a write stands only once replicas confirm it.

mod support;

use std::time::Duration;
use stockgate::config::Durability;
use stockgate::dev::{LocalCluster, RedisOptions};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_replicas_and_unconfirmed_ones_are_retryable_errors() {
    let mut cluster =
        LocalCluster::start(1, 1, &RedisOptions::default()).expect("a primary and a replica");
    set_stock(&cluster, "durable", 10);
    let server = proxy(cluster.seeds(), |c| {
        c.upstream.durability = Some(Durability {
            replicas: 1,
            timeout: Duration::from_millis(200),
        });
    })
    .await;
    let mut conn = client(&server, false).await;

    // Confirmed by the replica: a normal reply, and the replica has it.
    let reply = parse(
        deduct(&mut conn, "durable", "2", "w1", Some("ORD-1"))
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 8));
    let mut replica = cluster.nodes[1].connection().unwrap();
    redis::cmd("READONLY").query::<()>(&mut replica).unwrap();
    let on_replica: Option<String> = redis::cmd("GET")
        .arg(record_key("durable", "w1"))
        .query(&mut replica)
        .unwrap();
    assert_eq!(
        on_replica.as_deref().map(summary).as_deref(),
        Some("D:2:ORD-1"),
        "WAIT returned only after the replica had it"
    );

    // No replica to confirm: the write happened on the primary, but the
    // caller is told it may not last, as a retryable fault.
    cluster.nodes[1].kill();
    let err = deduct(&mut conn, "durable", "3", "w2", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("UPSTREAM"), "{err:?}");
    let text = err.detail().unwrap();
    assert!(
        text.starts_with("not replicated: 0 of 1 replicas"),
        "{text}"
    );
    assert!(
        text.contains("retrying with the same request_id is safe"),
        "{text}"
    );
    // The retry finds the write on the primary, but no replica has it yet:
    // acknowledging it (code 1) would let a failover lose an acknowledged
    // deduction, so it is still not replicated. The stock changed once.
    let err = deduct(&mut conn, "durable", "3", "w2", None)
        .await
        .unwrap_err();
    assert!(
        err.detail().unwrap().starts_with("not replicated"),
        "{err:?}"
    );
    let mut primary = cluster.nodes[0].connection().unwrap();
    let stock: i64 = redis::cmd("GET")
        .arg(stock_key("durable"))
        .query(&mut primary)
        .unwrap();
    assert_eq!(stock, 5);
    // Replies that state nothing don't wait: insufficient stock still
    // answers with no replica.
    let short = parse(
        deduct(&mut conn, "durable", "99", "w3", None)
            .await
            .unwrap(),
    );
    assert_eq!(short.code, 2);
    // Once a replica has it, the retry is a duplicate.
    cluster.nodes[1].restart().unwrap();
    let mut retry = None;
    for _ in 0..100 {
        if let Ok(value) = deduct(&mut conn, "durable", "3", "w2", None).await {
            retry = Some(parse(value));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let retry = retry.expect("confirmed once the replica is back");
    assert_eq!((retry.code, retry.remain), (1, 5));
    let metrics = server.shared().metrics.render();
    // The write and its retry, at least (more while the replica resyncs).
    let not_replicated: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("stockgate_upstream_errors_total{kind=\"not_replicated\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(not_replicated >= 2.0, "{metrics}");
}

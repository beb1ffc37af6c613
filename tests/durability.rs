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
        on_replica.as_deref(),
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
    // The retry finds the write on the primary: a duplicate, stock changed once.
    let retry = parse(deduct(&mut conn, "durable", "3", "w2", None).await.unwrap());
    assert_eq!((retry.code, retry.remain), (1, 5));
    // Replies that wrote nothing don't wait: insufficient stock still answers.
    let short = parse(
        deduct(&mut conn, "durable", "99", "w3", None)
            .await
            .unwrap(),
    );
    assert_eq!(short.code, 2);
    let metrics = server.shared().metrics.render();
    assert!(
        metrics.contains("stockgate_upstream_errors_total{kind=\"not_replicated\"} 1"),
        "{metrics}"
    );
}

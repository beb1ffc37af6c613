//! Many clients at once: the stock must add up exactly.

mod support;

use futures_util::future::join_all;
use std::collections::HashMap;
use support::*;

/// Opens `n` separate connections to stockgate.
async fn connections(
    server: &stockgate::server::Server,
    n: usize,
) -> Vec<redis::aio::MultiplexedConnection> {
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        all.push(client(server, i % 2 == 1).await);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_racing_deductions_sell_exactly_the_stock() {
    let cluster = cluster();
    set_stock(&cluster, "hot-sku", 100);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let conns = connections(&server, 50).await;

    let calls = (0..1000).map(|i| {
        let mut conn = conns[i % conns.len()].clone();
        tokio::spawn(async move {
            parse(
                deduct(
                    &mut conn,
                    "hot-sku",
                    "1",
                    &format!("order-{i}"),
                    Some(&format!("ORD-{i}")),
                )
                .await
                .unwrap(),
            )
        })
    });
    let replies: Vec<Reply> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    let mut by_code: HashMap<i64, usize> = HashMap::new();
    for reply in &replies {
        *by_code.entry(reply.code).or_default() += 1;
    }
    assert_eq!(by_code.get(&0), Some(&100), "codes: {by_code:?}");
    assert_eq!(by_code.get(&2), Some(&900), "codes: {by_code:?}");
    assert_eq!(get_stock(&cluster, "hot-sku"), Some(0));
    // Every success saw a distinct remaining stock: 99 down to 0.
    let mut remains: Vec<i64> = replies
        .iter()
        .filter(|r| r.code == 0)
        .map(|r| r.remain)
        .collect();
    remains.sort_unstable();
    assert_eq!(remains, (0..100).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_id_sent_fifty_times_at_once_deducts_once() {
    let cluster = cluster();
    set_stock(&cluster, "retry-sku", 10);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let conns = connections(&server, 10).await;

    let calls = (0..50).map(|i| {
        let mut conn = conns[i % conns.len()].clone();
        tokio::spawn(async move {
            parse(
                deduct(
                    &mut conn,
                    "retry-sku",
                    "3",
                    "the-one-request",
                    Some("ORD-1"),
                )
                .await
                .unwrap(),
            )
        })
    });
    let replies: Vec<Reply> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    assert_eq!(replies.iter().filter(|r| r.code == 0).count(), 1);
    assert_eq!(replies.iter().filter(|r| r.code == 1).count(), 49);
    for reply in &replies {
        assert_eq!(reply.remain, 7);
        assert_eq!(reply.order_no, "ORD-1");
    }
    assert_eq!(get_stock(&cluster, "retry-sku"), Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_fresh_requests_mixed_over_many_skus_add_up() {
    let cluster = cluster();
    let skus: Vec<String> = (0..20).map(|i| format!("mix-{i}")).collect();
    for sku in &skus {
        set_stock(&cluster, sku, 1000);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let conns = connections(&server, 20).await;

    // 600 distinct requests with qty 1..=5, each sent 1 to 3 times.
    let requests: Vec<(String, String, u64)> = (0..600u64)
        .map(|i| {
            (
                skus[(i % 20) as usize].clone(),
                format!("req-{i}"),
                1 + i % 5,
            )
        })
        .collect();
    let sends = requests.iter().flat_map(|(sku, id, qty)| {
        let times = 1 + (id.len() % 3);
        (0..times).map(move |_| (sku.clone(), id.clone(), *qty))
    });
    let calls = sends.enumerate().map(|(n, (sku, id, qty))| {
        let mut conn = conns[n % conns.len()].clone();
        tokio::spawn(async move {
            (
                id.clone(),
                parse(
                    deduct(&mut conn, &sku, &qty.to_string(), &id, None)
                        .await
                        .unwrap(),
                ),
            )
        })
    });
    let replies: Vec<(String, Reply)> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    let mut applied: HashMap<String, usize> = HashMap::new();
    for (id, reply) in &replies {
        assert!(matches!(reply.code, 0 | 1), "{id}: {reply:?}");
        if reply.code == 0 {
            *applied.entry(id.clone()).or_default() += 1;
        }
    }
    assert_eq!(applied.len(), requests.len(), "every request applied");
    assert!(
        applied.values().all(|&n| n == 1),
        "no request applied twice"
    );
    for sku in &skus {
        let deducted: u64 = requests
            .iter()
            .filter(|(s, _, _)| s == sku)
            .map(|(_, _, q)| q)
            .sum();
        assert_eq!(
            get_stock(&cluster, sku),
            Some(1000 - deducted as i64),
            "{sku}"
        );
    }
}

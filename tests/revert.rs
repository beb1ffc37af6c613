//! REVERT and the request state machine, STOCK.* and --reject-stale-ids,
//! over the wire against a real Redis Cluster and a real Valkey one (every
//! test runs against both: `support::matrix!`).

mod support;

use futures_util::future::join_all;
use redis::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::*;

fn record(cluster: &stockgate::dev::LocalCluster, sku: &str, id: &str) -> (Option<String>, i64) {
    let mut redis = cluster.cluster_connection().unwrap();
    let value: Option<String> = redis::cmd("GET")
        .arg(record_key(sku, id))
        .query(&mut redis)
        .unwrap();
    let value = value.as_deref().map(summary);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(record_key(sku, id))
        .query(&mut redis)
        .unwrap();
    (value, pttl)
}

matrix! { #[tokio::test] async fn every_cell_of_the_state_machine }
async fn every_cell_of_the_state_machine(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "sm", 10);
    let window = Duration::from_secs(3600);
    let server = proxy(cluster.seeds(), |c| c.retry_window = window).await;
    let mut conn = client(&server, false).await;
    let r = |v: Value| parse(v);

    // none + DEDUCT -> DEDUCTED, 0
    let got = r(deduct(&mut conn, "sm", "3", "a", Some("ORD-A"))
        .await
        .unwrap());
    assert_eq!(
        (got.code, got.remain, got.order_no.as_str(), got.version),
        (0, 7, "ORD-A", stockgate::outcome::SCRIPT_VERSION)
    );
    // none + DEDUCT, short -> stays none, 2
    let got = r(deduct(&mut conn, "sm", "99", "short", None).await.unwrap());
    assert_eq!((got.code, got.remain), (2, 7));
    assert_eq!(
        record(&cluster, "sm", "short").0,
        None,
        "a refused DEDUCT records nothing"
    );
    // DEDUCTED + DEDUCT -> 1
    let got = r(deduct(&mut conn, "sm", "3", "a", Some("ORD-A"))
        .await
        .unwrap());
    assert_eq!(
        (got.code, got.remain, got.order_no.as_str()),
        (1, 7, "ORD-A")
    );
    // DEDUCTED + REVERT -> REVERTED, 0, the qty from the record comes back
    let got = r(revert(&mut conn, "sm", "a").await.unwrap());
    assert_eq!(
        (got.code, got.remain, got.order_no.as_str(), got.version),
        (0, 10, "ORD-A", stockgate::outcome::SCRIPT_VERSION)
    );
    let (value, pttl) = record(&cluster, "sm", "a");
    assert_eq!(value.as_deref(), Some("R:3:ORD-A"));
    assert!(pttl > 3_590_000, "a full window from the REVERT: {pttl}");
    // REVERTED + REVERT -> 1, nothing given back twice
    let got = r(revert(&mut conn, "sm", "a").await.unwrap());
    assert_eq!(
        (got.code, got.remain, got.order_no.as_str()),
        (1, 10, "ORD-A")
    );
    // REVERTED + DEDUCT -> 4
    let got = r(deduct(&mut conn, "sm", "3", "a", Some("ORD-A"))
        .await
        .unwrap());
    assert_eq!((got.code, got.remain, got.order_no.as_str()), (4, 10, ""));
    // none + REVERT -> REVOKED, 4 (empty rollback)
    let got = r(revert(&mut conn, "sm", "b").await.unwrap());
    assert_eq!((got.code, got.remain, got.order_no.as_str()), (4, 10, ""));
    assert_eq!(record(&cluster, "sm", "b").0.as_deref(), Some("V:0:"));
    // REVOKED + REVERT -> 1
    let got = r(revert(&mut conn, "sm", "b").await.unwrap());
    assert_eq!((got.code, got.remain), (1, 10));
    // REVOKED + DEDUCT -> 4: the hanging DEDUCT is refused
    let got = r(deduct(&mut conn, "sm", "2", "b", Some("ORD-B"))
        .await
        .unwrap());
    assert_eq!((got.code, got.remain, got.order_no.as_str()), (4, 10, ""));
    assert_eq!(get_stock(&cluster, "sm"), Some(10));
    assert_eq!(record(&cluster, "sm", "b").0.as_deref(), Some("V:0:"));

    // Invalid parameters: 3, before Redis.
    let got = r(revert(&mut conn, "sm", "bad id").await.unwrap());
    assert_eq!((got.code, got.remain), (3, -1));
    assert!(got.reason.unwrap().starts_with("request_id must be"));
    let err = redis::cmd("REVERT")
        .arg("sm")
        .query_async::<Value>(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(
        err.detail(),
        Some("wrong number of arguments for 'revert' command")
    );
}

matrix! { #[tokio::test] async fn a_revert_never_shortens_the_records_ttl }
async fn a_revert_never_shortens_the_records_ttl(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "ttl", 5);
    let server = proxy(cluster.seeds(), |c| {
        c.retry_window = Duration::from_secs(120)
    })
    .await;
    let mut conn = client(&server, false).await;
    parse(deduct(&mut conn, "ttl", "1", "t", None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, aged) = record(&cluster, "ttl", "t");
    parse(revert(&mut conn, "ttl", "t").await.unwrap());
    let (state, after) = record(&cluster, "ttl", "t");
    assert_eq!(state.as_deref(), Some("R:1:"));
    assert!(aged < 119_000, "the DEDUCT's record aged: {aged}");
    assert!(
        after > aged + 1000,
        "TTL {aged} -> {after}: REVERTED gets a full window from the REVERT"
    );
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn racing_deducts_and_reverts_of_the_same_ids_always_add_up }
async fn racing_deducts_and_reverts_of_the_same_ids_always_add_up(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "race", 1_000);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conns = Vec::new();
    for i in 0..8 {
        conns.push(client(&server, i % 2 == 0).await);
    }
    // 200 ids; each gets a DEDUCT and a REVERT sent at the same moment,
    // some ids twice over, in both orders.
    let mut calls = Vec::new();
    for i in 0..200usize {
        let id = format!("race-{i}");
        let qty = 1 + i % 4;
        for n in 0..(1 + i % 2) {
            let mut a = conns[(i + n) % conns.len()].clone();
            let mut b = conns[(i + n + 3) % conns.len()].clone();
            let (id_a, id_b) = (id.clone(), id.clone());
            let deduct_first = (i + n) % 2 == 0;
            calls.push(tokio::spawn(async move {
                let d = async {
                    (
                        "D",
                        parse(
                            deduct(&mut a, "race", &qty.to_string(), &id_a, None)
                                .await
                                .unwrap(),
                        ),
                    )
                };
                let r = async { ("R", parse(revert(&mut b, "race", &id_b).await.unwrap())) };
                if deduct_first {
                    let (x, y) = futures_util::join!(d, r);
                    vec![x, y]
                } else {
                    let (y, x) = futures_util::join!(r, d);
                    vec![x, y]
                }
            }));
        }
    }
    let replies: Vec<(&str, Reply)> = join_all(calls)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    for (command, reply) in &replies {
        assert!([0, 1, 4].contains(&reply.code), "{command}: {reply:?}");
    }
    // From the cluster's records: the stock must equal initial - deducted
    // + reverted, where an id in REVERTED was deducted and given back.
    let mut deducted = 0i64;
    let mut reverted = 0i64;
    let mut redis = cluster.cluster_connection().unwrap();
    for i in 0..200usize {
        let value: Option<String> = redis::cmd("GET")
            .arg(record_key("race", &format!("race-{i}")))
            .query(&mut redis)
            .unwrap();
        let qty = 1 + i as i64 % 4;
        let state = value.as_deref().map(summary);
        match state.as_deref().and_then(|v| v.split(':').next()) {
            Some("D") => deducted += qty,
            Some("R") => {
                deducted += qty;
                reverted += qty;
            }
            Some("V") => {}
            other => panic!("race-{i} has record {other:?}"),
        }
    }
    assert_eq!(
        get_stock(&cluster, "race"),
        Some(1_000 - deducted + reverted)
    );
    // The replies agree with the records: a DEDUCT answered 0 for exactly the
    // ids whose record says D or R.
    let ok_deducts = replies
        .iter()
        .filter(|(c, r)| *c == "D" && r.code == 0)
        .count() as i64;
    let ok_reverts = replies
        .iter()
        .filter(|(c, r)| *c == "R" && r.code == 0)
        .count() as i64;
    assert!(ok_deducts >= ok_reverts);
    assert!(
        ok_deducts > 0 && ok_deducts < 200,
        "both orders happened: {ok_deducts} deducts first"
    );
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_revert_sent_fifty_times_at_once_gives_back_once }
async fn a_revert_sent_fifty_times_at_once_gives_back_once(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "fifty", 20);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    assert_eq!(
        parse(
            deduct(&mut conn, "fifty", "5", "f", Some("ORD-F"))
                .await
                .unwrap()
        )
        .remain,
        15
    );
    let mut conns = Vec::new();
    for _ in 0..10 {
        conns.push(client(&server, false).await);
    }
    let calls = (0..50).map(|i| {
        let mut c = conns[i % conns.len()].clone();
        tokio::spawn(async move { parse(revert(&mut c, "fifty", "f").await.unwrap()) })
    });
    let replies: Vec<Reply> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(replies.iter().filter(|r| r.code == 0).count(), 1);
    assert_eq!(replies.iter().filter(|r| r.code == 1).count(), 49);
    assert!(
        replies
            .iter()
            .all(|r| r.remain == 20 && r.order_no == "ORD-F")
    );
    assert_eq!(get_stock(&cluster, "fifty"), Some(20));
}

matrix! { #[tokio::test] async fn stock_commands_and_the_admin_gate }
async fn stock_commands_and_the_admin_gate(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let closed = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&closed, false).await;
    for cmd in [
        redis::cmd("STOCK.SET")
            .arg("adm")
            .arg(5)
            .arg("op-1")
            .clone(),
        redis::cmd("STOCK.ADD")
            .arg("adm")
            .arg(5)
            .arg("op-2")
            .clone(),
    ] {
        let err = cmd.query_async::<Value>(&mut conn).await.unwrap_err();
        assert_eq!(err.code(), Some("NOPERM"), "{err:?}");
        assert!(err.detail().unwrap().contains("--admin-commands"));
    }
    let nil: Value = redis::cmd("STOCK.GET")
        .arg("adm")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(nil, Value::Nil, "GET is always allowed; no stock is nil");
    assert_eq!(
        get_stock(&cluster, "adm"),
        None,
        "the refused commands wrote nothing"
    );

    let open = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
    let mut conn = client(&open, true).await;
    let change = |command: &str, sku: &str, amount: &str, op_id: &str| {
        redis::cmd(command).arg(sku).arg(amount).arg(op_id).clone()
    };
    let mut run = async |cmd: redis::Cmd| parse(cmd.query_async::<Value>(&mut conn).await.unwrap());
    let set = run(change("STOCK.SET", "adm", "5", "restock-1")).await;
    assert_eq!((set.code, set.remain), (0, 5));
    // The same op sent again (a lost reply, a retrying tool): applied once.
    let again = run(change("STOCK.SET", "adm", "5", "restock-1")).await;
    assert_eq!((again.code, again.remain), (1, 5));
    let added = run(change("STOCK.ADD", "adm", "7", "add-1")).await;
    assert_eq!((added.code, added.remain), (0, 12));
    let again = run(change("STOCK.ADD", "adm", "7", "add-1")).await;
    assert_eq!((again.code, again.remain), (1, 12), "not added twice");
    assert_eq!(get_stock(&cluster, "adm"), Some(12));
    // An op_id reused for another change is refused.
    let reused = run(change("STOCK.ADD", "adm", "8", "add-1")).await;
    assert_eq!(reused.code, 3);
    assert!(reused.reason.unwrap().contains("op_id was already used"));
    let reused = run(change("STOCK.SET", "adm", "7", "add-1")).await;
    assert_eq!(reused.code, 3);
    let emptied = run(change("STOCK.ADD", "adm", "-12", "add-2")).await;
    assert_eq!((emptied.code, emptied.remain), (0, 0));
    let below = run(change("STOCK.ADD", "adm", "-1", "add-3")).await;
    assert_eq!((below.code, below.remain), (2, 0), "never below 0");
    assert_eq!(
        get_stock(&cluster, "adm"),
        Some(0),
        "ADD never lets stock go below 0"
    );
    let fresh = run(change("STOCK.ADD", "new-sku", "3", "add-4")).await;
    assert_eq!(
        (fresh.code, fresh.remain),
        (0, 3),
        "restocking a sku without stock starts from 0"
    );
    for (cmd, value) in [
        ("STOCK.SET", "-1"),
        ("STOCK.SET", "1.5"),
        ("STOCK.ADD", "+1"),
        ("STOCK.ADD", "x"),
    ] {
        let reply = run(change(cmd, "adm", value, "op-x")).await;
        assert_eq!((reply.code, reply.remain), (3, -1), "{cmd} {value}");
    }
    let bad_op = run(change("STOCK.ADD", "adm", "1", "op x")).await;
    assert!(bad_op.reason.unwrap().starts_with("op_id must be"));
    // The old two-argument form is refused: a change without an op_id
    // can't be sent again safely.
    let err = redis::cmd("STOCK.ADD")
        .arg("adm")
        .arg(1)
        .query_async::<Value>(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(
        err.detail(),
        Some("wrong number of arguments for 'stock.add' command")
    );
    let got: i64 = redis::cmd("STOCK.GET")
        .arg("new-sku")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(got, 3);
    let err = redis::cmd("STOCK.GET")
        .arg("bad sku")
        .query_async::<Value>(&mut conn)
        .await
        .unwrap_err();
    assert!(err.detail().unwrap().starts_with("sku must be"));
    // The same key layout as DEDUCT: stock set here is deducted there.
    let reply = parse(
        deduct(&mut conn, "new-sku", "2", "via-deduct", Some("ORD-9"))
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 1));
}

matrix! { #[tokio::test] async fn stock_status_shows_each_state }
async fn stock_status_shows_each_state(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "st", 9);
    let server = proxy(cluster.seeds(), |c| {
        c.retry_window = Duration::from_secs(600)
    })
    .await;
    let mut conn = client(&server, true).await;
    let status = |conn: &mut redis::aio::MultiplexedConnection, id: &'static str| {
        let mut conn = conn.clone();
        async move {
            let map: Vec<(String, Value)> = redis::cmd("STOCK.STATUS")
                .arg("st")
                .arg(id)
                .query_async(&mut conn)
                .await
                .unwrap();
            map.into_iter().collect::<std::collections::HashMap<_, _>>()
        }
    };
    let none = status(&mut conn, "s1").await;
    assert_eq!(none["state"], Value::BulkString(b"none".to_vec()));
    assert_eq!(none["ttl_ms"], Value::Int(-2));
    assert_eq!(none["stock"], Value::Int(9));

    parse(
        deduct(&mut conn, "st", "4", "s1", Some("ORD-S"))
            .await
            .unwrap(),
    );
    let deducted = status(&mut conn, "s1").await;
    assert_eq!(deducted["state"], Value::BulkString(b"DEDUCTED".to_vec()));
    assert_eq!(deducted["qty"], Value::Int(4));
    assert_eq!(deducted["order_no"], Value::BulkString(b"ORD-S".to_vec()));
    let Value::Int(ttl) = deducted["ttl_ms"] else {
        panic!()
    };
    assert!((590_000..=600_000).contains(&ttl), "{ttl}");
    assert_eq!(deducted["stock"], Value::Int(5));

    parse(revert(&mut conn, "st", "s1").await.unwrap());
    assert_eq!(
        status(&mut conn, "s1").await["state"],
        Value::BulkString(b"REVERTED".to_vec())
    );
    parse(revert(&mut conn, "st", "s2").await.unwrap());
    let revoked = status(&mut conn, "s2").await;
    assert_eq!(revoked["state"], Value::BulkString(b"REVOKED".to_vec()));
    assert_eq!(revoked["qty"], Value::Int(0));
}

/// A ULID whose embedded time is `age` ago.
fn ulid_aged(age: Duration) -> String {
    const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let millis = (SystemTime::now() - age)
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut time: Vec<u8> = (0..10)
        .map(|i| CROCKFORD[((millis >> (45 - 5 * i)) & 31) as usize])
        .collect();
    time.extend_from_slice(b"0000000000000000");
    String::from_utf8(time).unwrap()
}

matrix! { #[tokio::test] async fn stale_time_ordered_ids_are_refused_when_asked }
async fn stale_time_ordered_ids_are_refused_when_asked(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "stale", 10);
    let window = Duration::from_secs(3600);
    let strict = proxy(cluster.seeds(), |c| {
        c.retry_window = window;
        c.reject_stale_ids = true;
    })
    .await;
    let mut conn = client(&strict, false).await;
    let old = ulid_aged(Duration::from_secs(2 * 3600));
    let reply = parse(deduct(&mut conn, "stale", "1", &old, None).await.unwrap());
    assert_eq!(reply.code, 3);
    assert!(
        reply
            .reason
            .unwrap()
            .contains("older than the retry window")
    );
    let reply = parse(revert(&mut conn, "stale", &old).await.unwrap());
    assert_eq!(
        reply.code, 3,
        "a stale REVERT could give back a deduction whose record expired"
    );
    let young = ulid_aged(Duration::from_secs(60));
    assert_eq!(
        parse(deduct(&mut conn, "stale", "1", &young, None).await.unwrap()).code,
        0
    );
    // Ids that carry no time are not affected.
    assert_eq!(
        parse(
            deduct(&mut conn, "stale", "1", "order-7", None)
                .await
                .unwrap()
        )
        .code,
        0
    );
    assert_eq!(get_stock(&cluster, "stale"), Some(8));

    // Without the flag, the old id is a new request.
    let lenient = proxy(cluster.seeds(), |c| c.retry_window = window).await;
    let mut conn = client(&lenient, false).await;
    assert_eq!(
        parse(deduct(&mut conn, "stale", "1", &old, None).await.unwrap()).code,
        0
    );
}

matrix! { #[tokio::test] async fn a_revert_naming_a_sku_without_stock_is_unknownsku_not_done }
async fn a_revert_naming_a_sku_without_stock_is_unknownsku_not_done(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "real-sku", 10);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    parse(
        deduct(&mut conn, "real-sku", "3", "typo", None)
            .await
            .unwrap(),
    );
    // The caller mistypes the sku: "nothing to give back" (4) would close
    // the books while 3 units stay deducted. It must be an error.
    let err = revert(&mut conn, "reel-sku", "typo").await.unwrap_err();
    assert_eq!(err.code(), Some("UNKNOWNSKU"), "{err:?}");
    assert_eq!(
        record(&cluster, "reel-sku", "typo").0,
        None,
        "nothing was written"
    );
    // With --missing-stock zero a missing sku means no stock, and the
    // empty rollback is recorded as usual.
    let lenient = proxy(cluster.seeds(), |c| {
        c.missing_stock = stockgate::config::MissingStock::Zero
    })
    .await;
    let mut conn = client(&lenient, false).await;
    let reply = parse(revert(&mut conn, "reel-sku", "typo").await.unwrap());
    assert_eq!((reply.code, reply.remain), (4, -1));
    assert_eq!(
        record(&cluster, "reel-sku", "typo").0.as_deref(),
        Some("V:0:")
    );
}

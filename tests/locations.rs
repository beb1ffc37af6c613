//! A SKU kept by location (docs/locations.md) over the wire, against real
//! Redis: allocation in one call, everything after it giving each unit
//! back where it came from, bad input, and a plain model of locations that
//! random sequences of commands must agree with.

mod support;

use redis::Value;
use std::time::Duration;
use support::*;

type Conn = redis::aio::MultiplexedConnection;

async fn send(conn: &mut Conn, args: &[&str]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await
}

/// A DEDUCT.AT or HOLD.AT reply: code, remain, reason, expires_at, and
/// the allocation as (location, units).
#[derive(Debug, Clone, PartialEq)]
struct Allocation {
    code: i64,
    remain: i64,
    reason: String,
    expires_at: i64,
    taken: Vec<(String, i64)>,
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not text: {other:?}"),
    }
}

fn int(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

fn allocation(value: Value) -> Allocation {
    let Value::Array(items) = value else {
        panic!("not an array: {value:?}")
    };
    assert_eq!(items.len(), 7, "seven elements always: {items:?}");
    let Value::Array(flat) = &items[6] else {
        panic!("no allocation in {items:?}")
    };
    assert_eq!(int(&items[3]), stockgate::outcome::SCRIPT_VERSION);
    Allocation {
        code: int(&items[0]),
        remain: int(&items[1]),
        reason: text(&items[4]),
        expires_at: int(&items[5]),
        taken: flat
            .chunks(2)
            .map(|pair| (text(&pair[0]), int(&pair[1])))
            .collect(),
    }
}

/// STOCK.LOCATIONS: the total and (location, available, held, floor).
async fn locations(conn: &mut Conn, sku: &str) -> (i64, Vec<(String, i64, i64, i64)>) {
    let Value::Array(items) = send(conn, &["STOCK.LOCATIONS", sku]).await.unwrap() else {
        panic!("STOCK.LOCATIONS is not an array")
    };
    let total = int(&items[0]);
    let each = items[1..]
        .iter()
        .map(|item| match item {
            Value::Array(p) => (text(&p[0]), int(&p[1]), int(&p[2]), int(&p[3])),
            other => panic!("not a location: {other:?}"),
        })
        .collect();
    (total, each)
}

fn code(value: &Value) -> i64 {
    match value {
        Value::Array(items) => int(&items[0]),
        other => panic!("not a stock reply: {other:?}"),
    }
}

fn taken(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(l, n)| (l.to_string(), *n)).collect()
}

async fn located_server(
    kind: ServerKind,
) -> (stockgate::dev::LocalRedis, stockgate::server::Server) {
    let redis = standalone_of(kind);
    let server = proxy(vec![redis.url()], |c| c.admin_commands = true).await;
    (redis, server)
}

matrix! { #[tokio::test] async fn a_two_warehouse_sku_allocates_in_one_call_and_gives_back_where_it_took }
async fn a_two_warehouse_sku_allocates_in_one_call_and_gives_back_where_it_took(kind: ServerKind) {
    let (_redis, server) = located_server(kind).await;
    let mut conn = client(&server, false).await;
    let set = send(
        &mut conn,
        &["STOCK.SET", "tee", "10", "s1", "AT", "w1", "FLOOR", "2"],
    )
    .await;
    assert_eq!(code(&set.unwrap()), 0);
    let set = send(&mut conn, &["STOCK.SET", "tee", "5", "s2", "AT", "w2"]).await;
    assert_eq!(code(&set.unwrap()), 0);
    let total: i64 = redis::cmd("STOCK.GET")
        .arg("tee")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(total, 15);
    assert_eq!(
        locations(&mut conn, "tee").await,
        (15, vec![("w1".into(), 10, 0, 2), ("w2".into(), 5, 0, 0)])
    );

    // SPLIT in the order given, w1 only down to its floor.
    let split = allocation(
        send(
            &mut conn,
            &["DEDUCT.AT", "tee", "9", "d1", "SPLIT", "w1", "w2"],
        )
        .await
        .unwrap(),
    );
    assert_eq!((split.code, split.remain), (0, 6));
    assert_eq!(split.taken, taken(&[("w1", 8), ("w2", 1)]));
    // The same request again: 1, and the allocation the first call made.
    let again = allocation(
        send(
            &mut conn,
            &["DEDUCT.AT", "tee", "9", "d1", "SPLIT", "w2", "w1"],
        )
        .await
        .unwrap(),
    );
    assert_eq!((again.code, again.taken.clone()), (1, split.taken.clone()));
    // WHOLE: no location can give 5 above its floor; nothing taken.
    let whole = allocation(
        send(
            &mut conn,
            &["DEDUCT.AT", "tee", "5", "d2", "WHOLE", "w1", "w2"],
        )
        .await
        .unwrap(),
    );
    assert_eq!((whole.code, whole.remain, whole.taken.len()), (2, 6, 0));

    // A hold from w2, shrunk, confirmed, then given back.
    let held = allocation(
        send(
            &mut conn,
            &["HOLD.AT", "tee", "3", "h1", "60000", "WHOLE", "w1", "w2"],
        )
        .await
        .unwrap(),
    );
    assert_eq!((held.code, held.remain), (0, 3));
    assert_eq!(held.taken, taken(&[("w2", 3)]));
    assert!(held.expires_at > 0);
    assert_eq!(
        locations(&mut conn, "tee").await.1[1],
        ("w2".into(), 1, 3, 0)
    );
    let shrunk = send(&mut conn, &["HOLD.SHRINK", "tee", "h1", "c1", "1"])
        .await
        .unwrap();
    assert_eq!(code(&shrunk), 0);
    assert_eq!(
        locations(&mut conn, "tee").await.1[1],
        ("w2".into(), 2, 2, 0)
    );
    let extended = send(&mut conn, &["HOLD.EXTEND", "tee", "h1", "c2", "120000"])
        .await
        .unwrap();
    assert_eq!(code(&extended), 0);
    let confirmed = send(&mut conn, &["CONFIRM", "tee", "h1"]).await.unwrap();
    assert_eq!(code(&confirmed), 0);
    assert_eq!(
        locations(&mut conn, "tee").await.1[1],
        ("w2".into(), 2, 0, 0)
    );

    let reverted = send(&mut conn, &["REVERT", "tee", "d1"]).await.unwrap();
    assert_eq!(code(&reverted), 0);
    let reverted = send(&mut conn, &["REVERT", "tee", "h1"]).await.unwrap();
    assert_eq!(code(&reverted), 0);
    assert_eq!(
        code(&send(&mut conn, &["REVERT", "tee", "d1"]).await.unwrap()),
        1
    );
    assert_eq!(
        locations(&mut conn, "tee").await,
        (15, vec![("w1".into(), 10, 0, 2), ("w2".into(), 5, 0, 0)])
    );

    // A REVERT that came first revokes the id for DEDUCT.AT.
    assert_eq!(
        code(&send(&mut conn, &["REVERT", "tee", "early"]).await.unwrap()),
        4
    );
    let late = allocation(
        send(
            &mut conn,
            &["DEDUCT.AT", "tee", "1", "early", "SPLIT", "w1"],
        )
        .await
        .unwrap(),
    );
    assert_eq!((late.code, late.remain), (4, 15));

    // Commands that name no location take nothing.
    let plain = send(&mut conn, &["DEDUCT", "tee", "1", "p1"])
        .await
        .unwrap();
    assert_eq!(code(&plain), 3);
    let plain = send(&mut conn, &["HOLD", "tee", "1", "p2", "60000"])
        .await
        .unwrap();
    assert_eq!(code(&plain), 3);
    let plain = send(&mut conn, &["STOCK.SET", "tee", "7", "s3"])
        .await
        .unwrap();
    assert_eq!(code(&plain), 3);
    assert_eq!(locations(&mut conn, "tee").await.0, 15);

    drop(server);
}

matrix! { #[tokio::test] async fn bad_locations_answer_3_and_a_vanished_one_is_an_error }
async fn bad_locations_answer_3_and_a_vanished_one_is_an_error(kind: ServerKind) {
    let (redis, server) = located_server(kind).await;
    let mut conn = client(&server, false).await;
    for (op, qty, loc) in [("s1", "4", "w1"), ("s2", "4", "w2")] {
        let set = send(&mut conn, &["STOCK.SET", "cap", qty, op, "AT", loc]).await;
        assert_eq!(code(&set.unwrap()), 0);
    }
    let seventeen: Vec<String> = (0..17).map(|i| format!("w{i}")).collect();
    let mut many = vec!["DEDUCT.AT", "cap", "1", "m1", "SPLIT"];
    many.extend(seventeen.iter().map(String::as_str));
    let long = "x".repeat(65);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["DEDUCT.AT", "cap", "1", "b1", "SPLIT", "w9"],
            "unknown location w9",
        ),
        (
            vec!["DEDUCT.AT", "cap", "1", "b2", "SPLIT", "w1", "w1"],
            "named twice",
        ),
        (vec!["DEDUCT.AT", "cap", "1", "b3", "FIRST", "w1"], "policy"),
        (
            vec!["DEDUCT.AT", "cap", "1", "b4", "SPLIT", "w:1"],
            "a location is",
        ),
        (
            vec!["DEDUCT.AT", "cap", "1", "b5", "SPLIT", &long],
            "a location is",
        ),
        (many, "locations"),
        (
            vec!["STOCK.SET", "cap", "3", "b6", "AT", "w1", "FLOOR", "4"],
            "floor",
        ),
        (
            vec!["STOCK.ADD", "cap", "3", "b7", "AT", "w9"],
            "unknown location",
        ),
        (vec!["STOCK.SET", "cap", "3", "b8", "AT"], "AT <location>"),
        (
            vec!["HOLD.AT", "cap", "1", "b9", "10", "SPLIT", "w1"],
            "ttl_ms",
        ),
    ];
    for (args, reason) in cases {
        let reply = send(&mut conn, &args).await.unwrap();
        let Value::Array(items) = &reply else {
            panic!("{args:?}: {reply:?}")
        };
        assert_eq!(int(&items[0]), 3, "{args:?}: {reply:?}");
        assert!(text(&items[4]).contains(reason), "{args:?}: {reply:?}");
    }
    assert_eq!(
        locations(&mut conn, "cap").await,
        (8, vec![("w1".into(), 4, 0, 0), ("w2".into(), 4, 0, 0)])
    );

    // A location deleted behind stockgate's back: an error, never a 0.
    let d = allocation(
        send(&mut conn, &["DEDUCT.AT", "cap", "2", "d1", "SPLIT", "w2"])
            .await
            .unwrap(),
    );
    assert_eq!(d.code, 0);
    let mut direct = redis.node.connection().unwrap();
    let loc_key = [stock_key("cap"), b":loc".to_vec()].concat();
    redis::cmd("HDEL")
        .arg(&loc_key)
        .arg("w2")
        .query::<()>(&mut direct)
        .unwrap();
    let err = send(&mut conn, &["REVERT", "cap", "d1"]).await.unwrap_err();
    assert!(err.to_string().contains("LOCGONE"), "{err}");
    redis::cmd("DEL")
        .arg(&loc_key)
        .query::<()>(&mut direct)
        .unwrap();
    let err = send(&mut conn, &["DEDUCT.AT", "cap", "1", "d2", "SPLIT", "w1"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("LOCGONE"), "{err}");
    assert_eq!(record_state(&mut direct, "cap", "d1"), 'D');
    drop(server);
}

matrix! { #[tokio::test] async fn a_hold_at_that_runs_out_goes_back_to_its_locations_by_redis_time }
async fn a_hold_at_that_runs_out_goes_back_to_its_locations_by_redis_time(kind: ServerKind) {
    let (_redis, server) = located_server(kind).await;
    let mut conn = client(&server, false).await;
    for (op, loc) in [("s1", "w1"), ("s2", "w2")] {
        let set = send(&mut conn, &["STOCK.SET", "cup", "2", op, "AT", loc]).await;
        assert_eq!(code(&set.unwrap()), 0);
    }
    let held = allocation(
        send(
            &mut conn,
            &["HOLD.AT", "cup", "3", "h1", "1000", "SPLIT", "w2", "w1"],
        )
        .await
        .unwrap(),
    );
    assert_eq!(held.taken, taken(&[("w2", 2), ("w1", 1)]));
    // Nothing but Redis's clock gives them back: STOCK.LOCATIONS releases
    // what ran out, as every call on the SKU does.
    let (total, _) = loop_until_async(Duration::from_secs(30), || async {
        let mut conn = conn.clone();
        let seen = locations(&mut conn, "cup").await;
        (seen.0 == 4).then_some(seen)
    })
    .await;
    assert_eq!(total, 4);
    assert_eq!(
        locations(&mut conn, "cup").await.1,
        vec![("w1".into(), 2, 0, 0), ("w2".into(), 2, 0, 0)]
    );
    assert_eq!(
        code(&send(&mut conn, &["CONFIRM", "cup", "h1"]).await.unwrap()),
        5
    );
    let again = allocation(
        send(
            &mut conn,
            &["HOLD.AT", "cup", "3", "h1", "1000", "SPLIT", "w1"],
        )
        .await
        .unwrap(),
    );
    assert_eq!(again.code, 5);
    drop(server);
}

/// An op_id names one change: sent again for another location, or with
/// another floor, it is another change (3, nothing changed), never a
/// retry answered 1 while the location it names gets nothing.
#[tokio::test]
async fn an_op_id_sent_again_for_another_location_or_floor_is_another_change() {
    let (_redis, server) = located_server(ServerKind::Redis7).await;
    let mut conn = client(&server, false).await;
    for (op, loc) in [("s1", "w1"), ("s2", "w2")] {
        let set = send(&mut conn, &["STOCK.SET", "opt", "5", op, "AT", loc]).await;
        assert_eq!(code(&set.unwrap()), 0);
    }
    let add = |loc: &'static str| ["STOCK.ADD", "opt", "1", "a1", "AT", loc];
    assert_eq!(code(&send(&mut conn, &add("w1")).await.unwrap()), 0);
    assert_eq!(code(&send(&mut conn, &add("w1")).await.unwrap()), 1);
    let other = parse(send(&mut conn, &add("w2")).await.unwrap());
    assert_eq!(other.code, 3, "{other:?}");
    assert!(other.reason.unwrap().contains("another change"));

    let floor = |f: &'static str| ["STOCK.SET", "opt", "4", "f1", "AT", "w2", "FLOOR", f];
    assert_eq!(code(&send(&mut conn, &floor("1")).await.unwrap()), 0);
    assert_eq!(code(&send(&mut conn, &floor("1")).await.unwrap()), 1);
    assert_eq!(code(&send(&mut conn, &floor("2")).await.unwrap()), 3);
    let unfloored = send(&mut conn, &["STOCK.SET", "opt", "4", "f1", "AT", "w2"]).await;
    assert_eq!(code(&unfloored.unwrap()), 3);
    assert_eq!(
        locations(&mut conn, "opt").await,
        (10, vec![("w1".into(), 6, 0, 0), ("w2".into(), 4, 0, 1)])
    );
    drop(server);
}

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

/// A SKU that keeps one number becomes one kept by location only when
/// empty (0, nothing held): above 0, or with units on hold, STOCK.SET ...
/// AT answers 3 and changes nothing.
#[tokio::test]
async fn a_sku_moves_to_locations_only_when_its_one_number_is_empty() {
    let (_redis, server) = located_server(ServerKind::Redis7).await;
    let mut conn = client(&server, false).await;
    let set = send(&mut conn, &["STOCK.SET", "mov", "5", "p1"])
        .await
        .unwrap();
    assert_eq!(code(&set), 0);
    let held = send(&mut conn, &["HOLD", "mov", "5", "h1", "60000"])
        .await
        .unwrap();
    assert_eq!(code(&held), 0);
    // 0 available, 5 held: not empty.
    let refused = send(&mut conn, &["STOCK.SET", "mov", "4", "l1", "AT", "w1"])
        .await
        .unwrap();
    assert_eq!(code(&refused), 3, "{refused:?}");
    assert_eq!(
        code(&send(&mut conn, &["REVERT", "mov", "h1"]).await.unwrap()),
        0
    );
    let refused = send(&mut conn, &["STOCK.SET", "mov", "4", "l2", "AT", "w1"])
        .await
        .unwrap();
    assert_eq!(code(&refused), 3, "5 available: {refused:?}");
    assert_eq!(
        code(
            &send(&mut conn, &["STOCK.SET", "mov", "0", "p2"])
                .await
                .unwrap()
        ),
        0
    );
    let moved = send(&mut conn, &["STOCK.SET", "mov", "4", "l3", "AT", "w1"])
        .await
        .unwrap();
    assert_eq!(code(&moved), 0, "{moved:?}");
    assert_eq!(
        locations(&mut conn, "mov").await,
        (4, vec![("w1".into(), 4, 0, 0)])
    );
    assert_eq!(
        code(
            &send(&mut conn, &["DEDUCT", "mov", "1", "d1"])
                .await
                .unwrap()
        ),
        3
    );
}

/// One connection's commands on a SKU kept by location take effect in the
/// order sent, however they are pipelined: an allocation, its REVERT and
/// a retry of it; a HOLD.AT, its CONFIRM and its REVERT (answers that a
/// reordering would change: a REVERT first revokes, a CONFIRM first
/// revokes too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_s_pipelined_commands_on_a_located_sku_keep_their_order() {
    let (_redis, server) = located_server(ServerKind::Redis7).await;
    let mut conn = client(&server, false).await;
    let set = send(&mut conn, &["STOCK.SET", "seq", "1000", "s1", "AT", "w1"]).await;
    assert_eq!(code(&set.unwrap()), 0);
    for round in 0..20 {
        let (d, h) = (format!("d{round}"), format!("h{round}"));
        let mut pipe = redis::pipe();
        for args in [
            vec!["DEDUCT.AT", "seq", "2", &d, "SPLIT", "w1"],
            vec!["REVERT", "seq", &d],
            vec!["DEDUCT.AT", "seq", "2", &d, "SPLIT", "w1"],
            vec!["HOLD.AT", "seq", "3", &h, "60000", "WHOLE", "w1"],
            vec!["CONFIRM", "seq", &h],
            vec!["REVERT", "seq", &h],
        ] {
            let mut cmd = redis::cmd(args[0]);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            pipe.add_command(cmd);
        }
        let replies: Vec<Value> = pipe.query_async(&mut conn).await.unwrap();
        let codes: Vec<i64> = replies.iter().map(code).collect();
        assert_eq!(codes, [0, 0, 4, 0, 0, 0], "round {round}");
    }
    assert_eq!(
        locations(&mut conn, "seq").await,
        (1000, vec![("w1".into(), 1000, 0, 0)])
    );
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

/// The locations a case of [`allocations_follow_a_plain_model_of_locations`]
/// may name: the first three exist from its start, w3 only once a
/// STOCK.SET makes it (until then, unknown).
const PLACES: [&str; 4] = ["w0", "w1", "w2", "w3"];

/// A step of [`allocations_follow_a_plain_model_of_locations`]: ids,
/// op_ids and change_ids by number, from small pools, so that they meet
/// again (retries, and reuse for another change).
#[derive(Debug, Clone)]
enum Step {
    Set {
        op: usize,
        at: usize,
        qty: i64,
        floor: Option<i64>,
    },
    Add {
        op: usize,
        at: usize,
        delta: i64,
    },
    Deduct {
        id: usize,
        qty: i64,
        whole: bool,
        from: Vec<usize>,
    },
    Hold {
        id: usize,
        qty: i64,
        whole: bool,
        from: Vec<usize>,
    },
    Confirm {
        id: usize,
    },
    Revert {
        id: usize,
    },
    /// To level `level`: ttl_ms 600 s plus a minute a level, as in
    /// tests/holds.rs, so that no hold runs out within a case.
    Extend {
        id: usize,
        change: usize,
        level: u64,
    },
    Shrink {
        id: usize,
        change: usize,
        qty: i64,
    },
    /// One of the steps before sent again as it was (`back` + 1 steps
    /// back, counting round): a caller's retry, or an operator's.
    Again {
        back: usize,
    },
}

/// One location, in the model: what STOCK.LOCATIONS shows, and the units
/// the operator gave it in all (for conservation).
#[derive(Debug, Clone, Copy, Default)]
struct Place {
    available: i64,
    held: i64,
    floor: i64,
    supplied: i64,
}

/// What each location gave a request: (index into [`PLACES`], units), in
/// the order taken.
type Taken = Vec<(usize, i64)>;

/// Where a request stands, in the model (absent: never seen).
#[derive(Debug, Clone, PartialEq)]
enum Modelled {
    Deducted {
        asked: i64,
        taken: Taken,
    },
    Held {
        qty: i64,
        asked: i64,
        level: u64,
        expires: i64,
        taken: Taken,
    },
    Confirmed {
        asked: i64,
        expires: i64,
        taken: Taken,
    },
    /// Reverted or revoked: every later call on it answers as both do.
    Gone,
}

/// An operator's change by op_id, as the model remembers it: (set?,
/// amount, location, floor).
type OpDone = (bool, i64, usize, Option<i64>);

fn located_step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    use proptest::sample::subsequence;
    let id = 0..6usize;
    let change = 0..4usize;
    let op = 0..3usize;
    let at = 0..PLACES.len();
    // Mostly the three locations a case starts with; sometimes w3 too,
    // which is unknown until a STOCK.SET makes it.
    let from = prop_oneof![
        4 => subsequence(vec![0, 1, 2], 1..=3),
        1 => subsequence((0..PLACES.len()).collect::<Vec<_>>(), 1..=4),
    ]
    .prop_shuffle();
    prop_oneof![
        1 => (op.clone(), at.clone(), 0i64..12, proptest::option::of(0i64..6))
            .prop_map(|(op, at, qty, floor)| Step::Set { op, at, qty, floor }),
        1 => (op, at, -4i64..6).prop_map(|(op, at, delta)| Step::Add { op, at, delta }),
        4 => (id.clone(), 1i64..7, any::<bool>(), from.clone())
            .prop_map(|(id, qty, whole, from)| Step::Deduct { id, qty, whole, from }),
        4 => (id.clone(), 1i64..7, any::<bool>(), from)
            .prop_map(|(id, qty, whole, from)| Step::Hold { id, qty, whole, from }),
        2 => id.clone().prop_map(|id| Step::Confirm { id }),
        1 => id.clone().prop_map(|id| Step::Revert { id }),
        2 => (id.clone(), change.clone(), 0u64..4)
            .prop_map(|(id, change, level)| Step::Extend { id, change, level }),
        2 => (id, change, 1i64..5).prop_map(|(id, change, qty)| Step::Shrink { id, change, qty }),
        2 => (0usize..8).prop_map(|back| Step::Again { back }),
    ]
}

/// A hold's life in a row, so that changes meet a live hold and their
/// retries often: HOLD.AT, an extension sent twice, a shrink sent twice.
fn a_hold_and_its_changes() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let from = proptest::sample::subsequence(vec![0, 1, 2], 1..=3).prop_shuffle();
    (0..6usize, 2i64..7, any::<bool>(), from, 0..4usize, 1u64..4).prop_map(
        |(id, qty, whole, from, change, level)| {
            let extend = Step::Extend { id, change, level };
            let shrink = Step::Shrink {
                id,
                change: (change + 1) % 4,
                qty: 1,
            };
            vec![
                Step::Hold {
                    id,
                    qty,
                    whole,
                    from,
                },
                extend.clone(),
                extend,
                shrink.clone(),
                shrink,
            ]
        },
    )
}

/// A case's steps: single steps, and now and then a hold's life.
fn located_steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let one = prop_oneof![
        8 => located_step().prop_map(|step| vec![step]),
        1 => a_hold_and_its_changes(),
    ];
    prop::collection::vec(one, 1..32).prop_map(|runs| runs.into_iter().flatten().collect())
}

/// The model's allocation of `qty` over `from` (in that order): what each
/// location gives, or the code refusing it (3 an unknown location, 2
/// not enough above the floors under the policy).
fn allocate(places: &[Option<Place>], qty: i64, whole: bool, from: &[usize]) -> Result<Taken, i64> {
    if from.iter().any(|&at| places[at].is_none()) {
        return Err(3);
    }
    let mut taken = Vec::new();
    let mut left = qty;
    for &at in from {
        let place = places[at].expect("known");
        let free = place.available - place.floor;
        if left == 0 || free <= 0 {
            continue;
        }
        if !whole {
            let units = free.min(left);
            taken.push((at, units));
            left -= units;
        } else if free >= qty {
            taken.push((at, qty));
            left = 0;
        }
    }
    if left > 0 { Err(2) } else { Ok(taken) }
}

fn named(taken: &Taken) -> Vec<(String, i64)> {
    taken
        .iter()
        .map(|&(at, units)| (PLACES[at].to_string(), units))
        .collect()
}

/// Random sequences of STOCK.SET / STOCK.ADD ... AT (with floors),
/// DEDUCT.AT and HOLD.AT (SPLIT and WHOLE, the locations in random order
/// and subsets, some not made yet), CONFIRM, REVERT, HOLD.EXTEND and
/// HOLD.SHRINK on one SKU, with request_ids, op_ids and change_ids drawn
/// from small pools so that retries and reuse meet, against a plain model
/// of its locations: every reply's code, remain, allocation and expiry,
/// and after every step STOCK.LOCATIONS and the SKU's units held as the
/// model has them. Per location, available + held + the units the
/// DEDUCTED and CONFIRMED requests took from it is what the operator gave
/// it (conservation), and an allocation never leaves a location it took
/// from below its floor. No hold runs out within a case (600 s and up).
#[test]
fn allocations_follow_a_plain_model_of_locations() {
    use proptest::prelude::*;
    use std::collections::HashMap;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = standalone();
    let server = runtime.block_on(proxy(vec![redis.url()], |c| {
        c.admin_commands = true;
        c.sweeper = false;
    }));
    let conn = runtime.block_on(client(&server, false));
    let case = std::sync::atomic::AtomicU64::new(0);
    // How many steps met each (command, code): the cells a run must reach.
    let met = std::sync::Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    let config = ProptestConfig {
        cases: 64,
        max_shrink_iters: 300,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in located_steps())| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sku = format!("located-{n}");
        let held_key = [stock_key(&sku), b":held".to_vec()].concat();
        let mut direct = redis.node.connection().unwrap();
        let mut conn = conn.clone();
        // Three locations from the start, two with a floor.
        let seeds = [
            Step::Set { op: 10, at: 0, qty: 10, floor: Some(2) },
            Step::Set { op: 11, at: 1, qty: 6, floor: None },
            Step::Set { op: 12, at: 2, qty: 5, floor: Some(1) },
        ];
        // The steps as sent, an Again resolved to the step it repeats.
        let mut sent: Vec<Step> = Vec::new();
        let mut places: [Option<Place>; 4] = [None; 4];
        let mut requests: HashMap<usize, Modelled> = HashMap::new();
        let mut ops: HashMap<usize, OpDone> = HashMap::new();
        // change_id -> (extend?, amount, request, expiry it answered)
        let mut changes: HashMap<usize, (bool, i64, usize, i64)> = HashMap::new();
        for (i, step) in seeds.iter().chain(steps.iter()).enumerate() {
            let step = match step {
                Step::Again { back } => sent[sent.len() - 1 - back % sent.len()].clone(),
                other => other.clone(),
            };
            sent.push(step.clone());
            let step = &step;
            // What an allocation answered 0 took in this step, and the
            // step's code.
            let mut allocated: Taken = Vec::new();
            let answered;
            let at_step = format!("step {i} {step:?} of {steps:?}");
            let rid = |id: usize| format!("r{id}");
            let total = |places: &[Option<Place>; 4]| -> i64 {
                places.iter().flatten().map(|p| p.available).sum()
            };
            let block = |args: Vec<String>| {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let mut conn = conn.clone();
                runtime.block_on(async move { send(&mut conn, &args).await })
            };
            match step {
                Step::Again { .. } => unreachable!("resolved above"),
                Step::Set { .. } | Step::Add { .. } => {
                    let (op, at, qty, floor, set) = match *step {
                        Step::Set { op, at, qty, floor } => (op, at, qty, floor, true),
                        Step::Add { op, at, delta, .. } => (op, at, delta, None, false),
                        _ => unreachable!("a STOCK.SET or STOCK.ADD"),
                    };
                    let mut args = vec![
                        if set { "STOCK.SET" } else { "STOCK.ADD" }.to_string(),
                        sku.clone(), qty.to_string(), format!("o{op}"),
                        "AT".into(), PLACES[at].into(),
                    ];
                    if let Some(floor) = floor {
                        args.extend(["FLOOR".to_string(), floor.to_string()]);
                    }
                    let got = parse(block(args).unwrap());
                    answered = got.code;
                    let units = places[at].map_or(-1, |p| p.available);
                    let (code, shown) = match ops.get(&op) {
                        Some(&done) if done == (set, qty, at, floor) => (1, units),
                        Some(_) => (3, units),
                        None if !set && places[at].is_none() => (3, -1),
                        None => {
                            let before = places[at].unwrap_or_default();
                            let after = if set { qty } else { before.available + qty };
                            if after < 0 {
                                (2, units)
                            } else if floor.is_some_and(|f| f > after) {
                                (3, units)
                            } else {
                                places[at] = Some(Place {
                                    available: after,
                                    floor: floor.unwrap_or(before.floor),
                                    supplied: before.supplied + after - before.available,
                                    ..before
                                });
                                ops.insert(op, (set, qty, at, floor));
                                (0, after)
                            }
                        }
                    };
                    prop_assert_eq!((got.code, got.remain), (code, shown), "{}: {:?}", at_step, got);
                }
                Step::Deduct { id, qty, whole, from } | Step::Hold { id, qty, whole, from } => {
                    let hold = matches!(step, Step::Hold { .. });
                    let (id, qty, whole) = (*id, *qty, *whole);
                    let mut args = vec![
                        if hold { "HOLD.AT" } else { "DEDUCT.AT" }.to_string(),
                        sku.clone(), qty.to_string(), rid(id),
                    ];
                    if hold {
                        args.push("600000".into());
                    }
                    args.push(if whole { "WHOLE" } else { "SPLIT" }.into());
                    args.extend(from.iter().map(|&at| PLACES[at].to_string()));
                    let got = allocation(block(args).unwrap());
                    answered = got.code;
                    let (code, expires, taken) = match requests.get(&id) {
                        None => match allocate(&places, qty, whole, from) {
                            Err(code) => (code, 0, Vec::new()),
                            Ok(taken) => {
                                for &(at, units) in &taken {
                                    let place = places[at].as_mut().expect("known");
                                    place.available -= units;
                                    if hold {
                                        place.held += units;
                                    }
                                }
                                requests.insert(id, if hold {
                                    Modelled::Held {
                                        qty, asked: qty, level: 0,
                                        expires: got.expires_at, taken: taken.clone(),
                                    }
                                } else {
                                    Modelled::Deducted { asked: qty, taken: taken.clone() }
                                });
                                prop_assert!(!hold || got.expires_at > 0, "{}", at_step);
                                (0, if hold { got.expires_at } else { 0 }, taken)
                            }
                        },
                        Some(Modelled::Gone) => (4, 0, Vec::new()),
                        Some(Modelled::Deducted { asked, taken }) if !hold && *asked == qty => {
                            (1, 0, taken.clone())
                        }
                        Some(Modelled::Held { asked, expires, taken, .. }
                            | Modelled::Confirmed { asked, expires, taken })
                            if hold && *asked == qty => (1, *expires, taken.clone()),
                        Some(_) => (3, 0, Vec::new()),
                    };
                    prop_assert_eq!(
                        (got.code, got.remain, got.expires_at, got.taken.clone()),
                        (code, total(&places), expires, named(&taken)),
                        "{}: {:?}", at_step, got
                    );
                    if code == 0 {
                        allocated = taken;
                    }
                }
                &Step::Confirm { id } => {
                    let got = parse_hold(block(vec!["CONFIRM".into(), sku.clone(), rid(id)]).unwrap());
                    answered = got.code;
                    let (code, expires) = match requests.get(&id).cloned() {
                        None => {
                            requests.insert(id, Modelled::Gone);
                            (4, 0)
                        }
                        Some(Modelled::Held { qty: _, asked, expires, taken, .. }) => {
                            for &(at, units) in &taken {
                                places[at].as_mut().expect("known").held -= units;
                            }
                            requests.insert(id, Modelled::Confirmed { asked, expires, taken });
                            (0, expires)
                        }
                        Some(Modelled::Confirmed { expires, .. }) => (1, expires),
                        Some(Modelled::Deducted { .. }) => (3, 0),
                        Some(Modelled::Gone) => (4, 0),
                    };
                    prop_assert_eq!(
                        (got.code, got.remain, got.expires_at),
                        (code, total(&places), expires),
                        "{}: {:?}", at_step, got
                    );
                }
                &Step::Revert { id } => {
                    let got = parse(block(vec!["REVERT".into(), sku.clone(), rid(id)]).unwrap());
                    answered = got.code;
                    let code = match requests.get(&id).cloned() {
                        None => 4,
                        Some(Modelled::Gone) => 1,
                        Some(Modelled::Deducted { taken, .. } | Modelled::Confirmed { taken, .. }) => {
                            for &(at, units) in &taken {
                                places[at].as_mut().expect("known").available += units;
                            }
                            0
                        }
                        Some(Modelled::Held { taken, .. }) => {
                            for &(at, units) in &taken {
                                let place = places[at].as_mut().expect("known");
                                place.available += units;
                                place.held -= units;
                            }
                            0
                        }
                    };
                    requests.insert(id, Modelled::Gone);
                    prop_assert_eq!((got.code, got.remain), (code, total(&places)), "{}: {:?}", at_step, got);
                }
                &Step::Extend { id, change: c, level } => {
                    let ttl = 600_000 + 60_000 * level;
                    let got = parse_hold(block(vec![
                        "HOLD.EXTEND".into(), sku.clone(), rid(id), format!("c{c}"), ttl.to_string(),
                    ]).unwrap());
                    answered = got.code;
                    let (code, expires) = match (changes.get(&c).copied(), requests.get(&id).cloned()) {
                        (Some((extend, amount, of, expires)), _) => {
                            if (extend, amount, of) == (true, level as i64, id) {
                                (1, expires)
                            } else {
                                (3, 0)
                            }
                        }
                        (None, Some(Modelled::Held { qty, asked, level: now, expires, taken })) => {
                            // The same level again is later only when a
                            // millisecond passed since: either answer.
                            if level > now || (level == now && got.code == 0) {
                                prop_assert!(got.expires_at > expires, "{}: {:?}", at_step, got);
                                requests.insert(id, Modelled::Held {
                                    qty, asked, level, expires: got.expires_at, taken,
                                });
                                changes.insert(c, (true, level as i64, id, got.expires_at));
                                (0, got.expires_at)
                            } else {
                                (3, 0)
                            }
                        }
                        (None, Some(Modelled::Confirmed { expires, .. })) => (1, expires),
                        (None, None | Some(Modelled::Deducted { .. })) => (3, 0),
                        (None, Some(Modelled::Gone)) => (4, 0),
                    };
                    prop_assert_eq!(
                        (got.code, got.remain, got.expires_at),
                        (code, total(&places), expires),
                        "{}: {:?}", at_step, got
                    );
                }
                &Step::Shrink { id, change: c, qty: back } => {
                    let got = parse_hold(block(vec![
                        "HOLD.SHRINK".into(), sku.clone(), rid(id), format!("c{c}"), back.to_string(),
                    ]).unwrap());
                    answered = got.code;
                    let (code, expires) = match (changes.get(&c).copied(), requests.get(&id).cloned()) {
                        (Some((extend, amount, of, expires)), _) => {
                            if (extend, amount, of) == (false, back, id) {
                                (1, expires)
                            } else {
                                (3, 0)
                            }
                        }
                        (None, Some(Modelled::Held { qty, asked, level, expires, mut taken }))
                            if back < qty =>
                        {
                            // Given back from the last location taken first.
                            let mut left = back;
                            for (at, units) in taken.iter_mut().rev() {
                                let given = (*units).min(left);
                                let place = places[*at].as_mut().expect("known");
                                place.available += given;
                                place.held -= given;
                                *units -= given;
                                left -= given;
                            }
                            taken.retain(|&(_, units)| units > 0);
                            requests.insert(id, Modelled::Held {
                                qty: qty - back, asked, level, expires, taken,
                            });
                            changes.insert(c, (false, back, id, expires));
                            (0, expires)
                        }
                        (None, Some(Modelled::Gone)) => (4, 0),
                        (None, _) => (3, 0),
                    };
                    prop_assert_eq!(
                        (got.code, got.remain, got.expires_at),
                        (code, total(&places), expires),
                        "{}: {:?}", at_step, got
                    );
                }
            }

            let word = format!("{step:?}");
            let word = word.split([' ', '{']).next().unwrap_or_default();
            *met.lock().unwrap().entry(format!("{word} {answered}")).or_default() += 1;
            if matches!(steps.get(i.wrapping_sub(seeds.len())), Some(Step::Again { .. })) {
                *met.lock().unwrap().entry(format!("again: {word} {answered}")).or_default() += 1;
            }
            if allocated.len() > 1 {
                *met.lock().unwrap().entry("split over locations".into()).or_default() += 1;
            }

            // The SKU as Redis has it, against the model.
            let (total_now, each) = runtime.block_on(locations(&mut conn, &sku));
            let modelled: Vec<(String, i64, i64, i64)> = places
                .iter()
                .enumerate()
                .filter_map(|(at, p)| p.map(|p| (PLACES[at].to_string(), p.available, p.held, p.floor)))
                .collect();
            prop_assert_eq!((total_now, &each), (total(&places), &modelled), "after {}", at_step);
            let held_now: Option<i64> = redis::cmd("GET").arg(&held_key).query(&mut direct).unwrap();
            prop_assert_eq!(
                held_now.unwrap_or(0),
                places.iter().flatten().map(|p| p.held).sum::<i64>(),
                "the sku's units held after {}", at_step
            );
            // Conservation per location, Redis's numbers against the
            // units the requests' replies say they took for good.
            for (at, name) in PLACES.iter().enumerate() {
                let Some(place) = places[at] else { continue };
                let sold: i64 = requests
                    .values()
                    .filter_map(|r| match r {
                        Modelled::Deducted { taken, .. } | Modelled::Confirmed { taken, .. } => {
                            Some(taken)
                        }
                        _ => None,
                    })
                    .flatten()
                    .filter(|(a, _)| *a == at)
                    .map(|(_, units)| units)
                    .sum();
                let (_, available, held, floor) = each
                    .iter()
                    .find(|(n, ..)| n == name)
                    .cloned()
                    .expect("a location the model has");
                prop_assert_eq!(
                    available + held + sold, place.supplied,
                    "conservation at {} after {}", name, at_step
                );
                // An allocation leaves a location it took from at its
                // floor or above.
                if allocated.iter().any(|&(a, _)| a == at) {
                    prop_assert!(available >= floor, "{} below its floor after {}", name, at_step);
                }
            }
        }
    });
    let met = met.into_inner().unwrap();
    eprintln!("[locations model] steps by command and code: {met:?}");
    // Cells a run reaches by the dozen: one missed means the generator,
    // not stockgate, went wrong.
    for cell in [
        "Set 0",
        "Set 1",
        "Set 3",
        "Add 0",
        "Add 3",
        "Deduct 0",
        "Deduct 1",
        "Deduct 2",
        "Deduct 3",
        "Deduct 4",
        "Hold 0",
        "Hold 1",
        "Hold 2",
        "Hold 3",
        "Hold 4",
        "Confirm 0",
        "Confirm 3",
        "Confirm 4",
        "Revert 0",
        "Revert 1",
        "Revert 4",
        "Extend 0",
        "Extend 1",
        "Extend 3",
        "Extend 4",
        "Shrink 0",
        "Shrink 1",
        "Shrink 3",
        "Shrink 4",
        "split over locations",
    ] {
        assert!(met.contains_key(cell), "no step met {cell}: {met:?}");
    }
}

/// The locations of [`many_callers_allocating_through_two_stockgates_keep_each_location_exact`]:
/// (name, units, floor).
/// `w0` is named by one request alone, caller 0's first: 5 units from
/// `w0` then `w1`, which splits (3 and 2) whatever runs beside it. The
/// others are named at random, and split where one named first runs dry
/// (one to four of 192 requests, and now and then none).
const WAREHOUSES: [(&str, i64, i64); 4] = [
    ("w0", 3, 0),
    ("w1", 200, 10),
    ("w2", 150, 20),
    ("w3", 30, 0),
];

/// The split [`WAREHOUSES`] promises: caller 0's first request.
const SURE_SPLIT: [&str; 2] = ["w0", "w1"];

/// A small xorshift generator: a caller's choices, replayed from its seed.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// One request of the concurrent load, as its replies tell it.
#[derive(Debug, Default)]
struct Told {
    id: String,
    hold: bool,
    qty: i64,
    whole: bool,
    named: Vec<&'static str>,
    /// The allocation the one call answered 0 made; None if none did.
    taken: Option<Vec<(String, i64)>>,
    /// Units a HOLD.SHRINK answered 0 gave back.
    shrunk: i64,
    confirmed: bool,
    reverted: bool,
    /// Every reply to the allocation: (code, allocation), in the order
    /// they came unless the request was sent twice at once.
    answers: Vec<(i64, Vec<(String, i64)>)>,
    at_once: bool,
}

impl Told {
    /// What the request keeps out of each location for good (DEDUCTED, or
    /// CONFIRMED), or on hold (HELD), as its replies tell it: the
    /// allocation, less what a shrink gave back from its last location
    /// first.
    fn kept(&self) -> Vec<(String, i64)> {
        let mut kept = self.taken.clone().unwrap_or_default();
        let mut left = self.shrunk;
        for (_, units) in kept.iter_mut().rev() {
            let given = (*units).min(left);
            *units -= given;
            left -= given;
        }
        kept.retain(|(_, units)| *units > 0);
        kept
    }
}

/// Sends one command, failing the test on an error: there is no fault
/// here.
async fn must(conn: &mut Conn, args: &[&str]) -> Value {
    send(conn, args)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// 16 callers allocate one SKU over three locations with floors through
/// two stockgates on one cluster: DEDUCT.AT and HOLD.AT (SPLIT and WHOLE,
/// random locations in random order), some sent through both stockgates
/// at once or again after their answer, REVERTs, HOLD.SHRINKs and
/// CONFIRMs (some twice at once, some refunded), more than the locations
/// can give above their floors. Afterwards, per location, its initial
/// units are its available + held units + what each DEDUCTED or
/// CONFIRMED request's replies say it took from there; its held units are
/// what the HELD ones' replies say; none is below its floor; at most one
/// call per request answered 0, and every other answer agrees with it;
/// every request's record agrees with its replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_allocating_through_two_stockgates_keep_each_location_exact() {
    use futures_util::future::join_all;
    let cluster = cluster();
    let a = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
    let b = proxy(cluster.seeds(), |_| {}).await;
    let sku = "hot-loc";
    let mut setup = client(&a, false).await;
    for (i, (name, units, floor)) in WAREHOUSES.iter().enumerate() {
        let (units, floor, op) = (units.to_string(), floor.to_string(), format!("s{i}"));
        let set = ["STOCK.SET", sku, &units, &op, "AT", name, "FLOOR", &floor];
        assert_eq!(code(&must(&mut setup, &set).await), 0);
    }

    let callers = (0..16u64).map(|caller| {
        let (a, b) = (a.addr, b.addr);
        tokio::spawn(async move {
            let conns = [client_at(a, false).await, client_at(b, false).await];
            let mut dice = Dice(0x5eed ^ (caller + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut told = Vec::new();
            for n in 0..12 {
                let mut request = Told {
                    id: format!("c{caller}-{n}"),
                    hold: dice.one_in(2),
                    qty: 1 + dice.below(5) as i64,
                    whole: dice.one_in(3),
                    ..Told::default()
                };
                let mut names: Vec<&'static str> = WAREHOUSES
                    .iter()
                    .map(|w| w.0)
                    .filter(|name| *name != SURE_SPLIT[0])
                    .collect();
                for i in (1..names.len()).rev() {
                    names.swap(i, dice.below(i as u64 + 1) as usize);
                }
                names.truncate(1 + dice.below(3) as usize);
                request.named = names;
                if caller == 0 && n == 0 {
                    (request.qty, request.whole) = (5, false);
                    request.named = SURE_SPLIT.to_vec();
                }
                let via = dice.below(2) as usize;
                let qty = request.qty.to_string();
                let mut args = vec![
                    if request.hold { "HOLD.AT" } else { "DEDUCT.AT" },
                    sku,
                    &qty,
                    &request.id,
                ];
                if request.hold {
                    args.push("600000");
                }
                args.push(if request.whole { "WHOLE" } else { "SPLIT" });
                args.extend(&request.named);
                // Sent through both stockgates at once, or again through
                // the other after its answer, or once.
                let replies = match dice.below(4) {
                    0 => {
                        request.at_once = true;
                        let (mut first, mut second) = (conns[via].clone(), conns[1 - via].clone());
                        let (x, y) =
                            futures_util::join!(must(&mut first, &args), must(&mut second, &args));
                        vec![x, y]
                    }
                    1 => {
                        let mut first = conns[via].clone();
                        let x = must(&mut first, &args).await;
                        let mut other = conns[1 - via].clone();
                        vec![x, must(&mut other, &args).await]
                    }
                    _ => vec![must(&mut conns[via].clone(), &args).await],
                };
                for reply in replies {
                    let got = allocation(reply);
                    if got.code == 0 {
                        assert!(request.taken.is_none(), "two 0s for {}", request.id);
                        request.taken = Some(got.taken.clone());
                    }
                    request.answers.push((got.code, got.taken));
                }
                let applied = request.taken.is_some();
                let other = |dice: &mut Dice| conns[dice.below(2) as usize].clone();
                if applied && request.hold && request.qty > 1 && dice.one_in(4) {
                    let change = format!("k-{}", request.id);
                    let shrink = ["HOLD.SHRINK", sku, &request.id, &change, "1"];
                    assert_eq!(code(&must(&mut other(&mut dice), &shrink).await), 0);
                    assert_eq!(code(&must(&mut other(&mut dice), &shrink).await), 1);
                    request.shrunk = 1;
                }
                if applied && request.hold && dice.below(3) > 0 {
                    let confirm = ["CONFIRM", sku, &request.id];
                    let (mut x, mut y) = (other(&mut dice), other(&mut dice));
                    let (x, y) =
                        futures_util::join!(must(&mut x, &confirm), must(&mut y, &confirm));
                    let mut codes = [code(&x), code(&y)];
                    codes.sort_unstable();
                    assert_eq!(codes, [0, 1], "CONFIRM {} twice at once", request.id);
                    request.confirmed = true;
                }
                let refund = !request.hold || request.confirmed;
                if applied && dice.below(if refund { 4 } else { 3 }) == 0 {
                    let revert = ["REVERT", sku, &request.id];
                    assert_eq!(code(&must(&mut other(&mut dice), &revert).await), 0);
                    assert_eq!(code(&must(&mut other(&mut dice), &revert).await), 1);
                    request.reverted = true;
                }
                told.push(request);
            }
            told
        })
    });
    let told: Vec<Told> = join_all(callers)
        .await
        .into_iter()
        .flat_map(|t| t.expect("a caller"))
        .collect();

    // Every answer agrees with the one 0 (a 1 names its allocation), or
    // is a 2 that took nothing, before the 0 if there is one (a 2 writes
    // no record, so a later call may find the units a REVERT gave back).
    let mut codes = std::collections::BTreeMap::<i64, usize>::new();
    for request in &told {
        let first_ok = request.answers.iter().position(|a| a.0 == 0);
        for (i, (answer, taken)) in request.answers.iter().enumerate() {
            *codes.entry(*answer).or_default() += 1;
            match (&request.taken, answer) {
                (Some(first), 0 | 1) => assert_eq!(taken, first, "{request:?}"),
                (_, 2) if request.at_once || first_ok.is_none_or(|at| i < at) => {
                    assert!(taken.is_empty(), "{request:?}")
                }
                _ => panic!("an answer that agrees with no allocation: {request:?}"),
            }
        }
        if let Some(taken) = &request.taken {
            assert_eq!(taken.iter().map(|t| t.1).sum::<i64>(), request.qty);
            assert!(taken.iter().all(|t| request.named.contains(&t.0.as_str())));
            assert!(!request.whole || taken.len() == 1, "{request:?}");
        }
    }
    let splits = told
        .iter()
        .filter(|r| r.taken.as_ref().is_some_and(|t| t.len() > 1))
        .count();
    eprintln!(
        "[locations] {} requests, answers by code {codes:?}, {splits} split over locations",
        told.len()
    );
    for (answer, what) in [(0, "an allocation"), (1, "a retry"), (2, "a refusal")] {
        assert!(codes.contains_key(&answer), "no {what}: {codes:?}");
    }
    assert!(splits > 0, "no allocation split over locations");

    // Each location's books, read from Redis directly.
    let mut direct = cluster.cluster_connection().unwrap();
    let loc_key = [stock_key(sku), b":loc".to_vec()].concat();
    let hash: std::collections::HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(&loc_key)
        .query(&mut direct)
        .unwrap();
    let field = |name: &str| hash.get(name).copied().unwrap_or(0);
    let sum_at = |name: &str, keep: &dyn Fn(&Told) -> bool| -> i64 {
        told.iter()
            .filter(|r| keep(r))
            .flat_map(|r| r.kept())
            .filter(|(at, _)| at == name)
            .map(|(_, units)| units)
            .sum()
    };
    let for_good = |r: &Told| !r.reverted && (!r.hold || r.confirmed);
    let on_hold = |r: &Told| !r.reverted && r.hold && !r.confirmed;
    for (name, initial, floor) in WAREHOUSES {
        let (available, held) = (field(name), field(&format!("{name}:held")));
        let taken = sum_at(name, &for_good);
        eprintln!("[locations] {name}: {available} available, {held} held, {taken} taken");
        assert_eq!(available + held + taken, initial, "{name}: conservation");
        assert_eq!(held, sum_at(name, &on_hold), "{name}: units held");
        assert!(
            available >= floor,
            "{name}: {available} below its floor {floor}"
        );
    }
    let held_total: Option<i64> = redis::cmd("GET")
        .arg([stock_key(sku), b":held".to_vec()].concat())
        .query(&mut direct)
        .unwrap();
    let held_qty: i64 = told
        .iter()
        .filter(|r| on_hold(r) && r.taken.is_some())
        .map(|r| r.qty - r.shrunk)
        .sum();
    assert_eq!(held_total.unwrap_or(0), held_qty, "the sku's units held");

    // Every request's record says what its replies said.
    use stockgate::record::{Record, State};
    for request in &told {
        let raw: Option<String> = redis::cmd("GET")
            .arg(record_key(sku, &request.id))
            .query(&mut direct)
            .unwrap();
        let Some(_) = &request.taken else {
            assert_eq!(raw, None, "a request answered 2 left a record: {request:?}");
            continue;
        };
        let record = Record::parse(&raw.expect("a record")).expect("a record's shape");
        let state = match () {
            _ if request.reverted => State::Reverted,
            _ if !request.hold => State::Deducted,
            _ if request.confirmed => State::Confirmed,
            _ => State::Held,
        };
        let kept: Vec<String> = request
            .kept()
            .iter()
            .map(|(at, units)| format!("{at}={units}"))
            .collect();
        assert_eq!(
            (record.state, record.qty as i64, record.allocation),
            (state, request.qty - request.shrunk, Some(kept.join(","))),
            "{request:?}"
        );
    }
    drop((a, b));
}

/// Reads of a SKU kept by location acknowledge no write: with
/// `--wait-replicas` and no replica to confirm anything (a standalone
/// Redis), STOCK.GET and STOCK.LOCATIONS still answer, whatever the total
/// (0, 1 and 4 are the codes of a write that needs its replicas), as they
/// do for a SKU that keeps one number.
#[tokio::test]
async fn reads_by_location_need_no_replica_under_wait_replicas() {
    let redis = standalone();
    let server = proxy(vec![redis.url()], |c| {
        c.upstream.durability = Some(stockgate::config::Durability {
            replicas: 1,
            timeout: Duration::from_millis(50),
        });
    })
    .await;
    let mut conn = client(&server, false).await;
    let mut direct = redis.node.connection().unwrap();
    let loc_key = [stock_key("lone"), b":loc".to_vec()].concat();
    for total in [0i64, 1, 4, 7] {
        redis::pipe()
            .cmd("SET")
            .arg(stock_key("lone"))
            .arg("loc")
            .cmd("HSET")
            .arg(&loc_key)
            .arg("w1")
            .arg(total)
            .query::<()>(&mut direct)
            .unwrap();
        let got: redis::RedisResult<i64> = redis::cmd("STOCK.GET")
            .arg("lone")
            .query_async(&mut conn)
            .await;
        assert_eq!(got.map_err(|e| e.to_string()), Ok(total), "STOCK.GET");
        let listed = send(&mut conn, &["STOCK.LOCATIONS", "lone"]).await;
        assert!(listed.is_ok(), "STOCK.LOCATIONS at {total}: {listed:?}");
    }
    drop(server);
}

/// A HOLD.AT nobody touches comes back by the sweeper alone (no call on
/// its SKU releases it: the hash is read directly), to each location it
/// came from, its record EXPIRED.
#[tokio::test]
async fn the_sweeper_gives_back_a_hold_at_nobody_touches() {
    let (redis, server) = located_server(ServerKind::Redis7).await;
    let mut conn = client(&server, false).await;
    for (op, loc) in [("s1", "w1"), ("s2", "w2")] {
        let set = send(&mut conn, &["STOCK.SET", "left", "2", op, "AT", loc]).await;
        assert_eq!(code(&set.unwrap()), 0);
    }
    let hold = ["HOLD.AT", "left", "3", "h1", "1000", "SPLIT", "w2", "w1"];
    let held = allocation(send(&mut conn, &hold).await.unwrap());
    assert_eq!(held.taken, taken(&[("w2", 2), ("w1", 1)]));
    let mut direct = redis.node.connection().unwrap();
    let loc_key = [stock_key("left"), b":loc".to_vec()].concat();
    let back = loop_until_async(Duration::from_secs(30), || {
        let hash: std::collections::HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(&loc_key)
            .query(&mut direct)
            .unwrap();
        let units = |f: &str| hash.get(f).copied().unwrap_or(0);
        let back = (units("w1"), units("w2"), units("w1:held"), units("w2:held"));
        async move { (back == (2, 2, 0, 0)).then_some(back) }
    })
    .await;
    assert_eq!(back, (2, 2, 0, 0));
    let mut direct = redis.node.connection().unwrap();
    assert_eq!(record_state(&mut direct, "left", "h1"), 'X');
    drop(server);
}

/// A SKU sold out while it kept one number, then kept by location (its
/// stock key deleted, then STOCK.SET ... AT): stockgate remembered it
/// short, and a DEDUCT that names no location must still answer 3 (name
/// them), not the read's BADSTOCK of a stock value that is no integer.
#[tokio::test]
async fn a_sold_out_sku_moved_to_locations_answers_deduct_3() {
    let (redis, server) = located_server(ServerKind::Redis7).await;
    let mut conn = client(&server, false).await;
    let set = send(&mut conn, &["STOCK.SET", "moved", "0", "s0"]).await;
    assert_eq!(code(&set.unwrap()), 0);
    for id in ["d0", "d1", "d2"] {
        let short = send(&mut conn, &["DEDUCT", "moved", "1", id]).await;
        assert_eq!(code(&short.unwrap()), 2);
    }
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("DEL")
        .arg(stock_key("moved"))
        .query::<()>(&mut direct)
        .unwrap();
    let set = send(&mut conn, &["STOCK.SET", "moved", "5", "s1", "AT", "w1"]).await;
    assert_eq!(code(&set.unwrap()), 0);
    for id in ["e0", "e1"] {
        let plain = parse(
            send(&mut conn, &["DEDUCT", "moved", "1", id])
                .await
                .unwrap(),
        );
        assert_eq!(plain.code, 3, "{plain:?}");
    }
    let at = allocation(
        send(&mut conn, &["DEDUCT.AT", "moved", "1", "a1", "SPLIT", "w1"])
            .await
            .unwrap(),
    );
    assert_eq!((at.code, at.remain), (0, 4));
    drop(server);
}

/// Waits until Redis time (the one that decides every expiry) is past
/// `at_ms`.
async fn redis_time_past(conn: &mut redis::Connection, at_ms: i64) {
    loop_until_async(Duration::from_secs(30), || {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
        async move { (secs * 1000 + micros / 1000 > at_ms).then_some(()) }
    })
    .await
}

matrix! { #[tokio::test] async fn a_one_number_script_refuses_a_record_made_by_allocation }
/// A record made by allocation is never applied to a one number (issue
/// 44). The state an import that overwrote a SKU kept by location left:
/// its stock key an integer again, its deduction and its hold (run out)
/// recorded by location. Every script of a SKU that keeps one number that
/// reads such a record answers BADRECORD and changes nothing: the 5 units
/// deducted at `north` are not given to the one number, nor is the hold
/// that ran out, whoever releases the SKU's holds (a call, STOCK.GET, the
/// sweeper).
async fn a_one_number_script_refuses_a_record_made_by_allocation(kind: ServerKind) {
    let (redis, server) = located_server(kind).await;
    let mut conn = client(&server, false).await;
    let set = must(&mut conn, &["STOCK.SET", "imp", "6", "r", "AT", "north"]).await;
    assert_eq!(code(&set), 0);
    let deducted = allocation(
        must(
            &mut conn,
            &["DEDUCT.AT", "imp", "5", "d1", "SPLIT", "north"],
        )
        .await,
    );
    assert_eq!(deducted.code, 0);
    let held = allocation(
        must(
            &mut conn,
            &["HOLD.AT", "imp", "1", "h1", "1000", "SPLIT", "north"],
        )
        .await,
    );
    assert_eq!(held.code, 0);
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("imp"))
        .arg("10")
        .query::<()>(&mut direct)
        .unwrap();
    redis_time_past(&mut direct, held.expires_at).await;
    let before = sku_dump(&mut direct, "imp", &["d1", "h1"]);

    for args in [
        &["REVERT", "imp", "d1"][..],
        &["REVERT", "imp", "h1"],
        &["CONFIRM", "imp", "h1"],
        &["DEDUCT", "imp", "5", "d1"],
        &["HOLD", "imp", "1", "h1", "60000"],
        &["HOLD.EXTEND", "imp", "h1", "c1", "60000"],
        &["HOLD.SHRINK", "imp", "h1", "c2", "1"],
        &["STOCK.STATUS", "imp", "d1"],
    ] {
        let refused = send(&mut conn, args).await;
        let err = refused.expect_err(&format!("{args:?} must be refused"));
        assert!(err.to_string().contains("BADRECORD"), "{args:?}: {err}");
    }
    // The hold by location that ran out is not the one number's to take
    // back.
    let stock: i64 = redis::cmd("STOCK.GET")
        .arg("imp")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stock, 10);
    assert_eq!(sku_dump(&mut direct, "imp", &["d1", "h1"]), before);
    drop(server);
}

matrix! { #[tokio::test] async fn a_sku_s_total_over_its_locations_stays_within_2_pow_53_minus_1 }
/// A SKU's total over its locations stays within 2^53 - 1, Lua's exact
/// range, as a one-number stock does: an operator's change that would
/// take it past answers 3 and changes nothing, so every total a reply
/// shows is exact (issue 44: 2^53 - 1 and 2 answered 2^53).
async fn a_sku_s_total_over_its_locations_stays_within_2_pow_53_minus_1(kind: ServerKind) {
    const EXACT: i64 = 9_007_199_254_740_991;
    let (_redis, server) = located_server(kind).await;
    let mut conn = client(&server, false).await;
    let exact = EXACT.to_string();
    let below = (EXACT - 1).to_string();
    let set = must(
        &mut conn,
        &["STOCK.SET", "big", &exact, "s1", "AT", "north"],
    )
    .await;
    assert_eq!(code(&set), 0);
    for args in [
        &["STOCK.SET", "big", "2", "s2", "AT", "south"][..],
        &["STOCK.SET", "big", "1", "s3", "AT", "south", "FLOOR", "1"],
        &["STOCK.ADD", "big", "1", "a1", "AT", "north"],
    ] {
        let over = parse(must(&mut conn, args).await);
        assert_eq!(over.code, 3, "{args:?}: {over:?}");
        assert!(
            over.reason.as_deref().unwrap_or("").contains("2^53 - 1"),
            "{args:?}: {over:?}"
        );
    }
    let set = must(&mut conn, &["STOCK.SET", "big", "0", "s4", "AT", "south"]).await;
    assert_eq!(
        code(&set),
        0,
        "a location of 0 keeps the total at the bound"
    );
    assert_eq!(
        locations(&mut conn, "big").await,
        (
            EXACT,
            vec![("north".into(), EXACT, 0, 0), ("south".into(), 0, 0, 0)]
        )
    );
    let set = must(
        &mut conn,
        &["STOCK.SET", "big", &below, "s5", "AT", "north"],
    )
    .await;
    assert_eq!(code(&set), 0, "a change that lowers the total");
    let add = must(&mut conn, &["STOCK.ADD", "big", "1", "a2", "AT", "south"]).await;
    assert_eq!(code(&add), 0, "up to the bound exactly");
    let over = must(&mut conn, &["STOCK.ADD", "big", "1", "a3", "AT", "south"]).await;
    assert_eq!(code(&over), 3);
    assert_eq!(
        locations(&mut conn, "big").await,
        (
            EXACT,
            vec![("north".into(), EXACT - 1, 0, 0), ("south".into(), 1, 0, 0)]
        )
    );
    let total: i64 = redis::cmd("STOCK.GET")
        .arg("big")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(total, EXACT);
    let taken = allocation(
        must(
            &mut conn,
            &["DEDUCT.AT", "big", "2", "d1", "SPLIT", "south", "north"],
        )
        .await,
    );
    assert_eq!((taken.code, taken.remain), (0, EXACT - 2));
    drop(server);
}

matrix! { #[tokio::test] async fn stock_status_of_a_request_by_location_answers_the_sku_s_total }
/// STOCK.STATUS of a request on a SKU kept by location answers the SKU's
/// total available as its `stock`, as STOCK.GET does, and the request's
/// hold that ran out as EXPIRED, its units back where they came from.
async fn stock_status_of_a_request_by_location_answers_the_sku_s_total(kind: ServerKind) {
    let (redis, server) = located_server(kind).await;
    let mut conn = client(&server, false).await;
    for (op, loc, qty) in [("s1", "w1", "10"), ("s2", "w2", "5")] {
        let set = must(&mut conn, &["STOCK.SET", "sta", qty, op, "AT", loc]).await;
        assert_eq!(code(&set), 0);
    }
    let d = allocation(
        must(
            &mut conn,
            &["DEDUCT.AT", "sta", "3", "d1", "SPLIT", "w2", "w1"],
        )
        .await,
    );
    assert_eq!(d.code, 0);
    let h = allocation(
        must(
            &mut conn,
            &["HOLD.AT", "sta", "4", "h1", "1000", "SPLIT", "w2", "w1"],
        )
        .await,
    );
    assert_eq!((h.code, h.remain), (0, 8));
    let reader = conn.clone();
    let status = |id: &'static str| {
        let mut conn = reader.clone();
        async move {
            let Value::Array(fields) = must(&mut conn, &["STOCK.STATUS", "sta", id]).await else {
                panic!("a map, flat in RESP2")
            };
            fields
                .chunks(2)
                .map(|pair| (text(&pair[0]), pair[1].clone()))
                .collect::<std::collections::HashMap<String, Value>>()
        }
    };
    let deducted = status("d1").await;
    assert_eq!(deducted["state"], Value::BulkString(b"DEDUCTED".to_vec()));
    assert_eq!(deducted["qty"], Value::Int(3));
    assert_eq!(deducted["stock"], Value::Int(8), "{deducted:?}");
    assert_eq!(deducted["held"], Value::Int(4));

    let mut direct = redis.node.connection().unwrap();
    redis_time_past(&mut direct, h.expires_at).await;
    let expired = status("h1").await;
    assert_eq!(expired["state"], Value::BulkString(b"EXPIRED".to_vec()));
    assert_eq!(expired["stock"], Value::Int(12), "{expired:?}");
    assert_eq!(expired["held"], Value::Int(0));
    assert_eq!(expired["expires_at"], Value::Int(h.expires_at));
    assert_eq!(
        locations(&mut conn, "sta").await,
        (12, vec![("w1".into(), 10, 0, 0), ("w2".into(), 2, 0, 0)])
    );
    let none = status("nobody").await;
    assert_eq!(none["state"], Value::BulkString(b"none".to_vec()));
    assert_eq!(none["stock"], Value::Int(12));
    drop(server);
}

/// A SKU that changes how it keeps its stock while STOCK.GET reads it (its
/// keys rewritten behind stockgate's back, between one number 7 and one
/// location of 5): every read shows one kind's stock, never a refusal's
/// code read as a stock (a one-number SKU refused by the located read
/// once showed 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_get_of_a_sku_changing_kind_shows_one_kind_s_stock() {
    let (redis, server) = located_server(ServerKind::Redis7).await;
    let mut conn = client(&server, false).await;
    let set = send(&mut conn, &["STOCK.SET", "flips", "5", "f0", "AT", "w1"]).await;
    assert_eq!(code(&set.unwrap()), 0);
    let stock = String::from_utf8(stock_key("flips")).unwrap();
    let (locs, parked) = (format!("{stock}:loc"), format!("{stock}:parked"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let mut direct = redis.node.connection().unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let flip = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == 'loc' then \
                   redis.call('RENAME', KEYS[2], KEYS[3]) redis.call('SET', KEYS[1], '7') \
                 else \
                   redis.call('RENAME', KEYS[3], KEYS[2]) redis.call('SET', KEYS[1], 'loc') \
                 end return 1",
            );
            let mut flips = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: i64 = flip
                    .key(&stock)
                    .key(&locs)
                    .key(&parked)
                    .invoke(&mut direct)
                    .unwrap();
                flips += 1;
            }
            flips
        })
    };
    let (mut plain, mut located, mut again) = (0, 0, 0);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        match send(&mut conn, &["STOCK.GET", "flips"]).await {
            Ok(Value::Int(7)) => plain += 1,
            Ok(Value::Int(5)) => located += 1,
            Err(e) if e.code() == Some("TRYAGAIN") => again += 1,
            other => panic!("STOCK.GET of a SKU changing kind answered {other:?}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flips = flipper.join().unwrap();
    assert!(flips > 100, "the SKU changed kind {flips} times");
    assert!(
        plain > 0 && located > 0,
        "read as one number {plain} times, by location {located}, {again} told to try again"
    );
    drop(server);
}

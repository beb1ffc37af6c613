//! ORDER, ORDER.HOLD, ORDER.CONFIRM and ORDER.REVERT against a real
//! 3-primary cluster, the lines of every order on different primaries:
//! all lines or none, retries through any stockgate, concurrent attempts,
//! a saga cut short (by hand, phase by phase, and by SIGKILL), and order
//! holds expiring while ORDER.CONFIRM races them. No timed assertions:
//! tests assert states and counts, and wait for states with generous
//! bounds.
//!
//! The contract (all or none, retries, revert, order holds and their
//! status, invalid orders, a saga finished by a retry), the races and the
//! faults run against each server of the upstream matrix.

mod support;

use redis::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use stockgate::keys::sku_slot;
use stockgate::params::{RequestId, Sku};
use stockgate::script::Scripts;
use support::*;

/// An order command's reply, read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OrderReply {
    code: i64,
    expires_at: i64,
    remains: Vec<(String, i64)>,
    short: Vec<String>,
    reason: Option<String>,
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not text: {other:?}"),
    }
}

fn parse_order(value: Value) -> OrderReply {
    let Value::Array(items) = value else {
        panic!("not an order reply: {value:?}")
    };
    let int = |v: &Value| match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    };
    assert_eq!(int(&items[1]), 4, "version");
    let Value::Array(lines) = &items[3] else {
        panic!("lines: {:?}", items[3])
    };
    let Value::Array(short) = &items[4] else {
        panic!("short: {:?}", items[4])
    };
    OrderReply {
        code: int(&items[0]),
        expires_at: int(&items[2]),
        remains: lines
            .chunks(2)
            .map(|pair| (text(&pair[0]), int(&pair[1])))
            .collect(),
        short: short.iter().map(text).collect(),
        reason: items.get(5).map(text),
    }
}

/// Sends an order command; a fault is an `Err`.
async fn send(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> redis::RedisResult<OrderReply> {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async::<Value>(conn).await.map(parse_order)
}

async fn must(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> OrderReply {
    send(conn, args)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Three SKU names, one on each third of the slots (each on its own
/// primary of a 3-primary cluster made by `cluster_of`).
fn spread(prefix: &str) -> [String; 3] {
    let mut found: [Option<String>; 3] = Default::default();
    for n in 0.. {
        let name = format!("{prefix}-{n}");
        let third = (sku_slot(&Sku::parse(name.clone().into()).unwrap()) / 5462) as usize;
        if found[third].is_none() {
            found[third] = Some(name);
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found.map(Option::unwrap)
}

fn line_id(order: &str) -> String {
    format!("~ord:{order}")
}

/// The state letter of an order's line record on `sku` ('-': none).
fn line_state(cluster: &stockgate::dev::LocalCluster, sku: &str, order: &str) -> char {
    let mut conn = cluster.cluster_connection().unwrap();
    record_state(&mut conn, sku, &line_id(order))
}

fn intent_phase(cluster: &stockgate::dev::LocalCluster, order: &str) -> Option<String> {
    let mut conn = cluster.cluster_connection().unwrap();
    let key = layout().order_key(&RequestId::parse(order.to_owned().into()).unwrap());
    redis::cmd("HGET")
        .arg(key)
        .arg("p")
        .query(&mut conn)
        .unwrap()
}

matrix! { #[tokio::test] async fn an_order_is_all_lines_or_none_and_answers_its_retries }
async fn an_order_is_all_lines_or_none_and_answers_its_retries(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("all");
    set_stock(&cluster, &a, 10);
    set_stock(&cluster, &b, 10);
    set_stock(&cluster, &c, 1);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;

    // A short line: nothing applied anywhere, and the reply names it.
    let short = must(&mut conn, &["ORDER", "o-short", &a, "2", &b, "3", &c, "5"]).await;
    assert_eq!(short.code, 2, "{short:?}");
    assert_eq!(short.short, vec![c.clone()]);
    for (sku, stock) in [(&a, 10), (&b, 10), (&c, 1)] {
        assert_eq!(get_stock(&cluster, sku), Some(stock), "{sku}");
        assert_eq!(held(&cluster, sku), 0, "{sku}");
        assert_ne!(line_state(&cluster, sku, "o-short"), 'D');
    }
    // Its retry answers the recorded outcome.
    let again = must(&mut conn, &["ORDER", "o-short", &c, "5", &a, "2", &b, "3"]).await;
    assert_eq!((again.code, again.short.clone()), (2, vec![c.clone()]));
    // An ORDER.HOLD that comes up short holds nothing, and shows no
    // expiry, as a single HOLD answering 2 shows none.
    let short_hold = must(
        &mut conn,
        &["ORDER.HOLD", "o-short-hold", "60000", &a, "2", &c, "5"],
    )
    .await;
    assert_eq!(
        (short_hold.code, short_hold.expires_at),
        (2, 0),
        "{short_hold:?}"
    );
    let single: Vec<redis::Value> = redis::cmd("HOLD")
        .arg(&c)
        .arg(5)
        .arg("single-short")
        .arg(60000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        (&single[0], &single[4]),
        (&redis::Value::Int(2), &redis::Value::Int(0)),
        "{single:?}"
    );

    // Every line fits: every line deducted (taken by a line DEDUCT), once.
    let holds = |event: &str| {
        metric(
            &server,
            &format!("stockgate_holds_total{{event=\"{event}\"}}"),
        )
    };
    let (placed, confirmed) = (holds("placed"), holds("confirmed"));
    let ok = must(&mut conn, &["ORDER", "o-1", &a, "2", &b, "3", &c, "1"]).await;
    assert_eq!(ok.code, 0, "{ok:?}");
    // Its lines are taken, not held: no hold is placed or confirmed.
    assert_eq!(
        (holds("placed") - placed, holds("confirmed") - confirmed),
        (0, 0)
    );
    let mut sorted = [a.clone(), b.clone(), c.clone()];
    sorted.sort();
    assert_eq!(
        ok.remains
            .iter()
            .map(|(s, _)| s.clone())
            .collect::<Vec<_>>(),
        sorted.to_vec()
    );
    let remains: HashMap<_, _> = ok.remains.iter().cloned().collect();
    assert_eq!((remains[&a], remains[&b], remains[&c]), (8, 7, 0));
    for (sku, stock) in [(&a, 8), (&b, 7), (&c, 0)] {
        assert_eq!(get_stock(&cluster, sku), Some(stock), "{sku}");
        assert_eq!(line_state(&cluster, sku, "o-1"), 'D', "{sku}");
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }
    assert_eq!(intent_phase(&cluster, "o-1").as_deref(), Some("DONE"));
    // The same lines in another order: a duplicate.
    let dup = must(&mut conn, &["ORDER", "o-1", &c, "1", &b, "3", &a, "2"]).await;
    assert_eq!(dup.code, 1, "{dup:?}");
    // Another line set under the same request_id: invalid.
    for other in [
        vec!["ORDER", "o-1", &a, "2", &b, "3"],
        vec!["ORDER", "o-1", &a, "2", &b, "3", &c, "2"],
        vec!["ORDER.HOLD", "o-1", "60000", &a, "2", &b, "3", &c, "1"],
    ] {
        let refused = must(&mut conn, &other).await;
        assert_eq!(refused.code, 3, "{other:?}: {refused:?}");
        assert!(refused.reason.is_some());
    }
    assert_eq!(get_stock(&cluster, &a), Some(8));

    // ORDER.REVERT gives every line back, once; then the order is dead.
    let reverted = must(&mut conn, &["ORDER.REVERT", "o-1"]).await;
    assert_eq!(reverted.code, 0, "{reverted:?}");
    for (sku, stock) in [(&a, 10), (&b, 10), (&c, 1)] {
        assert_eq!(get_stock(&cluster, sku), Some(stock), "{sku}");
        assert_eq!(line_state(&cluster, sku, "o-1"), 'R', "{sku}");
    }
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "o-1"]).await.code, 1);
    let late = must(&mut conn, &["ORDER", "o-1", &a, "2", &b, "3", &c, "1"]).await;
    assert_eq!(late.code, 4, "{late:?}");
    assert_eq!(get_stock(&cluster, &a), Some(10));

    // An aborted order has nothing to give back.
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "o-short"]).await.code, 1);
}

/// An order whose line names its locations (`<sku>{<POLICY>:<location>,...}`,
/// docs/locations.md): the line allocates over them in the one order, all
/// lines or none; ORDER.REVERT gives each unit back where it came from;
/// ORDER.HOLD's line holds at its locations, is extended and confirmed
/// there. A line on a SKU kept by location that names none is refused (3),
/// and the order's other lines with it. (lua/allocate.lua runs on all four
/// servers in tests/locations.rs; here one cluster carries the saga.)
#[tokio::test]
async fn an_order_line_allocates_over_the_locations_it_names() {
    let cluster = cluster();
    let [tee, mug, _] = spread("placed");
    set_stock(&cluster, &mug, 5);
    let server = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
    let mut conn = client(&server, false).await;
    for (op, qty, location) in [("s1", "2", "w1"), ("s2", "3", "w2")] {
        let set: Value = redis::cmd("STOCK.SET")
            .arg(&[tee.as_str(), qty, op, "AT", location])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            matches!(&set, Value::Array(items) if items[0] == Value::Int(0)),
            "{set:?}"
        );
    }
    let mut direct = cluster.cluster_connection().unwrap();
    let locations = [stock_key(&tee), b":loc".to_vec()].concat();
    let units = |direct: &mut redis::cluster::ClusterConnection| -> (i64, i64, i64, i64) {
        redis::cmd("HMGET")
            .arg(&locations)
            .arg(&["w1", "w2", "w1:held", "w2:held"])
            .query::<(i64, i64, Option<i64>, Option<i64>)>(direct)
            .map(|(a, b, c, d)| (a, b, c.unwrap_or(0), d.unwrap_or(0)))
            .unwrap()
    };

    let split = format!("{tee}{{SPLIT:w1,w2}}");
    let taken = must(&mut conn, &["ORDER", "p-1", &split, "4", &mug, "1"]).await;
    assert_eq!(taken.code, 0, "{taken:?}");
    assert_eq!(units(&mut direct), (0, 1, 0, 0));
    assert_eq!(get_stock(&cluster, &mug), Some(4));
    let raw: String = redis::cmd("GET")
        .arg(record_key(&tee, &line_id("p-1")))
        .query(&mut direct)
        .unwrap();
    assert!(raw.starts_with("@w1=2,w2=2;3:"), "{raw}");
    // The same order again: 1, nothing more taken.
    assert_eq!(
        must(&mut conn, &["ORDER", "p-1", &split, "4", &mug, "1"])
            .await
            .code,
        1
    );
    assert_eq!(units(&mut direct), (0, 1, 0, 0));

    // WHOLE: no location can give 2; no line applied anywhere.
    let whole = format!("{tee}{{WHOLE:w1,w2}}");
    let short = must(&mut conn, &["ORDER", "p-2", &whole, "2", &mug, "1"]).await;
    assert_eq!(short.code, 2, "{short:?}");
    assert_eq!(short.short, vec![tee.clone()]);
    assert_eq!(get_stock(&cluster, &mug), Some(4));

    // Every unit back where it came from.
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "p-1"]).await.code, 0);
    assert_eq!(units(&mut direct), (2, 3, 0, 0));
    assert_eq!(get_stock(&cluster, &mug), Some(5));

    // A held order: its line holds at w2, lasts longer, is confirmed there.
    let w2_first = format!("{tee}{{WHOLE:w2,w1}}");
    let held = must(&mut conn, &["ORDER.HOLD", "p-3", "60000", &w2_first, "3"]).await;
    assert_eq!(held.code, 0, "{held:?}");
    assert_eq!(units(&mut direct), (2, 0, 0, 3));
    let extended = must(&mut conn, &["ORDER.EXTEND", "p-3", "c-1", "120000"]).await;
    assert_eq!(extended.code, 0, "{extended:?}");
    assert!(extended.expires_at > held.expires_at);
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "p-3"]).await.code, 0);
    assert_eq!(units(&mut direct), (2, 0, 0, 0));

    // No locations named, or a bad placement: 3, nothing taken.
    let unplaced = must(&mut conn, &["ORDER", "p-4", &tee, "1", &mug, "1"]).await;
    assert_eq!(unplaced.code, 3, "{unplaced:?}");
    assert!(
        unplaced
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("by location")),
        "{unplaced:?}"
    );
    for bad in [
        format!("{tee}{{FIRST:w1}}"),
        format!("{tee}{{SPLIT:w1"),
        format!("{tee}{{SPLIT:}}"),
    ] {
        let refused = must(&mut conn, &["ORDER", "p-5", &bad, "1"]).await;
        assert_eq!(refused.code, 3, "{bad}: {refused:?}");
    }
    assert_eq!(units(&mut direct), (2, 0, 0, 0));
    assert_eq!(get_stock(&cluster, &mug), Some(5));
}

matrix! { #[tokio::test] async fn invalid_orders_are_code_3_and_touch_nothing }
async fn invalid_orders_are_code_3_and_touch_nothing(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, _] = spread("inv");
    set_stock(&cluster, &a, 10);
    set_stock(&cluster, &b, 10);
    let server = proxy(cluster.seeds(), |config| config.max_order_lines = 2).await;
    let mut conn = client(&server, false).await;
    for args in [
        vec!["ORDER", "i-1", &a, "1", &b],
        vec!["ORDER", "i-1", &a, "1", &a, "2"],
        vec!["ORDER", "i-1", &a, "0"],
        vec!["ORDER", "i-1", &a, "x"],
        vec!["ORDER", "i-1", &a, "1", &b, "1", "third", "1"],
        vec!["ORDER.HOLD", "i-1", "999", &a, "1"],
        vec!["ORDER.HOLD", "i-1", "60000", &a, "1", &b],
    ] {
        let refused = must(&mut conn, &args).await;
        assert_eq!(refused.code, 3, "{args:?}");
    }
    let long = "x".repeat(124);
    assert_eq!(must(&mut conn, &["ORDER", &long, &a, "1"]).await.code, 3);
    // Single-line commands may not touch an order's lines.
    let line = line_id("i-1");
    let refused = deduct(&mut conn, &a, "1", &line, None).await.unwrap();
    assert_eq!(parse(refused).code, 3);
    assert_eq!(get_stock(&cluster, &a), Some(10));
    assert_eq!(get_stock(&cluster, &b), Some(10));
    assert_eq!(intent_phase(&cluster, "i-1"), None);
    // The arity is Redis's error.
    let err = redis::cmd("ORDER")
        .arg("i-1")
        .query_async::<Value>(&mut conn)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("wrong number of arguments"),
        "{err}"
    );
    server.stop_now();

    the_widest_orders_are_carried_whole_and_one_line_more_is_code_3(&cluster).await;
}

/// `--max-order-lines` at its most, 1,000 (with `--max-request-bytes`
/// raised as start-up asks): an order of that many lines reaches stockgate
/// whole over RESP and over HTTP and is applied; one of a line more is
/// code 3, on a connection that stays open (it was a protocol error and a
/// close from 512 lines on over RESP, and a 400 from about 650 over HTTP).
async fn the_widest_orders_are_carried_whole_and_one_line_more_is_code_3(
    cluster: &stockgate::dev::LocalCluster,
) {
    const MOST: usize = 1000;
    let skus: Vec<String> = (0..=MOST).map(|i| format!("wide-{i}")).collect();
    let mut pipe = redis::cluster::cluster_pipe();
    for sku in &skus {
        pipe.cmd("SET").arg(stock_key(sku)).arg(2).ignore();
    }
    pipe.query::<()>(&mut cluster.cluster_connection().unwrap())
        .unwrap();
    let server = proxy(cluster.seeds(), |config| {
        config.max_order_lines = MOST;
        config.max_request_bytes = 256 * 1024;
        config.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let mut conn = client(&server, false).await;
    let order = |command: &str, id: &str, ttl: Option<&str>, lines: usize| {
        let mut args = vec![command.to_owned(), id.to_owned()];
        args.extend(ttl.map(str::to_owned));
        for sku in &skus[..lines] {
            args.extend([sku.clone(), "1".to_owned()]);
        }
        args
    };
    let send = async |conn: &mut redis::aio::MultiplexedConnection, args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        must(conn, &args).await
    };

    let whole = send(&mut conn, order("ORDER", "wide-1", None, MOST)).await;
    assert_eq!(
        (whole.code, whole.remains.len()),
        (0, MOST),
        "{:?}",
        whole.reason
    );
    let over = send(&mut conn, order("ORDER", "wide-2", None, MOST + 1)).await;
    assert_eq!(over.code, 3);
    let reason = over.reason.unwrap_or_default();
    assert!(reason.contains("at most 1000 lines"), "{reason}");
    let over = send(
        &mut conn,
        order("ORDER.HOLD", "wide-3", Some("60000"), MOST + 1),
    )
    .await;
    assert_eq!(over.code, 3);
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG", "the connection stays open");

    let http = server.http_addr.expect("http is enabled");
    let body = |id: &str, lines: usize| {
        let lines: Vec<serde_json::Value> = skus[..lines]
            .iter()
            .map(|sku| serde_json::json!({"sku": sku, "qty": 1}))
            .collect();
        serde_json::json!({"request_id": id, "lines": lines}).to_string()
    };
    let (status, reply) = post_json(http, "/v1/orders", body("wide-4", MOST)).await;
    assert_eq!(
        (status, &reply["code"]),
        (200, &serde_json::json!(0)),
        "{reply}"
    );
    let (status, reply) = post_json(http, "/v1/orders", body("wide-5", MOST + 1)).await;
    assert_eq!(
        (status, &reply["code"]),
        (400, &serde_json::json!(3)),
        "{reply}"
    );

    // Both whole orders took every line; the refused ones, none.
    for sku in [&skus[0], &skus[MOST - 1]] {
        assert_eq!(get_stock(cluster, sku), Some(0), "{sku}");
    }
    assert_eq!(get_stock(cluster, &skus[MOST]), Some(2));
    server.stop_now();
}

/// A POST of a JSON `body` to stockgate's HTTP face: the status and the
/// JSON reply. (Off the runtime's thread: stockgate serves on it.)
async fn post_json(
    http: std::net::SocketAddr,
    path: &'static str,
    body: String,
) -> (u16, serde_json::Value) {
    tokio::task::spawn_blocking(move || post_json_blocking(http, path, &body))
        .await
        .unwrap()
}

fn post_json_blocking(
    http: std::net::SocketAddr,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(http).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: stockgate\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{response}"));
    let json = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    (
        status,
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {response}")),
    )
}

matrix! { #[tokio::test] async fn a_revert_first_revokes_the_order_and_a_late_order_gets_4 }
async fn a_revert_first_revokes_the_order_and_a_late_order_gets_4(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("rev");
    for sku in [&a, &b, &c] {
        set_stock(&cluster, sku, 5);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "r-1"]).await.code, 4);
    assert_eq!(intent_phase(&cluster, "r-1").as_deref(), Some("REVOKED"));
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "r-1"]).await.code, 1);
    let late = must(&mut conn, &["ORDER", "r-1", &a, "1", &b, "1", &c, "1"]).await;
    assert_eq!(late.code, 4, "{late:?}");
    let late = must(&mut conn, &["ORDER.HOLD", "r-1", "60000", &a, "1"]).await;
    assert_eq!((late.code, late.expires_at), (4, 0), "{late:?}");
    // ORDER.CONFIRM of an order never held revokes it too.
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "r-2"]).await.code, 4);
    let late = must(&mut conn, &["ORDER.HOLD", "r-2", "60000", &a, "1"]).await;
    assert_eq!(late.code, 4);
    for sku in [&a, &b, &c] {
        assert_eq!(get_stock(&cluster, sku), Some(5));
        assert_eq!(line_state(&cluster, sku, "r-1"), '-');
    }
}

matrix! { #[tokio::test] async fn an_order_hold_is_confirmed_whole_or_reverted_whole }
async fn an_order_hold_is_confirmed_whole_or_reverted_whole(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("oh");
    for sku in [&a, &b, &c] {
        set_stock(&cluster, sku, 10);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let hold = must(
        &mut conn,
        &["ORDER.HOLD", "h-1", "600000", &a, "1", &b, "2", &c, "3"],
    )
    .await;
    assert_eq!(hold.code, 0, "{hold:?}");
    assert!(hold.expires_at > 0);
    for (sku, stock) in [(&a, 9), (&b, 8), (&c, 7)] {
        assert_eq!(get_stock(&cluster, sku), Some(stock));
        assert_eq!(line_state(&cluster, sku, "h-1"), 'H');
    }
    let again = must(
        &mut conn,
        &["ORDER.HOLD", "h-1", "600000", &c, "3", &a, "1", &b, "2"],
    )
    .await;
    assert_eq!((again.code, again.expires_at), (1, hold.expires_at));
    let confirmed = must(&mut conn, &["ORDER.CONFIRM", "h-1"]).await;
    assert_eq!(confirmed.code, 0, "{confirmed:?}");
    assert_eq!(confirmed.expires_at, hold.expires_at);
    for sku in [&a, &b, &c] {
        assert_eq!(line_state(&cluster, sku, "h-1"), 'C');
        assert_eq!(held(&cluster, sku), 0);
    }
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "h-1"]).await.code, 1);
    let status: Vec<Value> = redis::cmd("ORDER.STATUS")
        .arg("h-1")
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |name: &str| {
        let at = status
            .iter()
            .position(|v| matches!(v, Value::BulkString(b) if b == name.as_bytes()))
            .unwrap_or_else(|| panic!("no {name} in {status:?}"));
        status[at + 1].clone()
    };
    assert_eq!(text(&field("phase")), "DONE");
    assert_eq!(text(&field("kind")), "hold");
    assert_eq!(field("expires_at"), Value::Int(hold.expires_at));
    let Value::Array(lines) = field("lines") else {
        panic!("{status:?}")
    };
    assert_eq!(lines.len(), 6);
    let none: Vec<Value> = redis::cmd("ORDER.STATUS")
        .arg("h-unseen")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(text(&none[1]), "none");
    let hold_again = &["ORDER.HOLD", "h-1", "600000", &a, "1", &b, "2", &c, "3"];
    assert_eq!(must(&mut conn, hold_again).await.code, 1);

    // Another, reverted while held: every line back.
    let h2 = &["ORDER.HOLD", "h-2", "600000", &a, "1", &b, "1"];
    assert_eq!(must(&mut conn, h2).await.code, 0);
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "h-2"]).await.code, 0);
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "h-2"]).await.code, 4);
    assert_eq!(must(&mut conn, h2).await.code, 4);
    for (sku, stock) in [(&a, 9), (&b, 8), (&c, 7)] {
        assert_eq!(get_stock(&cluster, sku), Some(stock));
        assert_eq!(held(&cluster, sku), 0);
    }
    // ORDER.CONFIRM of an ORDER's id: invalid.
    assert_eq!(must(&mut conn, &["ORDER", "d-1", &a, "1"]).await.code, 0);
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "d-1"]).await.code, 3);
}

/// ORDER.CONFIRM may name the order's lines (as its ORDER.HOLD did, in any
/// order): then it is ordered on its connection by those SKUs alone, and
/// lines that are not the order's answer 3 and move nothing.
#[tokio::test]
async fn an_order_confirm_that_names_its_lines_confirms_only_those() {
    let cluster = shared_cluster();
    let [a, b, c] = spread("on");
    for sku in [&a, &b, &c] {
        set_stock(cluster, sku, 10);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let hold = &["ORDER.HOLD", "n-1", "600000", &a, "1", &b, "2"];
    assert_eq!(must(&mut conn, hold).await.code, 0);
    // A line short, a line more, another quantity, an unknown SKU: 3, and
    // the order still held.
    for other in [
        &["ORDER.CONFIRM", "n-1", &a, "1"][..],
        &["ORDER.CONFIRM", "n-1", &a, "1", &b, "2", &c, "1"],
        &["ORDER.CONFIRM", "n-1", &a, "1", &b, "1"],
        &["ORDER.CONFIRM", "n-1", &a, "1", &c, "2"],
    ] {
        let refused = must(&mut conn, other).await;
        assert_eq!(refused.code, 3, "{other:?}: {refused:?}");
        assert!(
            refused
                .reason
                .as_deref()
                .unwrap_or("")
                .contains("not the order's"),
            "{refused:?}"
        );
        assert_eq!(intent_phase(cluster, "n-1").as_deref(), Some("HELD"));
        assert_eq!(line_state(cluster, &a, "n-1"), 'H');
    }
    // Malformed lines: 3 before anything is asked of Redis.
    let odd = must(&mut conn, &["ORDER.CONFIRM", "n-1", &a]).await;
    assert_eq!(odd.code, 3, "{odd:?}");
    let confirmed = must(&mut conn, &["ORDER.CONFIRM", "n-1", &b, "2", &a, "1"]).await;
    assert_eq!(confirmed.code, 0, "{confirmed:?}");
    for (sku, stock) in [(&a, 9), (&b, 8)] {
        assert_eq!(line_state(cluster, sku, "n-1"), 'C');
        assert_eq!(held(cluster, sku), 0);
        assert_eq!(get_stock(cluster, sku), Some(stock));
    }
    assert_eq!(
        must(&mut conn, &["ORDER.CONFIRM", "n-1", &a, "1", &b, "2"])
            .await
            .code,
        1
    );
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "n-1"]).await.code, 1);
    // Of an order never held, as without lines: revoked, and a late
    // ORDER.HOLD of it gets 4.
    assert_eq!(
        must(&mut conn, &["ORDER.CONFIRM", "n-2", &c, "1"])
            .await
            .code,
        4
    );
    assert_eq!(
        must(&mut conn, &["ORDER.HOLD", "n-2", "600000", &c, "1"])
            .await
            .code,
        4
    );
    assert_eq!(get_stock(cluster, &c), Some(10));

    // Pipelined on one connection behind an ORDER.HOLD of other SKUs that
    // waits for a DEDUCT's stock: each takes effect in the order sent.
    let mut pipe = redis::pipe();
    pipe.cmd("ORDER.HOLD")
        .arg("n-3")
        .arg(600_000)
        .arg(&a)
        .arg(1);
    pipe.cmd("ORDER.CONFIRM").arg("n-3").arg(&a).arg(1);
    pipe.cmd("STOCK.STATUS").arg(&a).arg(line_id("n-3"));
    pipe.cmd("DEDUCT").arg(&c).arg(1).arg("n-4").arg("ORD");
    let replies: Vec<Value> = pipe.query_async(&mut conn).await.unwrap();
    assert_eq!(replies.len(), 4);
    let status = format!("{:?}", replies[2]);
    assert!(
        status.contains("CONFIRMED"),
        "the status after the confirm sees it: {status}"
    );
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn order_holds_expiring_while_confirm_races_them }
/// Order holds of 1000 ms, each raced by an ORDER.CONFIRM sent around its
/// expiry: each answers 0 (every line confirmed) or 5 (every line given
/// back), and the books say the same.
async fn order_holds_expiring_while_confirm_races_them(kind: ServerKind) {
    const ORDERS: usize = 24;
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("race");
    for sku in [&a, &b, &c] {
        set_stock(&cluster, sku, 1000);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let addr = server.addr;
    let tasks: Vec<_> = (0..ORDERS)
        .map(|i| {
            let (a, b, c) = (a.clone(), b.clone(), c.clone());
            tokio::spawn(async move {
                let mut conn = client_at(addr, false).await;
                let id = format!("race-{i}");
                let held = must(
                    &mut conn,
                    &["ORDER.HOLD", &id, "1000", &a, "1", &b, "2", &c, "3"],
                )
                .await;
                assert_eq!(held.code, 0, "{held:?}");
                // Spread the confirms over the hold's last moments and
                // just after: some win, some come too late.
                tokio::time::sleep(Duration::from_millis(850 + 20 * i as u64)).await;
                let confirmed = must(&mut conn, &["ORDER.CONFIRM", &id]).await;
                assert!(matches!(confirmed.code, 0 | 5), "{confirmed:?}");
                (id, confirmed.code)
            })
        })
        .collect();
    let mut confirmed = 0;
    for task in tasks {
        let (id, code) = task.await.unwrap();
        for sku in [&a, &b, &c] {
            let state = line_state(&cluster, sku, &id);
            if code == 0 {
                assert_eq!(state, 'C', "{id} {sku}");
            } else {
                assert!(matches!(state, 'R' | 'X' | 'H'), "{id} {sku}: {state}");
            }
        }
        confirmed += usize::from(code == 0);
    }
    // The lines of expired orders come back, by themselves or reverted.
    let conn = client(&server, false).await;
    for (sku, qty) in [(&a, 1), (&b, 2), (&c, 3)] {
        let want = 1000 - qty * confirmed as i64;
        let cluster = &cluster;
        loop_until_async(Duration::from_secs(60), || {
            let mut conn = conn.clone();
            async move {
                // Any call on the SKU releases its expired holds.
                let _ = redis::cmd("STOCK.GET")
                    .arg(sku.as_str())
                    .query_async::<Value>(&mut conn)
                    .await;
                (get_stock(cluster, sku) == Some(want)).then_some(())
            }
        })
        .await;
        assert_eq!(held(cluster, sku), 0);
    }
    eprintln!("{confirmed} of {ORDERS} confirmed in time");
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn concurrent_orders_through_two_stockgates_win_exactly_the_last_units }
/// Orders competing for the last units of one SKU, each sent through two
/// stockgates at once: exactly as many win as there are units, each pair
/// of answers agrees, and each winner has every line applied.
async fn concurrent_orders_through_two_stockgates_win_exactly_the_last_units(kind: ServerKind) {
    const ORDERS: usize = 12;
    const UNITS: i64 = 4;
    let cluster = cluster_of(kind);
    let [last, b, c] = spread("last");
    set_stock(&cluster, &last, UNITS);
    set_stock(&cluster, &b, 100);
    set_stock(&cluster, &c, 100);
    let one = proxy(cluster.seeds(), |_| {}).await;
    let two = proxy(cluster.seeds(), |_| {}).await;
    let (one, two) = (one.addr, two.addr);
    let tasks: Vec<_> = (0..ORDERS)
        .map(|i| {
            let (last, b, c) = (last.clone(), b.clone(), c.clone());
            tokio::spawn(async move {
                let id = format!("last-{i}");
                let args = ["ORDER", &id, &last, "1", &b, "2", &c, "1"];
                let mut x = client_at(one, false).await;
                let mut y = client_at(two, false).await;
                let (p, q) = tokio::join!(must(&mut x, &args), must(&mut y, &args));
                (id, p.code, q.code)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (id, p, q) = task.await.unwrap();
        let mut pair = [p, q];
        pair.sort();
        assert!(pair == [0, 1] || pair == [2, 2], "{id}: {pair:?}");
        if pair == [0, 1] {
            winners.push(id);
        } else {
            for sku in [&last, &b, &c] {
                assert_ne!(line_state(&cluster, sku, &id), 'D', "{id} {sku}");
            }
            assert_eq!(intent_phase(&cluster, &id).as_deref(), Some("ABORTED"));
        }
    }
    assert_eq!(winners.len() as i64, UNITS);
    for id in &winners {
        for sku in [&last, &b, &c] {
            assert_eq!(line_state(&cluster, sku, id), 'D', "{id} {sku}");
        }
    }
    assert_eq!(get_stock(&cluster, &last), Some(0));
    assert_eq!(get_stock(&cluster, &b), Some(100 - 2 * UNITS));
    assert_eq!(get_stock(&cluster, &c), Some(100 - UNITS));
    for sku in [&last, &b, &c] {
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn order_revert_racing_an_order_in_flight_leaves_no_line_deducted }
/// ORDER.REVERT sent while the ORDER is in flight (through another
/// stockgate): whichever wins, every line ends given back or revoked,
/// never deducted, and the stock is whole again.
async fn order_revert_racing_an_order_in_flight_leaves_no_line_deducted(kind: ServerKind) {
    const ORDERS: usize = 30;
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("inflight");
    for sku in [&a, &b, &c] {
        set_stock(&cluster, sku, 1000);
    }
    let one = proxy(cluster.seeds(), |_| {}).await;
    let two = proxy(cluster.seeds(), |_| {}).await;
    let (one, two) = (one.addr, two.addr);
    let tasks: Vec<_> = (0..ORDERS)
        .map(|i| {
            let (a, b, c) = (a.clone(), b.clone(), c.clone());
            tokio::spawn(async move {
                let id = format!("inflight-{i}");
                let mut x = client_at(one, false).await;
                let mut y = client_at(two, false).await;
                let order = ["ORDER", &id, &a, "1", &b, "1", &c, "1"];
                let revert = ["ORDER.REVERT", &id];
                // Stagger the revert a little, so it lands in every phase.
                let (o, r) = tokio::join!(must(&mut x, &order), async {
                    tokio::time::sleep(Duration::from_micros(200 * (i as u64 % 10))).await;
                    must(&mut y, &revert).await
                });
                (id, o.code, r.code)
            })
        })
        .collect();
    for task in tasks {
        let (id, o, r) = task.await.unwrap();
        // The order either lost (4), or won and was then given back (0).
        assert!(
            (o == 4 && matches!(r, 0 | 4)) || (o == 0 && r == 0),
            "{id}: order {o}, revert {r}"
        );
        for sku in [&a, &b, &c] {
            let state = line_state(&cluster, sku, &id);
            // '-': the revert came first, and the order never began.
            assert!(matches!(state, 'R' | 'V' | '-'), "{id} {sku}: {state}");
        }
        let phase = intent_phase(&cluster, &id);
        assert!(
            matches!(phase.as_deref(), Some("REVERTED" | "REVOKED")),
            "{id}: {phase:?}"
        );
    }
    for sku in [&a, &b, &c] {
        assert_eq!(get_stock(&cluster, sku), Some(1000), "{sku}");
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }
}

/// What stockgate's saga does, step by step, run by hand against the
/// cluster with stockgate's own scripts: to leave an order where a
/// stockgate that died would have left it.
struct Saga {
    conn: redis::cluster::ClusterConnection,
    scripts: Scripts,
}

const WINDOW: &str = "86400000";

impl Saga {
    fn new(cluster: &stockgate::dev::LocalCluster) -> Saga {
        Saga {
            conn: cluster.cluster_connection().unwrap(),
            scripts: Scripts::new(),
        }
    }

    fn intent(&mut self, order: &str, args: &[&str]) -> Value {
        let key = layout().order_key(&RequestId::parse(order.to_owned().into()).unwrap());
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&self.scripts.order.body).arg(1).arg(key);
        cmd.arg(args[0]).arg(WINDOW).arg("abc123");
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.conn).unwrap()
    }

    /// A line's call: the caller's arguments, then the settings (the
    /// words stockgate sends, the flags "00" last), then a nonce.
    fn line(&mut self, script: &str, sku: &str, order: &str, args: &[&str], settings: &str) -> i64 {
        let body = match script {
            "deduct" => &self.scripts.deduct.body,
            "hold" => &self.scripts.hold.body,
            "confirm" => &self.scripts.confirm.body,
            "change_hold" => &self.scripts.change_hold.body,
            _ => &self.scripts.revert.body,
        };
        let mut cmd = redis::cmd("EVAL");
        let stock = stock_key(sku);
        // The calls that may meet a SKU kept by location (all but DEDUCT
        // and HOLD) declare its locations hash too.
        let located = !matches!(script, "deduct" | "hold");
        cmd.arg(body).arg(if located { 7 } else { 6 }).arg(&stock);
        cmd.arg(record_key(sku, &line_id(order)));
        for side in [&b":holds"[..], b":held", b":journal:on", b":journal"] {
            cmd.arg([stock.as_slice(), side].concat());
        }
        if located {
            cmd.arg([stock.as_slice(), b":loc"].concat());
        }
        for arg in args {
            cmd.arg(*arg);
        }
        cmd.arg(format!("{settings} 00")).arg("def456");
        let reply: Value = cmd.query(&mut self.conn).unwrap();
        match reply {
            Value::Array(items) => match items[0] {
                Value::Int(code) => code,
                _ => panic!("{items:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    fn hold(&mut self, sku: &str, order: &str, qty: &str, ttl: &str) -> i64 {
        let settings = format!("86400000 {WINDOW} 1000000 error");
        self.line("hold", sku, order, &[qty, "", ttl], &settings)
    }

    /// An ORDER.EXTEND's line call: the line holds at least `ttl` from now.
    fn extend(&mut self, sku: &str, order: &str, ttl: &str) -> i64 {
        let settings = format!("86400000 {WINDOW} 1000000 error");
        self.line("change_hold", sku, order, &["extend", ttl], &settings)
    }

    /// An ORDER's line (kind `T`): a DEDUCT of the line id.
    fn take(&mut self, sku: &str, order: &str, qty: &str) -> i64 {
        let settings = format!("{WINDOW} 1000000 error");
        self.line("deduct", sku, order, &[qty, ""], &settings)
    }

    fn confirm(&mut self, sku: &str, order: &str) -> i64 {
        self.line("confirm", sku, order, &[], &format!("{WINDOW} error"))
    }

    fn revert(&mut self, sku: &str, order: &str) -> i64 {
        self.line("revert", sku, order, &[], &format!("{WINDOW} error"))
    }

    /// Files `order` among the orders in flight, due now, and marks its
    /// shard active for the sweep leader: what a stockgate that died in
    /// the middle of the order's saga leaves behind
    /// (`src/stock/order/recovery.rs`).
    fn file_left_behind(&mut self, order: &str) {
        let layout = layout();
        let id = RequestId::parse(order.to_owned().into()).unwrap();
        let index = layout.order_shard_index(&id);
        let shard = &layout.sweep_shards()[index];
        redis::cmd("EVAL")
            .arg(&self.scripts.order_due.body)
            .arg(1)
            .arg(&shard.orders)
            .arg("mark")
            .arg(order)
            .arg(0)
            .query::<i64>(&mut self.conn)
            .unwrap();
        redis::cmd("EVAL")
            .arg(&self.scripts.sweep_active.body)
            .arg(1)
            .arg(layout.sweep_active())
            .arg(index)
            .arg(600_000)
            .query::<i64>(&mut self.conn)
            .unwrap();
    }

    fn advance(&mut self, order: &str, from: &str, to: &str, code: &str, short: &str) {
        let reply = self.intent(order, &["advance", from, to, code, short]);
        let Value::Array(items) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(
            items[0],
            Value::Int(1),
            "{order}: {from} -> {to}: {items:?}"
        );
    }
}

matrix! { #[tokio::test] async fn a_saga_cut_short_after_k_of_n_lines_is_finished_by_a_retry }
/// A saga cut short after k of n lines, in each phase, then retried
/// through a stockgate: the retry finishes (or undoes) the order whole.
async fn a_saga_cut_short_after_k_of_n_lines_is_finished_by_a_retry(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let skus = spread("cut");
    let lines = {
        let mut l: Vec<(String, &str)> = skus.iter().cloned().zip(["1", "2", "3"]).collect();
        l.sort();
        l
    };
    let canonical = lines
        .iter()
        .map(|(s, q)| format!("{s} {q}"))
        .collect::<Vec<_>>()
        .join(" ");
    let order_args = |id: &str| -> Vec<String> {
        let mut args = vec!["ORDER".to_string(), id.to_string()];
        for (sku, qty) in &lines {
            args.push(sku.clone());
            args.push(qty.to_string());
        }
        args
    };
    for sku in &skus {
        set_stock(&cluster, sku, 100);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let mut saga = Saga::new(&cluster);
    let mut deducted = [0i64; 3];

    // HOLDING, k of 3 lines held (k = 0..=3): the retry completes it.
    for k in 0..=3 {
        let id = format!("cut-holding-{k}");
        saga.intent(&id, &["begin", "D", &canonical, "0", "300000"]);
        for (sku, qty) in lines.iter().take(k) {
            assert_eq!(saga.hold(sku, &id, qty, "300000"), 0);
        }
        let args = order_args(&id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let retry = must(&mut conn, &args).await;
        assert_eq!(retry.code, 0, "{id}: {retry:?}");
        for (sku, _) in &lines {
            assert_eq!(line_state(&cluster, sku, &id), 'C', "{id} {sku}");
        }
        for (i, (_, qty)) in lines.iter().enumerate() {
            deducted[i] += qty.parse::<i64>().unwrap();
        }
        assert_eq!(must(&mut conn, &args).await.code, 1);
    }

    // The same for an ORDER begun by this stockgate (kind T), k of 3
    // lines taken: the retry takes the rest.
    for k in 0..=3 {
        let id = format!("cut-taking-{k}");
        saga.intent(&id, &["begin", "T", &canonical, "0", "8000"]);
        for (sku, qty) in lines.iter().take(k) {
            assert_eq!(saga.take(sku, &id, qty), 0);
        }
        let args = order_args(&id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let retry = must(&mut conn, &args).await;
        assert_eq!(retry.code, 0, "{id}: {retry:?}");
        for (sku, _) in &lines {
            assert_eq!(line_state(&cluster, sku, &id), 'D', "{id} {sku}");
        }
        for (i, (_, qty)) in lines.iter().enumerate() {
            deducted[i] += qty.parse::<i64>().unwrap();
        }
        assert_eq!(intent_phase(&cluster, &id).as_deref(), Some("DONE"));
        assert_eq!(must(&mut conn, &args).await.code, 1);
    }

    // CONFIRMING, k of 3 confirmed: the retry confirms the rest.
    for k in 0..=3 {
        let id = format!("cut-confirming-{k}");
        saga.intent(&id, &["begin", "D", &canonical, "0", "300000"]);
        for (sku, qty) in &lines {
            assert_eq!(saga.hold(sku, &id, qty, "300000"), 0);
        }
        saga.advance(&id, "HOLDING", "CONFIRMING", "", "");
        for (sku, _) in lines.iter().take(k) {
            assert_eq!(saga.confirm(sku, &id), 0);
        }
        let args = order_args(&id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let retry = must(&mut conn, &args).await;
        assert_eq!(retry.code, 0, "{id}: {retry:?}");
        for (sku, _) in &lines {
            assert_eq!(line_state(&cluster, sku, &id), 'C', "{id} {sku}");
        }
        for (i, (_, qty)) in lines.iter().enumerate() {
            deducted[i] += qty.parse::<i64>().unwrap();
        }
    }

    // ABORTING (the last line was short), 2 lines held: the retry gives
    // them back and answers 2, naming the short line.
    let id = "cut-aborting";
    let short_sku = lines[2].0.clone();
    saga.intent(id, &["begin", "D", &canonical, "0", "300000"]);
    for (sku, qty) in lines.iter().take(2) {
        assert_eq!(saga.hold(sku, id, qty, "300000"), 0);
    }
    saga.advance(id, "HOLDING", "ABORTING", "2", &short_sku);
    let args = order_args(id);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let retry = must(&mut conn, &args).await;
    assert_eq!((retry.code, retry.short.clone()), (2, vec![short_sku]));
    for (sku, _) in &lines {
        assert!(matches!(line_state(&cluster, sku, id), 'R' | 'V'), "{sku}");
    }

    // An ORDER.HOLD cut short in CONFIRMING after 1 of 3: ORDER.CONFIRM
    // (through the stockgate) confirms the rest.
    let id = "cut-hold";
    saga.intent(id, &["begin", "H", &canonical, "600000", "602000"]);
    for (sku, qty) in &lines {
        assert_eq!(saga.hold(sku, id, qty, "602000"), 0);
    }
    saga.advance(id, "HOLDING", "HELD", "", "");
    let confirm_first = saga.intent(id, &["confirm"]);
    assert!(matches!(&confirm_first, Value::Array(items) if items[0] == Value::Int(1)));
    assert_eq!(saga.confirm(&lines[0].0, id), 0);
    let retry = must(&mut conn, &["ORDER.CONFIRM", id]).await;
    assert_eq!(retry.code, 0, "{retry:?}");
    for (i, (sku, qty)) in lines.iter().enumerate() {
        assert_eq!(line_state(&cluster, sku, id), 'C', "{sku}");
        deducted[i] += qty.parse::<i64>().unwrap();
    }

    // The books: what was deducted, nothing held.
    for (i, (sku, _)) in lines.iter().enumerate() {
        assert_eq!(get_stock(&cluster, sku), Some(100 - deducted[i]), "{sku}");
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn orders_of_a_killed_stockgate_are_whole_or_nothing_after_their_retries }
/// A stockgate SIGKILLed under a load of orders: with nobody retrying,
/// every order it left in flight comes to rest by itself (the survivor's
/// recovery); then every order is retried through the survivor, and each
/// is applied whole, once, or not at all, and the books add up.
async fn orders_of_a_killed_stockgate_are_whole_or_nothing_after_their_retries(kind: ServerKind) {
    const ORDERS: usize = 60;
    let cluster = cluster_of(kind);
    let skus = spread("killed");
    for sku in &skus {
        set_stock(&cluster, sku, 10_000);
    }
    let doomed = Launch::serve(&cluster.seeds()).start();
    let survivor = proxy(cluster.seeds(), |_| {}).await;
    let addr = doomed.addr;
    let qty = |i: usize, line: usize| (1 + (i + line) % 3).to_string();
    let args_of = |i: usize| -> Vec<String> {
        let mut args = vec!["ORDER".to_string(), format!("killed-{i}")];
        for (line, sku) in skus.iter().enumerate() {
            args.push(sku.clone());
            args.push(qty(i, line));
        }
        args
    };
    let answered = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
    let tasks: Vec<_> = (0..ORDERS)
        .map(|i| {
            let args = args_of(i);
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut conn = client_at(addr, false).await;
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                if let Ok(reply) = send(&mut conn, &args).await {
                    answered.lock().unwrap().insert(i, reply.code);
                }
            })
        })
        .collect();
    // Kill it once some orders are done and others in flight.
    loop_until_async(Duration::from_secs(30), || {
        let n = answered.lock().unwrap().len();
        async move { (n >= ORDERS / 4).then_some(()) }
    })
    .await;
    doomed.kill();
    for task in tasks {
        let _ = task.await;
    }
    let first: HashMap<usize, i64> = answered.lock().unwrap().clone();
    assert!(first.values().all(|code| *code == 0), "{first:?}");

    // Nobody retries yet: every order comes to rest by itself, DONE or
    // ABORTED (or never begun), and what the DONE ones took is all that
    // is gone.
    let mut done = [0i64; 3];
    for i in 0..ORDERS {
        let id = format!("killed-{i}");
        let cluster = &cluster;
        let phase = loop_until_async(Duration::from_secs(90), || {
            let id = id.clone();
            async move {
                let phase = intent_phase(cluster, &id);
                matches!(phase.as_deref(), None | Some("DONE" | "ABORTED")).then_some(phase)
            }
        })
        .await;
        if phase.as_deref() == Some("DONE") {
            for (line, total) in done.iter_mut().enumerate() {
                *total += qty(i, line).parse::<i64>().unwrap();
            }
        }
    }
    for (line, sku) in skus.iter().enumerate() {
        assert_eq!(get_stock(&cluster, sku), Some(10_000 - done[line]), "{sku}");
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }

    // Every order retried through the survivor.
    let mut conn = client(&survivor, false).await;
    let mut taken = [0i64; 3];
    for i in 0..ORDERS {
        let args = args_of(i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let retry = must(&mut conn, &args).await;
        let id = format!("killed-{i}");
        if first.contains_key(&i) {
            assert_eq!(retry.code, 1, "{id} answered 0 before the kill");
        }
        // 0: it had not begun; 1: it was done; 5: the recovery of the
        // orders left behind gave its lines back.
        assert!(matches!(retry.code, 0 | 1 | 5), "{id}: {retry:?}");
        for (line, sku) in skus.iter().enumerate() {
            let state = line_state(&cluster, sku, &id);
            if retry.code == 5 {
                assert_ne!(state, 'D', "{id} {sku}");
            } else {
                assert_eq!(state, 'D', "{id} {sku}");
                taken[line] += qty(i, line).parse::<i64>().unwrap();
            }
        }
        // A second retry agrees.
        let again = must(&mut conn, &args).await;
        assert_eq!(again.code, if retry.code == 5 { 5 } else { 1 }, "{id}");
    }
    for (line, sku) in skus.iter().enumerate() {
        assert_eq!(
            get_stock(&cluster, sku),
            Some(10_000 - taken[line]),
            "{sku}"
        );
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }
}

/// Orders whose lines include SKUs kept by location
/// (`<sku>{<POLICY>:<location>,...}`, docs/locations.md), cut short by a
/// SIGKILL of their stockgate mid-order, their callers never retrying.
/// The primary of one located SKU is stalled (SIGSTOP) while ORDERs,
/// ORDER.HOLDs and ORDER.CONFIRMs of held orders run through the doomed
/// stockgate, so that every one of them is in flight when it dies: begun,
/// its lines on the other primaries placed (or confirmed), its line on
/// the stalled primary sent and unanswered. Then the primary goes on,
/// running those lines with nobody left to answer, and another
/// stockgate's recovery ends each order by itself, the way its phase
/// points: the ORDERs and ORDER.HOLDs back (ABORTED, every line given
/// back or revoked), the ORDER.CONFIRMs forward (DONE, every line
/// confirmed). Each location's units are exact, the
/// SKU's held units its locations', and each line's journal entries are
/// there exactly once, at the locations its record names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn located_orders_of_a_killed_stockgate_end_whole_without_a_retry() {
    use stockgate::record::State;
    const EACH: usize = 4;
    // A long node timeout: the stalled primary is never failed over.
    let options = stockgate::dev::RedisOptions {
        node_timeout_ms: 30_000,
        ..stockgate::dev::RedisOptions::of(ServerKind::Redis7)
    };
    let cluster = stockgate::dev::LocalCluster::start(3, 0, &options).expect("a test cluster");
    let [a, b, c] = spread("lost");
    let port_of = |key: &[u8]| {
        cluster
            .primary_for_slot(stockgate::keys::slot(key))
            .expect("a primary serves the slot")
            .port
    };
    let stalled_port = port_of(&stock_key(&a));
    // Every order's intent, and its filing among the orders in flight, on
    // the other primaries: only the located line on `a` waits.
    let layout = layout();
    let off_stalled = |id: &String| {
        let rid = RequestId::parse(id.clone().into()).unwrap();
        let filing = &layout.sweep_shards()[layout.order_shard_index(&rid)].orders;
        port_of(&layout.order_key(&rid)) != stalled_port && port_of(filing) != stalled_port
    };
    let ids = |kind: &str| -> Vec<String> {
        (0..)
            .map(|n| format!("lost-{kind}-{n}"))
            .filter(|id| off_stalled(id))
            .take(EACH)
            .collect()
    };
    let (taken, held_ids, confirmed) = (ids("t"), ids("h"), ids("c"));

    // (sku, location, units): `a` splits over w1 (few) and w2, `b` holds
    // the first of w2 (few) and w1 that can give a line whole, `c` keeps
    // one number (its location '').
    let places: Vec<(String, &str, i64)> = vec![
        (a.clone(), "w1", 5),
        (a.clone(), "w2", 100),
        (b.clone(), "w1", 100),
        (b.clone(), "w2", 3),
        (c.clone(), "", 100),
    ];
    let survivor = proxy(cluster.seeds(), |config| {
        config.journal = true;
        config.admin_commands = true;
    })
    .await;
    let mut conn = client(&survivor, false).await;
    for (n, (sku, location, units)) in places.iter().enumerate() {
        let mut set = redis::cmd("STOCK.SET");
        set.arg(sku).arg(units).arg(format!("lost-set-{n}"));
        if !location.is_empty() {
            set.arg("AT").arg(*location);
        }
        let reply = parse(set.query_async(&mut conn).await.unwrap());
        assert_eq!(reply.code, 0, "{sku} {location}: {reply:?}");
    }
    let lines = |i: usize| -> Vec<String> {
        let qty = |line: usize| (1 + (i + line) % 3).to_string();
        vec![
            format!("{a}{{SPLIT:w1,w2}}"),
            qty(0),
            format!("{b}{{WHOLE:w2,w1}}"),
            qty(1),
            c.clone(),
            qty(2),
        ]
    };
    // The orders to confirm are held first, through the survivor.
    for (i, id) in confirmed.iter().enumerate() {
        let mut args = vec!["ORDER.HOLD".to_owned(), id.clone(), "600000".to_owned()];
        args.extend(lines(i));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(must(&mut conn, &args).await.code, 0, "{id}");
    }

    // A timeout of 2 s: long enough that the doomed stockgate is killed
    // before it gives up on the stalled line (its recovery is due 4 x 2 s
    // + 5 s after each filing).
    let doomed = Launch::serve(&cluster.seeds())
        .args(["--journal", "true", "--timeout", "2s"])
        .start();
    // Watched through connections made before the stall: a new one could
    // ask the stalled node for the slots, and wait.
    let mut watch = cluster.cluster_connection().unwrap();
    let stalled = cluster
        .nodes
        .iter()
        .find(|node| node.port == stalled_port)
        .unwrap();
    stalled.pause();
    let mut orders: Vec<Vec<String>> = Vec::new();
    for (i, id) in taken.iter().enumerate() {
        let mut args = vec!["ORDER".to_owned(), id.clone()];
        args.extend(lines(i));
        orders.push(args);
    }
    for (i, id) in held_ids.iter().enumerate() {
        let mut args = vec!["ORDER.HOLD".to_owned(), id.clone(), "600000".to_owned()];
        args.extend(lines(i));
        orders.push(args);
    }
    for id in &confirmed {
        orders.push(vec!["ORDER.CONFIRM".to_owned(), id.clone()]);
    }
    let addr = doomed.addr;
    let callers: Vec<_> = orders
        .into_iter()
        .map(|args| {
            tokio::spawn(async move {
                let mut conn = client_at(addr, false).await;
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                send(&mut conn, &args).await
            })
        })
        .collect();
    // Every order mid-way: begun, its lines on `b` and `c` placed (or
    // confirmed), its line on `a` sent to the stalled node.
    let mut mid_way = |id: &String, phase: &str, state: char| {
        let key = layout.order_key(&RequestId::parse(id.clone().into()).unwrap());
        let begun: Option<String> = redis::cmd("HGET")
            .arg(key)
            .arg("p")
            .query(&mut watch)
            .unwrap();
        begun.as_deref() == Some(phase)
            && [&b, &c]
                .iter()
                .all(|sku| record_state(&mut watch, sku, &line_id(id)) == state)
    };
    loop_until_async(Duration::from_secs(30), || {
        let all = taken.iter().all(|id| mid_way(id, "HOLDING", 'D'))
            && held_ids.iter().all(|id| mid_way(id, "HOLDING", 'H'))
            && confirmed.iter().all(|id| mid_way(id, "CONFIRMING", 'C'));
        async move { all.then_some(()) }
    })
    .await;
    doomed.kill();
    // The lines it sent to the stalled node land now, its caller gone.
    stalled.resume();
    for caller in callers {
        let answer = caller.await.unwrap();
        assert!(answer.is_err(), "no order could answer: {answer:?}");
    }

    // Nobody retries: the survivor's recovery ends each order.
    let rest: Vec<(&String, &str)> = taken
        .iter()
        .chain(&held_ids)
        .map(|id| (id, "ABORTED"))
        .chain(confirmed.iter().map(|id| (id, "DONE")))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let phases: Vec<(&String, Option<String>)> = rest
            .iter()
            .map(|(id, _)| (*id, intent_phase(&cluster, id)))
            .collect();
        if rest
            .iter()
            .zip(&phases)
            .all(|((_, want), (_, phase))| phase.as_deref() == Some(*want))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every order came to rest as its phase points: {phases:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The survivor's recovery ended them (its count follows the step
    // that ended each, a moment later).
    loop_until_async(Duration::from_secs(10), || async {
        (metric(
            &survivor,
            "stockgate_order_recoveries_total{result=\"ended\"}",
        ) >= (3 * EACH) as u64)
            .then_some(())
    })
    .await;
    let on_a: String = taken
        .iter()
        .chain(&held_ids)
        .chain(&confirmed)
        .map(|id| line_state(&cluster, &a, id))
        .collect();
    eprintln!(
        "[located-kill] killed mid-order: {EACH} ORDERs, {EACH} ORDER.HOLDs, {EACH} ORDER.CONFIRMs; their lines on the stalled sku ended {on_a}"
    );
    // (A line that landed after the kill is given back as R; one that
    // never ran, revoked as V. The stalled node runs what its socket
    // holds when it goes on.)
    assert!(
        on_a[..2 * EACH].contains('R'),
        "no line landed after the kill: {on_a}"
    );

    // Every line whole with its order: given back or revoked, or
    // confirmed; the lines on `b` and `c`, placed before the kill, given
    // back.
    let mut direct = cluster.cluster_connection().unwrap();
    for id in taken.iter().chain(&held_ids) {
        for sku in [&a, &b, &c] {
            let state = line_state(&cluster, sku, id);
            let placed = sku != &a;
            assert!(
                state == 'R' || (!placed && state == 'V'),
                "{id} {sku}: {state}"
            );
        }
    }
    for id in &confirmed {
        for sku in [&a, &b, &c] {
            assert_eq!(line_state(&cluster, sku, id), 'C', "{id} {sku}");
        }
    }
    for id in rest.iter().map(|(id, _)| id) {
        let rid = RequestId::parse((*id).clone().into()).unwrap();
        let filing = &layout.sweep_shards()[layout.order_shard_index(&rid)].orders;
        let filed: Option<f64> = redis::cmd("ZSCORE")
            .arg(filing)
            .arg(*id)
            .query(&mut direct)
            .unwrap();
        assert_eq!(filed, None, "{id} is out of the orders in flight");
    }

    // The books of every location, from the records, and the journal.
    let lines_of = |sku: &String| -> Vec<(String, stockgate::record::Record, bool)> {
        let mut found = Vec::new();
        for (id, held) in taken
            .iter()
            .map(|id| (id, false))
            .chain(held_ids.iter().chain(&confirmed).map(|id| (id, true)))
        {
            let raw: Option<String> = redis::cmd("GET")
                .arg(record_key(sku, &line_id(id)))
                .query(&mut cluster.cluster_connection().unwrap())
                .unwrap();
            let raw = raw.unwrap_or_else(|| panic!("{id} {sku}: no record"));
            let record = stockgate::record::Record::parse(&raw)
                .unwrap_or_else(|| panic!("{id} {sku}: {raw}"));
            found.push((line_id(id), record, held));
        }
        found
    };
    for sku in [&a, &b, &c] {
        let records = lines_of(sku);
        let journal: Vec<stockgate::journal::Entry> = stockgate::journal::stream::entries(
            redis::cmd("XRANGE")
                .arg([stock_key(sku), b":journal".to_vec()].concat())
                .arg("-")
                .arg("+")
                .query(&mut direct)
                .unwrap(),
        )
        .unwrap();
        let units = located_units(&mut direct, sku);
        // location -> units the confirmed lines took from it for good
        let mut sold: HashMap<String, i64> = HashMap::new();
        for (id, record, held) in &records {
            let mut expected = Vec::new();
            for (location, n) in allocation_of(record) {
                let events: &[(&str, i64, i64)] = match (record.state, held) {
                    (State::Reverted, false) => &[("deduct", -n, 0), ("revert", n, 0)],
                    (State::Reverted, true) => &[("hold", -n, n), ("cancel", n, -n)],
                    (State::Confirmed, _) => {
                        *sold.entry(location.clone()).or_default() += n;
                        &[("hold", -n, n), ("confirm", 0, -n)]
                    }
                    (state, _) => panic!("{sku} {id}: a line left {state:?}"),
                };
                for (event, ds, dh) in events {
                    expected.push((event.to_string(), location.clone(), *ds, *dh));
                }
            }
            let mut entries: Vec<(String, String, i64, i64)> = journal
                .iter()
                .filter(|entry| &entry.id == id)
                .map(|entry| {
                    (
                        entry.event.name().to_owned(),
                        entry.location.clone(),
                        entry.stock_change,
                        entry.held_change,
                    )
                })
                .collect();
            entries.sort();
            expected.sort();
            assert_eq!(
                entries, expected,
                "{sku} {id}: its journal entries, once each"
            );
        }
        // Each location: what it started with is what it has, holds, and
        // what the confirmed lines took from it; its journal runs from
        // its set to exactly that.
        for (_, location, initial) in places.iter().filter(|(s, ..)| s == sku) {
            let (available, on_hold) = units[*location];
            let out = sold.get(*location).copied().unwrap_or_default();
            assert_eq!(
                (available + on_hold + out, on_hold),
                (*initial, 0),
                "{sku} {location}: available {available}, held {on_hold}, confirmed {out}"
            );
            let mut account = (0, 0);
            for entry in journal.iter().filter(|e| e.location == *location) {
                if entry.event == stockgate::journal::Event::Set {
                    account = (entry.stock, entry.held);
                } else {
                    account.0 += entry.stock_change;
                    account.1 += entry.held_change;
                }
                assert_eq!(account, (entry.stock, entry.held), "{sku} {entry:?}");
            }
            assert_eq!(
                account,
                (available, on_hold),
                "{sku} {location}: its journal"
            );
        }
        assert_eq!(held(&cluster, sku), 0, "{sku}: nothing held");
    }
}

/// What each location of `sku` has now, (available, held), by name; a
/// SKU that keeps one number has the one location ''.
fn located_units(
    conn: &mut redis::cluster::ClusterConnection,
    sku: &str,
) -> HashMap<String, (i64, i64)> {
    let stock: String = redis::cmd("GET").arg(stock_key(sku)).query(conn).unwrap();
    let held: Option<i64> = redis::cmd("GET")
        .arg([stock_key(sku), b":held".to_vec()].concat())
        .query(conn)
        .unwrap();
    if stock != "loc" {
        return [(String::new(), (stock.parse().unwrap(), held.unwrap_or(0)))].into();
    }
    let hash: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg([stock_key(sku), b":loc".to_vec()].concat())
        .query(conn)
        .unwrap();
    let mut units: HashMap<String, (i64, i64)> = HashMap::new();
    for (field, n) in hash {
        match field.strip_suffix(":held") {
            Some(location) => units.entry(location.to_owned()).or_default().1 = n,
            None if !field.ends_with(":floor") => units.entry(field).or_default().0 = n,
            None => {}
        }
    }
    let at_locations: i64 = units.values().map(|(_, held)| held).sum();
    assert_eq!(
        held.unwrap_or(0),
        at_locations,
        "{sku}: held is its locations'"
    );
    units
}

/// The units a line's record keeps at each location: its allocation, or
/// for a SKU that keeps one number its qty at ''.
/// (A revoked line keeps nothing.)
fn allocation_of(record: &stockgate::record::Record) -> Vec<(String, i64)> {
    match &record.allocation {
        None if record.state == stockgate::record::State::Revoked => Vec::new(),
        None => vec![(String::new(), record.qty as i64)],
        Some(allocation) => allocation
            .split(',')
            .filter(|part| !part.is_empty())
            .map(|part| {
                let (location, units) = part.split_once('=').expect("location=units");
                (location.to_owned(), units.parse().expect("units"))
            })
            .collect(),
    }
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn orders_left_behind_in_every_phase_end_without_a_retry }
/// Orders left behind in every phase, with nobody to retry them (issue
/// 22, 2): as a stockgate that died mid-saga leaves them, filed among the
/// orders in flight. A stockgate's recovery ends each one, the way its
/// phase points: HOLDING back (ABORTED, 5), CONFIRMING forward (DONE),
/// ABORTING and REVERTING on; a HELD order hold waits for its confirm.
async fn orders_left_behind_in_every_phase_end_without_a_retry(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let skus = spread("behind");
    for sku in &skus {
        set_stock(&cluster, sku, 100);
    }
    let lines: Vec<(String, &str)> = {
        let mut l: Vec<(String, &str)> = skus.iter().cloned().zip(["1", "2", "3"]).collect();
        l.sort();
        l
    };
    let canonical = lines
        .iter()
        .map(|(s, q)| format!("{s} {q}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut saga = Saga::new(&cluster);
    // (order, the phase it ends in, each line's record then)
    let mut expected: Vec<(String, &str, [char; 3])> = Vec::new();
    for k in 0..=3 {
        let id = format!("behind-holding-{k}");
        saga.intent(&id, &["begin", "D", &canonical, "0", "300000"]);
        for (sku, qty) in lines.iter().take(k) {
            assert_eq!(saga.hold(sku, &id, qty, "300000"), 0);
        }
        // Held lines are given back (R); the others are revoked (V), so a
        // HOLD of theirs still on its way is refused.
        let mut states = ['V'; 3];
        states[..k].fill('R');
        expected.push((id, "ABORTED", states));
    }
    // An ORDER of kind T, k of 3 lines taken: back the same way.
    for k in 0..=3 {
        let id = format!("behind-taking-{k}");
        saga.intent(&id, &["begin", "T", &canonical, "0", "8000"]);
        for (sku, qty) in lines.iter().take(k) {
            assert_eq!(saga.take(sku, &id, qty), 0);
        }
        let mut states = ['V'; 3];
        states[..k].fill('R');
        expected.push((id, "ABORTED", states));
    }
    for k in 0..=3 {
        let id = format!("behind-confirming-{k}");
        saga.intent(&id, &["begin", "D", &canonical, "0", "300000"]);
        for (sku, qty) in &lines {
            assert_eq!(saga.hold(sku, &id, qty, "300000"), 0);
        }
        saga.advance(&id, "HOLDING", "CONFIRMING", "", "");
        for (sku, _) in lines.iter().take(k) {
            assert_eq!(saga.confirm(sku, &id), 0);
        }
        expected.push((id, "DONE", ['C'; 3]));
    }
    let id = "behind-aborting".to_owned();
    saga.intent(&id, &["begin", "D", &canonical, "0", "300000"]);
    for (sku, qty) in lines.iter().take(2) {
        assert_eq!(saga.hold(sku, &id, qty, "300000"), 0);
    }
    saga.advance(&id, "HOLDING", "ABORTING", "2", &lines[2].0);
    expected.push((id, "ABORTED", ['R', 'R', 'V']));
    let id = "behind-reverting".to_owned();
    saga.intent(&id, &["begin", "H", &canonical, "600000", "602000"]);
    for (sku, qty) in &lines {
        assert_eq!(saga.hold(sku, &id, qty, "602000"), 0);
    }
    saga.advance(&id, "HOLDING", "HELD", "", "");
    saga.intent(&id, &["revert"]);
    saga.revert(&lines[0].0, &id);
    expected.push((id, "REVERTED", ['R'; 3]));
    let id = "behind-held".to_owned();
    saga.intent(&id, &["begin", "H", &canonical, "600000", "602000"]);
    for (sku, qty) in &lines {
        assert_eq!(saga.hold(sku, &id, qty, "602000"), 0);
    }
    saga.advance(&id, "HOLDING", "HELD", "", "");
    expected.push((id, "HELD", ['H'; 3]));
    for (id, _, _) in &expected {
        saga.file_left_behind(id);
    }

    // No command of these orders is sent: the stockgate's sweep passes
    // find them.
    let server = proxy(cluster.seeds(), |_| {}).await;
    for (id, phase, states) in &expected {
        loop_until_async(Duration::from_secs(30), || async {
            (intent_phase(&cluster, id).as_deref() == Some(*phase)).then_some(())
        })
        .await;
        for ((sku, _), state) in lines.iter().zip(states) {
            assert_eq!(line_state(&cluster, sku, id), *state, "{id} {sku}");
        }
    }
    // The books: 4 DONE orders, 1 HELD, nothing else taken.
    for (i, (sku, qty)) in lines.iter().enumerate() {
        let qty: i64 = qty.parse().unwrap();
        assert_eq!(get_stock(&cluster, sku), Some(100 - 5 * qty), "{sku}");
        assert_eq!(
            held(&cluster, sku),
            qty,
            "{sku}: the HELD order's line, {i}"
        );
    }
    let filed = expected.len() as u64;
    loop_until_async(Duration::from_secs(10), || async {
        (metric(
            &server,
            "stockgate_order_recoveries_total{result=\"ended\"}",
        ) >= filed)
            .then_some(())
    })
    .await;
    // A retry of an order recovery took back answers what happened: 5.
    let mut conn = client(&server, false).await;
    let mut args = vec!["ORDER".to_owned(), "behind-holding-2".to_owned()];
    for (sku, qty) in &lines {
        args.extend([sku.clone(), qty.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(must(&mut conn, &args).await.code, 5);
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn an_order_confirm_cut_by_a_stalled_primary_ends_whole_without_a_retry }
/// The reproduced strand (issue 22, 2): an ORDER.CONFIRM whose line meets
/// a primary that stops (SIGSTOP) gets an error, and its caller never
/// retries. Once the primary goes on, stockgate ends the order by itself:
/// forward (DONE) while its lines still hold, back (ABORTED, 5, the line
/// confirmed before the stall given back) when they ran out meanwhile.
async fn an_order_confirm_cut_by_a_stalled_primary_ends_whole_without_a_retry(kind: ServerKind) {
    use stockgate::dev::{LocalCluster, RedisOptions};
    // A long node timeout: the stalled primary is never failed over.
    let options = RedisOptions {
        node_timeout_ms: 30_000,
        ..RedisOptions::of(kind)
    };
    let cluster = LocalCluster::start(3, 0, &options).expect("a test cluster");
    let [pa, pd, _] = spread("stall");
    for sku in [&pa, &pd] {
        set_stock(&cluster, sku, 100);
    }
    let server = proxy(cluster.seeds(), |c| {
        c.upstream.timeout = Duration::from_millis(500);
    })
    .await;
    let mut conn = client(&server, false).await;
    let forward = must(
        &mut conn,
        &["ORDER.HOLD", "stall-fwd", "60000", &pa, "1", &pd, "1"],
    )
    .await;
    let back = must(
        &mut conn,
        &["ORDER.HOLD", "stall-back", "2000", &pa, "1", &pd, "1"],
    )
    .await;
    assert_eq!((forward.code, back.code), (0, 0));

    let stalled = cluster
        .primary_for_slot(sku_slot(&Sku::parse(pd.clone().into()).unwrap()))
        .expect("pd has a primary");
    stalled.pause();
    let stopped_at = Instant::now();
    for id in ["stall-fwd", "stall-back"] {
        let cut = send(&mut conn, &["ORDER.CONFIRM", id]).await;
        let err = cut.expect_err("the stalled line's confirm gets no answer");
        assert!(err.to_string().contains("UPSTREAM"), "{id}: {err}");
    }
    // Past the short order's lines (2 s and the 2 s margin).
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(stopped_at.elapsed())).await;
    stalled.resume();

    for (id, phase) in [("stall-fwd", "DONE"), ("stall-back", "ABORTED")] {
        loop_until_async(Duration::from_secs(60), || async {
            (intent_phase(&cluster, id).as_deref() == Some(phase)).then_some(())
        })
        .await;
    }
    assert_eq!(line_state(&cluster, &pa, "stall-fwd"), 'C');
    assert_eq!(line_state(&cluster, &pd, "stall-fwd"), 'C');
    assert_eq!(line_state(&cluster, &pa, "stall-back"), 'R', "given back");
    assert_eq!(line_state(&cluster, &pd, "stall-back"), 'X', "ran out");
    for sku in [&pa, &pd] {
        assert_eq!(
            get_stock(&cluster, sku),
            Some(99),
            "{sku}: the forward order's unit"
        );
        assert_eq!(held(&cluster, sku), 0, "{sku}");
    }
    let status: Value = redis::cmd("ORDER.STATUS")
        .arg("stall-back")
        .query_async(&mut conn)
        .await
        .unwrap();
    let shown = format!("{status:?}");
    assert!(
        shown.contains("ABORTED") && shown.contains("int(5)"),
        "{shown}"
    );
}

matrix! { #[tokio::test] async fn an_order_naming_a_sku_without_stock_ends_at_once_with_every_line_back }
/// An order naming a SKU with no stock key (issue 22, 5): with the
/// default `--missing-stock error` it ends in the same request, every line
/// given back, and answers 3 naming the SKU; its retries and its
/// ORDER.REVERT are answered, never UNKNOWNSKU. An order whose SKU loses
/// its stock key while held is given back (the key made again) by
/// ORDER.REVERT, in the same request.
async fn an_order_naming_a_sku_without_stock_ends_at_once_with_every_line_back(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, missing] = spread("nostock");
    for sku in [&a, &b] {
        set_stock(&cluster, sku, 100);
    }
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let args = ["ORDER", "no-stock-1", &a, "1", &b, "1", &missing, "1"];
    let reply = must(&mut conn, &args).await;
    assert_eq!(
        (reply.code, reply.short.clone()),
        (3, vec![missing.clone()])
    );
    let reason = reply.reason.clone().expect("a reason for 3");
    assert!(reason.contains(&missing), "{reason}");
    assert_eq!(
        intent_phase(&cluster, "no-stock-1").as_deref(),
        Some("ABORTED")
    );
    for sku in [&a, &b] {
        assert_eq!(
            get_stock(&cluster, sku),
            Some(100),
            "{sku}: given back at once"
        );
        assert_eq!(held(&cluster, sku), 0, "{sku}");
        assert_eq!(line_state(&cluster, sku, "no-stock-1"), 'R', "{sku}");
    }
    assert_eq!(get_stock(&cluster, &missing), None, "nothing made up");
    assert_eq!(
        must(&mut conn, &args).await.code,
        3,
        "a retry answers the same"
    );
    assert_eq!(
        must(&mut conn, &["ORDER.REVERT", "no-stock-1"]).await.code,
        1
    );

    let held_order = must(
        &mut conn,
        &["ORDER.HOLD", "no-stock-2", "600000", &a, "2", &b, "2"],
    )
    .await;
    assert_eq!(held_order.code, 0);
    let mut direct = cluster.cluster_connection().unwrap();
    redis::cmd("DEL")
        .arg(stock_key(&b))
        .query::<()>(&mut direct)
        .unwrap();
    let reverted = must(&mut conn, &["ORDER.REVERT", "no-stock-2"]).await;
    assert_eq!(reverted.code, 0);
    assert_eq!(
        intent_phase(&cluster, "no-stock-2").as_deref(),
        Some("REVERTED")
    );
    assert_eq!(get_stock(&cluster, &a), Some(100));
    assert_eq!(
        get_stock(&cluster, &b),
        Some(2),
        "the held units go back to a stock key made again"
    );
    assert_eq!(held(&cluster, &a), 0);
}

matrix! { #[tokio::test] async fn an_orders_filing_rides_along_or_falls_back_to_a_call_of_its_own }
/// An order's filing among the orders in flight rides along with its
/// intent calls when the shard's orders key is on the intent's node, and
/// is a call of its own when it is not (`lua/order.lua` is refused with
/// "non local key" before it writes anything): either way the order is
/// done, and out of the orders in flight once it rests. On Redis and
/// Valkey, whose refusals must read alike.
async fn an_orders_filing_rides_along_or_falls_back_to_a_call_of_its_own(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("filing");
    for sku in [&a, &b, &c] {
        set_stock(&cluster, sku, 10);
    }
    let layout = layout();
    let node_of = |slot: u16| cluster.primary_for_slot(slot).unwrap().port;
    let apart = |id: &str| {
        let id = RequestId::parse(id.to_owned().into()).unwrap();
        let intent = stockgate::keys::slot(&layout.order_key(&id));
        let orders = &layout.sweep_shards()[layout.order_shard_index(&id)].orders;
        node_of(intent) != node_of(stockgate::keys::slot(orders))
    };
    let pick = |want_apart: bool| {
        (0..)
            .map(|n| format!("filing-{want_apart}-{n}"))
            .find(|id| apart(id) == want_apart)
            .unwrap()
    };
    let (together, apart_id) = (pick(false), pick(true));
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    for id in [&together, &apart_id] {
        let ok = must(&mut conn, &["ORDER", id, &a, "1", &b, "1", &c, "1"]).await;
        assert_eq!(ok.code, 0, "{id}: {ok:?}");
        assert_eq!(intent_phase(&cluster, id).as_deref(), Some("DONE"), "{id}");
        let held = must(
            &mut conn,
            &["ORDER.HOLD", &format!("{id}-h"), "60000", &a, "1"],
        )
        .await;
        assert_eq!(held.code, 0, "{id}: {held:?}");
    }
    // Every one of them out of the orders in flight (a fallback's taking
    // out is not awaited by its command).
    let mut direct = cluster.cluster_connection().unwrap();
    for id in [
        together.clone(),
        apart_id.clone(),
        format!("{together}-h"),
        format!("{apart_id}-h"),
    ] {
        let rid = RequestId::parse(id.clone().into()).unwrap();
        let orders = layout.sweep_shards()[layout.order_shard_index(&rid)]
            .orders
            .clone();
        loop_until_async(Duration::from_secs(10), || {
            let filed: Option<f64> = redis::cmd("ZSCORE")
                .arg(&orders)
                .arg(&id)
                .query(&mut direct)
                .unwrap();
            async move { filed.is_none().then_some(()) }
        })
        .await;
    }
    for (sku, stock) in [(&a, 6), (&b, 8), (&c, 8)] {
        assert_eq!(get_stock(&cluster, sku), Some(stock), "{sku}");
    }
}

/// Redis's clock, in milliseconds (every node of a test cluster runs on
/// this machine's): what an order's expiry is measured by.
fn redis_now_ms(cluster: &stockgate::dev::LocalCluster) -> i64 {
    let mut conn = cluster.nodes[0].connection().unwrap();
    let time: Vec<String> = redis::cmd("TIME").query(&mut conn).unwrap();
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// Waits until Redis's clock has passed `at_ms`.
fn wait_redis_past(cluster: &stockgate::dev::LocalCluster, at_ms: i64) {
    loop {
        let now = redis_now_ms(cluster);
        if now > at_ms {
            return;
        }
        std::thread::sleep(Duration::from_millis((at_ms - now + 1).min(200) as u64));
    }
}

/// The expiry the intent of `order` records.
fn intent_expiry(cluster: &stockgate::dev::LocalCluster, order: &str) -> i64 {
    let mut conn = cluster.cluster_connection().unwrap();
    let key = layout().order_key(&RequestId::parse(order.to_owned().into()).unwrap());
    redis::cmd("HGET")
        .arg(key)
        .arg("e")
        .query(&mut conn)
        .unwrap()
}

/// An order's line hold: its expiry and its score in the SKU's holds set.
fn line_hold(cluster: &stockgate::dev::LocalCluster, sku: &str, order: &str) -> (u64, u64) {
    let mut conn = cluster.cluster_connection().unwrap();
    let raw: String = redis::cmd("GET")
        .arg(record_key(sku, &line_id(order)))
        .query(&mut conn)
        .unwrap();
    let (expires, _) = stockgate::record::Record::parse(&raw)
        .unwrap()
        .hold
        .unwrap();
    let score: u64 = redis::cmd("ZSCORE")
        .arg([stock_key(sku), b":holds".to_vec()].concat())
        .arg(line_id(order))
        .query(&mut conn)
        .unwrap();
    (expires, score)
}

matrix! { #[tokio::test] async fn an_order_extension_moves_the_order_and_its_lines_once_per_change_id }
/// ORDER.EXTEND in every state of the order: a held order and each of its
/// lines last longer (the lines the margin past the order, in their holds
/// sets too), an exact retry answers the same, the bound and the "later"
/// rule hold, ORDER.CONFIRM past the old expiry takes every line, the
/// order runs out at its new expiry by Redis time, and a confirmed,
/// revoked, expired or unknown order, an ORDER and an intent without a
/// start time change nothing. No sweeper: expiries are met by calls.
async fn an_order_extension_moves_the_order_and_its_lines_once_per_change_id(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let [a, b, c] = spread("ext");
    for sku in [&a, &b, &c] {
        set_stock(&cluster, sku, 10);
    }
    let server = proxy(cluster.seeds(), |config| {
        config.sweeper = false;
        config.max_hold = Duration::from_secs(60);
    })
    .await;
    let mut conn = client(&server, false).await;
    let hold = &["ORDER.HOLD", "x-1", "1000", &a, "1", &b, "2", &c, "3"];
    let first = must(&mut conn, hold).await;
    assert_eq!(first.code, 0, "{first:?}");

    // Extended: a new expiry by Redis time, every line the margin past it.
    let before = redis_now_ms(&cluster);
    let longer = must(&mut conn, &["ORDER.EXTEND", "x-1", "e-1", "30000"]).await;
    let after = redis_now_ms(&cluster);
    assert_eq!(longer.code, 0, "{longer:?}");
    assert!(
        (before + 30_000..=after + 30_000).contains(&longer.expires_at),
        "Redis time plus ttl_ms: {longer:?}, Redis said {before}..{after}"
    );
    assert_eq!(intent_expiry(&cluster, "x-1"), longer.expires_at);
    for (sku, stock) in [(&a, 9), (&b, 8), (&c, 7)] {
        let (expires, score) = line_hold(&cluster, sku, "x-1");
        assert!(
            expires >= longer.expires_at as u64 + 2000,
            "{sku}: {expires}"
        );
        assert_eq!(score, expires, "{sku}: the holds set moved with the line");
        assert!(longer.remains.contains(&(sku.clone(), stock)), "{longer:?}");
    }
    let lines_then: Vec<(u64, u64)> = [&a, &b, &c]
        .iter()
        .map(|sku| line_hold(&cluster, sku, "x-1"))
        .collect();

    // Sent again: the same answer, nothing moved. Refusals move nothing.
    let again = must(&mut conn, &["ORDER.EXTEND", "x-1", "e-1", "30000"]).await;
    assert_eq!((again.code, again.expires_at), (1, longer.expires_at));
    for (id, ttl, why) in [
        ("e-1", "40000", "another change"),
        ("e-2", "20000", "already lasts"),
        ("e-3", "58000", "at most"),
        ("e-4", "58001", "ttl_ms"),
        ("e 5", "40000", "change_id"),
    ] {
        let refused = must(&mut conn, &["ORDER.EXTEND", "x-1", id, ttl]).await;
        assert_eq!(refused.code, 3, "{id} {ttl}: {refused:?}");
        let reason = refused.reason.unwrap_or_default();
        assert!(reason.contains(why), "{id} {ttl}: {reason}");
    }
    assert_eq!(intent_expiry(&cluster, "x-1"), longer.expires_at);
    let lines_now: Vec<(u64, u64)> = [&a, &b, &c]
        .iter()
        .map(|sku| line_hold(&cluster, sku, "x-1"))
        .collect();
    assert_eq!(lines_now, lines_then, "no retry or refusal moved a line");

    // Past the old expiry, the order and its lines still hold: CONFIRM
    // takes every line.
    wait_redis_past(&cluster, first.expires_at + 2000);
    for sku in [&a, &b, &c] {
        let _: Value = redis::cmd("STOCK.GET")
            .arg(sku.as_str())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(line_state(&cluster, sku, "x-1"), 'H', "{sku}");
    }
    let confirmed = must(&mut conn, &["ORDER.CONFIRM", "x-1"]).await;
    assert_eq!(
        (confirmed.code, confirmed.expires_at),
        (0, longer.expires_at)
    );
    for (sku, stock) in [(&a, 9), (&b, 8), (&c, 7)] {
        assert_eq!(line_state(&cluster, sku, "x-1"), 'C');
        assert_eq!(
            (get_stock(&cluster, sku), held(&cluster, sku)),
            (Some(stock), 0)
        );
    }
    // Confirmed: 1 with its expiry, for a new change_id and the old one.
    for id in ["e-1", "e-6"] {
        let done = must(&mut conn, &["ORDER.EXTEND", "x-1", id, "30000"]).await;
        assert_eq!((done.code, done.expires_at), (1, longer.expires_at), "{id}");
    }

    // Runs out at its new expiry, by Redis time; then 5, nothing changed,
    // and every unit back once.
    let short = must(&mut conn, &["ORDER.HOLD", "x-2", "1000", &a, "2", &b, "1"]).await;
    assert_eq!(short.code, 0);
    let later = must(&mut conn, &["ORDER.EXTEND", "x-2", "e-1", "2500"]).await;
    assert_eq!(later.code, 0, "{later:?}");
    wait_redis_past(&cluster, short.expires_at);
    let status: Vec<Value> = redis::cmd("ORDER.STATUS")
        .arg("x-2")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(status.contains(&Value::Int(later.expires_at)), "{status:?}");
    assert_eq!(intent_phase(&cluster, "x-2").as_deref(), Some("HELD"));
    wait_redis_past(&cluster, later.expires_at);
    let late = must(&mut conn, &["ORDER.EXTEND", "x-2", "e-2", "5000"]).await;
    assert_eq!((late.code, late.expires_at), (5, later.expires_at));
    assert_eq!(intent_expiry(&cluster, "x-2"), later.expires_at);
    let late = must(&mut conn, &["ORDER.CONFIRM", "x-2"]).await;
    assert_eq!(late.code, 5);
    for (sku, stock) in [(&a, 9), (&b, 8), (&c, 7)] {
        assert_eq!(
            (get_stock(&cluster, sku), held(&cluster, sku)),
            (Some(stock), 0)
        );
        assert!(matches!(line_state(&cluster, sku, "x-2"), 'R' | 'X' | '-'));
    }
    let retried = must(&mut conn, &["ORDER.EXTEND", "x-2", "e-1", "2500"]).await;
    assert_eq!((retried.code, retried.expires_at), (1, later.expires_at));

    // Reverted, revoked: 4; an ORDER's id, none, an intent an older
    // stockgate began (no start time): 3. Nothing changes.
    assert_eq!(
        must(&mut conn, &["ORDER.HOLD", "x-3", "50000", &a, "1"])
            .await
            .code,
        0
    );
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "x-3"]).await.code, 0);
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "x-4"]).await.code, 4);
    assert_eq!(must(&mut conn, &["ORDER", "x-5", &a, "1"]).await.code, 0);
    assert_eq!(
        must(&mut conn, &["ORDER.HOLD", "x-6", "50000", &c, "1"])
            .await
            .code,
        0
    );
    let mut direct = cluster.cluster_connection().unwrap();
    let _: () = redis::cmd("HDEL")
        .arg(layout().order_key(&RequestId::parse("x-6".into()).unwrap()))
        .arg("b")
        .query(&mut direct)
        .unwrap();
    let x6_expiry = intent_expiry(&cluster, "x-6");
    for (order, code) in [
        ("x-3", 4),
        ("x-4", 4),
        ("x-5", 3),
        ("x-none", 3),
        ("x-6", 3),
    ] {
        let refused = must(&mut conn, &["ORDER.EXTEND", order, "e-1", "30000"]).await;
        assert_eq!(refused.code, code, "{order}: {refused:?}");
    }
    assert_eq!(intent_phase(&cluster, "x-none"), None);
    assert_eq!(intent_expiry(&cluster, "x-6"), x6_expiry);
    assert_eq!(must(&mut conn, &["ORDER.REVERT", "x-6"]).await.code, 0);
    for (sku, stock) in [(&a, 8), (&b, 8), (&c, 7)] {
        assert_eq!(
            (get_stock(&cluster, sku), held(&cluster, sku)),
            (Some(stock), 0)
        );
    }
    assert_eq!(
        metric(
            &server,
            "stockgate_requests_total{command=\"order.extend\",result=\"ok\"}"
        ),
        2
    );
}

/// An ORDER.EXTEND cut short between its lines and its intent (its lines
/// extended by hand with stockgate's script, the intent never moved):
/// the order runs out at its own expiry, and every unit comes back once,
/// whether ORDER.CONFIRM gives the lines back or they run out by
/// themselves at their later expiry (then a late ORDER.CONFIRM gives
/// nothing back again). Nothing is filed for recovery: the order rests.
#[tokio::test]
async fn an_extension_cut_short_leaves_lines_held_past_the_order_and_every_unit_back_once() {
    let cluster = cluster();
    let [a, b, _] = spread("cut-ext");
    for sku in [&a, &b] {
        set_stock(&cluster, sku, 10);
    }
    let server = proxy(cluster.seeds(), |config| config.sweeper = false).await;
    let mut conn = client(&server, false).await;
    let mut saga = Saga::new(&cluster);
    let mut orders = Vec::new();
    for order in ["cut-1", "cut-2"] {
        let held = must(&mut conn, &["ORDER.HOLD", order, "1000", &a, "1", &b, "2"]).await;
        assert_eq!(held.code, 0, "{held:?}");
        for sku in [&a, &b] {
            assert_eq!(saga.extend(sku, order, "3000"), 0, "{order} {sku}");
            // Sent again, shorter: it lasts that long already.
            assert_eq!(saga.extend(sku, order, "1000"), 1, "{order} {sku}");
        }
        orders.push(held.expires_at);
    }
    assert_eq!(
        (get_stock(&cluster, &a), get_stock(&cluster, &b)),
        (Some(8), Some(6))
    );
    let line_expiry = [&a, &b]
        .iter()
        .map(|sku| line_hold(&cluster, sku, "cut-2").0 as i64)
        .max()
        .unwrap();
    assert!(
        line_expiry > orders[1] + 1000,
        "the lines outlast the order"
    );

    // The order ran out by its intent; its lines still hold.
    wait_redis_past(&cluster, orders[0].max(orders[1]));
    for (order, expiry) in ["cut-1", "cut-2"].iter().zip(&orders) {
        assert_eq!(
            intent_expiry(&cluster, order),
            *expiry,
            "the intent never moved"
        );
        assert_eq!(intent_phase(&cluster, order).as_deref(), Some("HELD"));
        for sku in [&a, &b] {
            assert_eq!(line_state(&cluster, sku, order), 'H', "{order} {sku}");
        }
    }
    // ORDER.CONFIRM: 5, every line given back now.
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "cut-1"]).await.code, 5);
    for sku in [&a, &b] {
        assert_eq!(line_state(&cluster, sku, "cut-1"), 'R', "{sku}");
    }
    assert_eq!(
        (get_stock(&cluster, &a), get_stock(&cluster, &b)),
        (Some(9), Some(8))
    );
    // Nobody confirms the other: its lines run out at their own expiry,
    // released by any call on their SKU, and once only.
    wait_redis_past(&cluster, line_expiry);
    for sku in [&a, &b] {
        let _: Value = redis::cmd("STOCK.GET")
            .arg(sku.as_str())
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(line_state(&cluster, sku, "cut-2"), 'X', "{sku}");
    }
    assert_eq!(must(&mut conn, &["ORDER.CONFIRM", "cut-2"]).await.code, 5);
    for sku in [&a, &b] {
        assert_eq!(
            (get_stock(&cluster, sku), held(&cluster, sku)),
            (Some(10), 0),
            "{sku}"
        );
    }
}

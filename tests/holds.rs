//! HOLD and CONFIRM over the wire, against real Redis: every cell of the
//! state machine (`lua/revert.lua`), expiry by Redis time, the bounded
//! release, the sweeper, the rolling upgrade. No timed assertions: tests
//! wait for states and counts (with a generous bound for a state that
//! never comes), never for a duration to be short.

mod support;

use redis::Value;
use std::time::Duration;
use support::*;

fn set(conn: &mut impl redis::ConnectionLike, key: &[u8], value: i64) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query::<()>(conn)
        .unwrap();
}

fn get_int(conn: &mut impl redis::ConnectionLike, key: &[u8]) -> Option<i64> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

fn held_key(sku: &str) -> Vec<u8> {
    [stock_key(sku), b":held".to_vec()].concat()
}

fn holds_key(sku: &str) -> Vec<u8> {
    [stock_key(sku), b":holds".to_vec()].concat()
}

/// Redis's clock, in milliseconds: what every expiry is measured by.
fn redis_now_ms(conn: &mut impl redis::ConnectionLike) -> i64 {
    let time: Vec<String> = redis::cmd("TIME").query(conn).unwrap();
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// Waits until Redis's clock has passed `at_ms`.
fn wait_redis_past(conn: &mut impl redis::ConnectionLike, at_ms: i64) {
    loop {
        let now = redis_now_ms(conn);
        if now > at_ms {
            return;
        }
        std::thread::sleep(Duration::from_millis((at_ms - now + 1).min(200) as u64));
    }
}

fn code_of(value: &Value) -> i64 {
    match value {
        Value::Array(items) => match items.first() {
            Some(Value::Int(code)) => *code,
            _ => panic!("no code in {value:?}"),
        },
        other => panic!("not a stock reply: {other:?}"),
    }
}

matrix! { #[tokio::test] async fn a_hold_takes_stock_at_once_and_confirm_makes_it_final }
async fn a_hold_takes_stock_at_once_and_confirm_makes_it_final(kind: ServerKind) {
    let redis = standalone_of(kind);
    let mut direct = redis.node.connection().unwrap();
    set(&mut direct, &stock_key("h1"), 10);
    let server = proxy(vec![redis.url()], |_| {}).await;
    let mut conn = client(&server, false).await;

    let before = redis_now_ms(&mut direct);
    let held = parse_hold(
        hold(&mut conn, "h1", "3", "o-1", "60000", Some("ORD-1"))
            .await
            .unwrap(),
    );
    let after = redis_now_ms(&mut direct);
    assert_eq!(
        (held.code, held.remain, held.order_no.as_str()),
        (0, 7, "ORD-1")
    );
    assert_eq!(held.version, stockgate::outcome::SCRIPT_VERSION);
    assert!(
        (before + 60_000..=after + 60_000).contains(&held.expires_at),
        "expires_at is Redis time plus ttl_ms: {held:?}, Redis said {before}..{after}"
    );
    assert_eq!(get_int(&mut direct, &stock_key("h1")), Some(7));
    assert_eq!(get_int(&mut direct, &held_key("h1")), Some(3));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(record_key("h1", "o-1"))
        .query(&mut direct)
        .unwrap();
    assert_eq!(
        ttl, -1,
        "a HELD record has no TTL: its units are in it, so it lasts until the hold ends"
    );

    let again = parse_hold(
        hold(&mut conn, "h1", "3", "o-1", "60000", None)
            .await
            .unwrap(),
    );
    assert_eq!(
        (
            again.code,
            again.remain,
            again.order_no.as_str(),
            again.expires_at
        ),
        (1, 7, "ORD-1", held.expires_at)
    );
    let other_qty = parse_hold(
        hold(&mut conn, "h1", "4", "o-1", "60000", None)
            .await
            .unwrap(),
    );
    assert_eq!(other_qty.code, 3);

    let done = parse_hold(confirm(&mut conn, "h1", "o-1").await.unwrap());
    assert_eq!(
        (done.code, done.remain, done.order_no.as_str()),
        (0, 7, "ORD-1")
    );
    assert_eq!(done.expires_at, held.expires_at);
    assert_eq!(get_int(&mut direct, &held_key("h1")), None, "no units held");
    let members: i64 = redis::cmd("ZCARD")
        .arg(holds_key("h1"))
        .query(&mut direct)
        .unwrap();
    assert_eq!(members, 0, "a confirmed hold leaves the holds set");
    let twice = parse_hold(confirm(&mut conn, "h1", "o-1").await.unwrap());
    assert_eq!((twice.code, twice.remain), (1, 7));
    assert_eq!(
        get_int(&mut direct, &stock_key("h1")),
        Some(7),
        "confirmed units stay taken"
    );

    // STOCK.STATUS shows the request and its sku's holds.
    let _ = parse_hold(
        hold(&mut conn, "h1", "2", "o-2", "90000", None)
            .await
            .unwrap(),
    );
    let status: Value = redis::cmd("STOCK.STATUS")
        .arg("h1")
        .arg("o-2")
        .query_async(&mut conn)
        .await
        .unwrap();
    let Value::Array(fields) = status else {
        panic!("a map, flat in RESP2: {status:?}")
    };
    let field = |name: &str| {
        let at = fields
            .iter()
            .position(|f| *f == Value::BulkString(name.as_bytes().to_vec()))
            .unwrap_or_else(|| panic!("{name} in {fields:?}"));
        fields[at + 1].clone()
    };
    assert_eq!(field("state"), Value::BulkString(b"HELD".to_vec()));
    assert_eq!(field("held"), Value::Int(2));
    assert_eq!(field("stock"), Value::Int(5));
    let Value::Int(next) = field("next_expiry") else {
        panic!("next_expiry is an integer")
    };
    assert_eq!(field("expires_at"), Value::Int(next));
    assert!(next > after + 60_000);
}

/// The states a (sku, request_id) can be in, and how a test gets there.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Start {
    Fresh,
    Deducted,
    Held,
    /// HELD, with its expiry passed and nothing released yet.
    RanOut,
    Confirmed,
    Expired,
    Reverted,
    Revoked,
}

#[derive(Debug, Clone, Copy)]
enum Command {
    Deduct,
    Hold,
    Confirm,
    Revert,
}

/// A cell of the table: the code, the record's state after, the stock after.
type Cell = (i64, char, i64);

matrix! { #[tokio::test] async fn every_cell_of_the_state_machine }
/// Every cell of docs/holds-and-orders.md's state-machine table, over the wire: the
/// code, the record's state after, and the stock after (10 to start, 2
/// units a call).
async fn every_cell_of_the_state_machine(kind: ServerKind) {
    use Command::*;
    use Start::*;
    #[rustfmt::skip]
    let table: [(Start, [Cell; 4]); 8] = [
        //             DEDUCT          HOLD            CONFIRM         REVERT
        (Fresh,     [(0, 'D', 8),  (0, 'H', 8),  (4, 'V', 10), (4, 'V', 10)]),
        (Deducted,  [(1, 'D', 8),  (3, 'D', 8),  (3, 'D', 8),  (0, 'R', 10)]),
        (Held,      [(3, 'H', 8),  (1, 'H', 8),  (0, 'C', 8),  (0, 'R', 10)]),
        (RanOut,    [(3, 'X', 10), (5, 'X', 10), (5, 'X', 10), (1, 'X', 10)]),
        (Confirmed, [(3, 'C', 8),  (1, 'C', 8),  (1, 'C', 8),  (0, 'R', 10)]),
        (Expired,   [(3, 'X', 10), (5, 'X', 10), (5, 'X', 10), (1, 'X', 10)]),
        (Reverted,  [(4, 'R', 10), (4, 'R', 10), (4, 'R', 10), (1, 'R', 10)]),
        (Revoked,   [(4, 'V', 10), (4, 'V', 10), (4, 'V', 10), (1, 'V', 10)]),
    ];
    let redis = standalone_of(kind);
    let mut direct = redis.node.connection().unwrap();
    // No sweeper: the ran-out holds must still be HELD when the command
    // under test arrives, so that it is the command that settles them.
    let server = proxy(vec![redis.url()], |c| c.sweeper = false).await;
    let mut conn = client(&server, false).await;
    let sku = |start: Start, command: Command| format!("cell-{start:?}-{command:?}");
    let mut ran_out_at = 0;
    for (start, _) in &table {
        for command in [Deduct, Hold, Confirm, Revert] {
            let sku = sku(*start, command);
            set(&mut direct, &stock_key(&sku), 10);
            let short = matches!(start, RanOut | Expired);
            let ttl = if short { "1000" } else { "600000" };
            let codes: Vec<i64> = match start {
                Fresh => vec![],
                Deducted => vec![code_of(
                    &deduct(&mut conn, &sku, "2", "id", None).await.unwrap(),
                )],
                Held | RanOut | Expired => {
                    let held =
                        parse_hold(hold(&mut conn, &sku, "2", "id", ttl, None).await.unwrap());
                    if short {
                        ran_out_at = ran_out_at.max(held.expires_at);
                    }
                    vec![held.code]
                }
                Confirmed => vec![
                    code_of(&hold(&mut conn, &sku, "2", "id", ttl, None).await.unwrap()),
                    code_of(&confirm(&mut conn, &sku, "id").await.unwrap()),
                ],
                Reverted => vec![
                    code_of(&deduct(&mut conn, &sku, "2", "id", None).await.unwrap()),
                    code_of(&revert(&mut conn, &sku, "id").await.unwrap()),
                ],
                Revoked => vec![code_of(&revert(&mut conn, &sku, "id").await.unwrap())],
            };
            let expected_setup = match start {
                Revoked => vec![4],
                _ => vec![0; codes.len()],
            };
            assert_eq!(codes, expected_setup, "setting up {sku}");
        }
    }
    wait_redis_past(&mut direct, ran_out_at);
    for (start, _) in &table {
        if *start == Expired {
            for command in [Deduct, Hold, Confirm, Revert] {
                // Anything that touches the sku releases it: EXPIRED now.
                let _: Value = redis::cmd("STOCK.GET")
                    .arg(sku(*start, command))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(record_state(&mut direct, &sku(*start, command), "id"), 'X');
            }
        }
        if *start == RanOut {
            for command in [Deduct, Hold, Confirm, Revert] {
                assert_eq!(record_state(&mut direct, &sku(*start, command), "id"), 'H');
            }
        }
    }
    let mut wrong = Vec::new();
    for (start, cells) in &table {
        for (command, (code, state, stock)) in
            [Deduct, Hold, Confirm, Revert].into_iter().zip(cells)
        {
            let sku = sku(*start, command);
            let reply = match command {
                Deduct => deduct(&mut conn, &sku, "2", "id", None).await,
                Hold => hold(&mut conn, &sku, "2", "id", "600000", None).await,
                Confirm => confirm(&mut conn, &sku, "id").await,
                Revert => revert(&mut conn, &sku, "id").await,
            }
            .unwrap();
            if matches!(command, Hold | Confirm) {
                parse_hold(reply.clone());
            } else {
                parse(reply.clone());
            }
            let got = (
                code_of(&reply),
                record_state(&mut direct, &sku, "id"),
                get_int(&mut direct, &stock_key(&sku)).unwrap(),
            );
            let held = get_int(&mut direct, &held_key(&sku)).unwrap_or(0);
            let want_held = if got.1 == 'H' { 2 } else { 0 };
            // A HELD record has no TTL (its units are in it); every other
            // one lasts at least the retry window from its last change.
            let ttl: i64 = redis::cmd("PTTL")
                .arg(record_key(&sku, "id"))
                .query(&mut direct)
                .unwrap();
            let ttl_ok = if got.1 == 'H' {
                ttl == -1
            } else {
                ttl > 86_000_000
            };
            if !ttl_ok {
                wrong.push(format!("{start:?} + {command:?}: record TTL {ttl}"));
            }
            if got != (*code, *state, *stock) || held != want_held {
                wrong.push(format!(
                    "{start:?} + {command:?}: got {got:?} held {held}, want {:?} held {want_held}",
                    (code, state, stock)
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "cells that disagree:\n{}",
        wrong.join("\n")
    );
}

/// Hundreds of one-second holds, each CONFIRMed around its expiry (some
/// just before, some just after, by Redis time): every CONFIRM answers 0 or
/// 5, its record agrees, and once everything settled the stock is the
/// initial less what was confirmed, with no unit held and none counted
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_racing_expiry_settles_every_hold_exactly_once() {
    const HOLDS: usize = 300;
    const SKUS: usize = 3;
    const INITIAL: i64 = 10_000;
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    let skus: Vec<String> = (0..SKUS).map(|i| format!("race-{i}")).collect();
    for sku in &skus {
        set(&mut direct, &stock_key(sku), INITIAL);
    }
    let server = proxy(vec![redis.url()], |_| {}).await;
    let mut conn = client(&server, false).await;
    // Place them in waves, so expiries spread over a few seconds.
    let mut holds = Vec::new();
    for i in 0..HOLDS {
        let sku = &skus[i % SKUS];
        let id = format!("race-{i}");
        let qty = (1 + i % 3).to_string();
        let held = parse_hold(hold(&mut conn, sku, &qty, &id, "1000", None).await.unwrap());
        assert_eq!(held.code, 0, "{held:?}");
        holds.push((sku.clone(), id, 1 + (i % 3) as i64, held.expires_at));
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Redis's clock against ours, once: only to aim the CONFIRMs near each
    // expiry. Which side of it each lands on is Redis's to decide.
    let offset = redis_now_ms(&mut direct) - wall_ms();
    let tasks: Vec<_> = holds
        .iter()
        .enumerate()
        .map(|(i, (sku, id, _, expires_at))| {
            let aim = expires_at - offset + (i as i64 % 41) - 20;
            let (sku, id) = (sku.clone(), id.clone());
            let addr = server.addr;
            tokio::spawn(async move {
                let wait = aim - wall_ms();
                if wait > 0 {
                    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                }
                let mut conn = client_at(addr, false).await;
                parse_hold(confirm(&mut conn, &sku, &id).await.unwrap())
            })
        })
        .collect();
    let mut confirmed = [0i64; SKUS];
    let (mut zeros, mut fives) = (0, 0);
    for (task, (sku, id, qty, expires_at)) in tasks.into_iter().zip(&holds) {
        let reply = task.await.unwrap();
        assert!(matches!(reply.code, 0 | 5), "{id}: {reply:?}");
        assert_eq!(reply.expires_at, *expires_at);
        let state = record_state(&mut direct, sku, id);
        if reply.code == 0 {
            zeros += 1;
            confirmed[skus.iter().position(|s| s == sku).unwrap()] += qty;
            assert_eq!(state, 'C', "{id} answered 0");
        } else {
            fives += 1;
            assert_eq!(state, 'X', "{id} answered 5");
        }
    }
    eprintln!("{zeros} confirmed, {fives} expired first");
    // Settled: no unit held anywhere, and the books add up.
    for (i, sku) in skus.iter().enumerate() {
        let stock = loop_until_async(Duration::from_secs(30), || async {
            let mut direct = redis.node.connection().unwrap();
            (get_int(&mut direct, &held_key(sku)).is_none())
                .then(|| get_int(&mut direct, &stock_key(sku)).unwrap())
        })
        .await;
        assert_eq!(stock, INITIAL - confirmed[i], "{sku}");
    }
    let counts = hold_counts(&server);
    assert_eq!(counts["placed"], HOLDS as u64);
    assert_eq!(counts["confirmed"], zeros);
    assert_eq!(counts["expired"], fives, "each expiry counted once");
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `stockgate_holds_total` by event, as this stockgate counted them.
fn hold_counts(server: &stockgate::server::Server) -> std::collections::HashMap<&'static str, u64> {
    server.shared().metrics.hold_totals().into_iter().collect()
}

/// More expired holds than one call releases (lua/common.lua's
/// RELEASE_BOUND, 32): each call on the SKU gives back at most that many,
/// the earliest first, and a few calls clean the backlog.
#[tokio::test]
async fn a_backlog_is_released_a_bounded_batch_per_call() {
    const HOLDS: i64 = 100;
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    set(&mut direct, &stock_key("backlog"), HOLDS);
    let server = proxy(vec![redis.url()], |c| c.sweeper = false).await;
    let mut conn = client(&server, false).await;
    let mut last = 0;
    for i in 0..HOLDS {
        let held = parse_hold(
            hold(&mut conn, "backlog", "1", &format!("b-{i}"), "1000", None)
                .await
                .unwrap(),
        );
        assert_eq!(held.code, 0);
        last = held.expires_at;
    }
    assert_eq!(get_int(&mut direct, &stock_key("backlog")), Some(0));
    wait_redis_past(&mut direct, last);
    let mut left = HOLDS;
    let mut calls = 0;
    while left > 0 {
        // Any call on the sku: a DEDUCT that is short until enough came back.
        let reply = parse(
            deduct(&mut conn, "backlog", "1000", &format!("d-{calls}"), None)
                .await
                .unwrap(),
        );
        calls += 1;
        let released = left.min(32);
        left -= released;
        assert_eq!(reply.code, 2, "still short of 1000");
        assert_eq!(
            reply.remain,
            HOLDS - left,
            "call {calls} gave back {released}"
        );
        let members: i64 = redis::cmd("ZCARD")
            .arg(holds_key("backlog"))
            .query(&mut direct)
            .unwrap();
        assert_eq!(members, left);
        assert_eq!(
            get_int(&mut direct, &held_key("backlog")).unwrap_or(0),
            left
        );
    }
    assert_eq!(calls, 4, "100 holds at 32 a call");
    assert_eq!(hold_counts(&server)["expired"], HOLDS as u64);
}

/// Nobody touches the SKU: the sweeper gives the units back by itself, and
/// the record says EXPIRED.
#[tokio::test]
async fn the_sweeper_gives_back_holds_nobody_touches() {
    let cluster = cluster();
    set_stock(&cluster, "untouched", 5);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let held = parse_hold(
        hold(&mut conn, "untouched", "5", "u-1", "1000", None)
            .await
            .unwrap(),
    );
    assert_eq!((held.code, held.remain), (0, 0));
    let stock = loop_until_async(Duration::from_secs(30), || async {
        (get_stock(&cluster, "untouched") == Some(5)).then_some(5)
    })
    .await;
    assert_eq!(stock, 5);
    let mut direct = cluster.cluster_connection().unwrap();
    let raw: String = redis::cmd("GET")
        .arg(record_key("untouched", "u-1"))
        .query(&mut direct)
        .unwrap();
    assert_eq!(summary(&raw), "X:5:");
    // The sweeper counts the release once its call has answered, a moment
    // after Redis made it: wait for the count, then hold it to exactly one.
    let expired = loop_until_async(Duration::from_secs(30), || async {
        let expired = hold_counts(&server)["expired"];
        (expired > 0).then_some(expired)
    })
    .await;
    assert_eq!(expired, 1);
    let late = parse_hold(confirm(&mut conn, "untouched", "u-1").await.unwrap());
    assert_eq!(
        (late.code, late.remain, late.expires_at),
        (5, 5, held.expires_at)
    );
}

/// A stockgate killed (SIGKILL: no drain, its sweep lease left behind)
/// while its holds are active: another stockgate's sweeper takes the lease
/// over and gives the units back, and every record says EXPIRED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_of_a_killed_stockgate_come_back_through_another() {
    const HOLDS: usize = 40;
    let cluster = cluster();
    let skus: Vec<String> = (0..8).map(|i| format!("orphan-{i}")).collect();
    for sku in &skus {
        set_stock(&cluster, sku, 100);
    }
    let doomed = Launch::serve(&cluster.seeds()).start();
    let mut conn = client_at(doomed.addr, false).await;
    for i in 0..HOLDS {
        let held = parse_hold(
            hold(
                &mut conn,
                &skus[i % skus.len()],
                "2",
                &format!("k-{i}"),
                "2000",
                None,
            )
            .await
            .unwrap(),
        );
        assert_eq!(held.code, 0);
    }
    // The survivor starts while the doomed one still leads the sweep.
    let survivor = proxy(cluster.seeds(), |_| {}).await;
    doomed.kill();
    drop(conn);
    for sku in &skus {
        loop_until_async(Duration::from_secs(60), || async {
            (get_stock(&cluster, sku) == Some(100)).then_some(())
        })
        .await;
    }
    let mut direct = cluster.cluster_connection().unwrap();
    for i in 0..HOLDS {
        let raw: String = redis::cmd("GET")
            .arg(record_key(&skus[i % skus.len()], &format!("k-{i}")))
            .query(&mut direct)
            .unwrap();
        assert_eq!(summary(&raw), "X:2:", "k-{i}");
    }
    assert_eq!(
        hold_counts(&survivor)["expired"],
        HOLDS as u64,
        "the survivor released every one, once"
    );
}

/// Holds through two stockgates at once, every step sent through both (a
/// retry through another sidecar, while the first attempt still runs), on
/// SKUs with less stock than asked for. Each pair of answers agrees, each
/// record agrees with its answers, and the books add up: per SKU, initial
/// less final is what was confirmed plus what is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_through_two_stockgates_at_once_add_up() {
    const ORDERS: usize = 160;
    const INITIAL: i64 = 60;
    let cluster = cluster();
    let skus: Vec<String> = (0..4).map(|i| format!("two-{i}")).collect();
    for sku in &skus {
        set_stock(&cluster, sku, INITIAL);
    }
    let a = proxy(cluster.seeds(), |_| {}).await;
    let b = proxy(cluster.seeds(), |_| {}).await;
    let (a, b) = (a.addr, b.addr);
    let tasks: Vec<_> = (0..ORDERS)
        .map(|i| {
            let sku = skus[i % skus.len()].clone();
            tokio::spawn(async move {
                let id = format!("two-{i}");
                let qty = (1 + i % 3).to_string();
                // Short holds for a quarter: they expire untouched.
                let ttl = if i % 4 == 3 { "1000" } else { "600000" };
                let mut ca = client_at(a, false).await;
                let mut cb = client_at(b, false).await;
                let (ha, hb) = tokio::join!(
                    hold(&mut ca, &sku, &qty, &id, ttl, None),
                    hold(&mut cb, &sku, &qty, &id, ttl, None)
                );
                let pair = (parse_hold(ha.unwrap()).code, parse_hold(hb.unwrap()).code);
                // One holds and the other sees it (0 and 1), or both find the
                // stock short; or the first finds it short and a short hold
                // runs out before the second, which then holds (2 and 0).
                assert!(
                    matches!(pair, (0, 1) | (1, 0) | (2, 2) | (2, 0) | (0, 2)),
                    "{id}: HOLD answered {pair:?}"
                );
                let step = match i % 4 {
                    0 | 1 if pair != (2, 2) => {
                        let (x, y) =
                            tokio::join!(confirm(&mut ca, &sku, &id), confirm(&mut cb, &sku, &id));
                        let pair = (parse_hold(x.unwrap()).code, parse_hold(y.unwrap()).code);
                        assert!(
                            matches!(pair, (0, 1) | (1, 0)),
                            "{id}: CONFIRM answered {pair:?}"
                        );
                        'C'
                    }
                    2 if pair != (2, 2) => {
                        let (x, y) =
                            tokio::join!(revert(&mut ca, &sku, &id), revert(&mut cb, &sku, &id));
                        let pair = (parse(x.unwrap()).code, parse(y.unwrap()).code);
                        assert!(
                            matches!(pair, (0, 1) | (1, 0)),
                            "{id}: REVERT answered {pair:?}"
                        );
                        'R'
                    }
                    _ if pair == (2, 2) => '-',
                    3 => 'X',
                    _ => 'H',
                };
                (sku, id, qty.parse::<i64>().unwrap(), step)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    // The short holds run out and the sweepers give them back.
    let mut direct = cluster.cluster_connection().unwrap();
    for (sku, id, _, step) in &outcomes {
        if *step == 'X' {
            loop_until_async(Duration::from_secs(30), || async {
                let mut direct = cluster.cluster_connection().unwrap();
                (record_state(&mut direct, sku, id) == 'X').then_some(())
            })
            .await;
        }
    }
    for sku in &skus {
        let (mut confirmed, mut held) = (0, 0);
        for (s, id, qty, step) in &outcomes {
            if s != sku {
                continue;
            }
            let state = record_state(&mut direct, sku, id);
            assert_eq!(state, *step, "{id}");
            match step {
                'C' => confirmed += qty,
                'H' => held += qty,
                _ => {}
            }
        }
        let stock = get_stock(&cluster, sku).unwrap();
        assert!(stock >= 0);
        assert_eq!(INITIAL - stock, confirmed + held, "{sku}");
        assert_eq!(
            get_int(&mut direct, &held_key(sku)).unwrap_or(0),
            held,
            "{sku}"
        );
    }
}

/// The reproduced loss (issue 22, 1): a hold that nothing releases for
/// longer than its record would have lived (its ttl plus the shortest
/// retry window, a minute). Its units come back exactly once all the same:
/// with `--sweeper false` at the next call on the SKU, and with the
/// sweeper on for a SKU whose index entry is gone (a mark that never
/// landed) at the next call too. Waits out the window once for both.
#[tokio::test]
async fn a_hold_nobody_releases_for_longer_than_the_retry_window_still_comes_back() {
    const WINDOW: Duration = Duration::from_secs(60);
    let quiet = standalone();
    let unindexed = standalone();
    let mut direct_quiet = quiet.node.connection().unwrap();
    let mut direct_unindexed = unindexed.node.connection().unwrap();
    set(&mut direct_quiet, &stock_key("lost-2"), 10);
    set(&mut direct_unindexed, &stock_key("lost-3"), 10);
    let without_sweeper = proxy(vec![quiet.url()], |c| {
        c.sweeper = false;
        c.retry_window = WINDOW;
    })
    .await;
    let with_sweeper = proxy(vec![unindexed.url()], |c| c.retry_window = WINDOW).await;
    let mut quiet_conn = client(&without_sweeper, false).await;
    let mut unindexed_conn = client(&with_sweeper, false).await;

    let a = parse_hold(
        hold(&mut quiet_conn, "lost-2", "3", "h1", "1000", None)
            .await
            .unwrap(),
    );
    assert_eq!((a.code, a.remain), (0, 7));
    // Placed by a stockgate that died before it could mark the SKU: the
    // HOLD script itself, sent straight to Redis.
    let scripts = stockgate::script::Scripts::new();
    let keys = layout().request_keys(
        &stockgate::params::Sku::parse("lost-3".into()).unwrap(),
        &stockgate::params::RequestId::parse("h1".into()).unwrap(),
    );
    let placed: Value = redis::cmd("EVAL")
        .arg(&scripts.hold.body)
        .arg(keys.all().len())
        .arg(&keys.all()[..])
        .arg(&["3", "", "1000", "86400000 60000 1000000 error 00", "ab12"][..])
        .query(&mut direct_unindexed)
        .unwrap();
    // The script's own reply: code, remain, order_no, version, reason,
    // expires_at, ...
    let Value::Array(items) = placed else {
        panic!("a reply array: {placed:?}")
    };
    let (Value::Int(code), Value::Int(remain), Value::Int(b_expires_at)) =
        (&items[0], &items[1], &items[5])
    else {
        panic!("{items:?}")
    };
    assert_eq!((*code, *remain), (0, 7));
    for (direct, sku) in [
        (&mut direct_quiet, "lost-2"),
        (&mut direct_unindexed, "lost-3"),
    ] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(record_key(sku, "h1"))
            .query(direct)
            .unwrap();
        assert_eq!(ttl, -1, "a HELD record has no TTL: its units are in it");
    }

    // Past the hold's end and a whole retry window: a record with the old
    // TTL (ttl + window) would be gone now, and its 3 units with it.
    let late = a.expires_at.max(*b_expires_at) + WINDOW.as_millis() as i64 + 1000;
    wait_redis_past(&mut direct_quiet, late);
    wait_redis_past(&mut direct_unindexed, late);
    assert_eq!(
        get_int(&mut direct_unindexed, &stock_key("lost-3")),
        Some(7),
        "nothing swept the SKU whose index entry was gone"
    );

    let status: Value = redis::cmd("STOCK.STATUS")
        .arg("lost-2")
        .arg("h1")
        .query_async(&mut quiet_conn)
        .await
        .unwrap();
    let shown = format!("{status:?}");
    assert!(shown.contains("EXPIRED"), "{shown}");
    let d = parse(
        deduct(&mut quiet_conn, "lost-2", "10", "d1", None)
            .await
            .unwrap(),
    );
    assert_eq!((d.code, d.remain), (0, 0), "the 3 units came back");
    let d = parse(
        deduct(&mut unindexed_conn, "lost-3", "10", "d1", None)
            .await
            .unwrap(),
    );
    assert_eq!((d.code, d.remain), (0, 0), "the 3 units came back");
    for (direct, sku) in [
        (&mut direct_quiet, "lost-2"),
        (&mut direct_unindexed, "lost-3"),
    ] {
        assert_eq!(get_int(direct, &held_key(sku)), None, "{sku}");
        assert_eq!(record_state(direct, sku, "h1"), 'X', "{sku}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(record_key(sku, "h1"))
            .query(direct)
            .unwrap();
        assert!(
            (1..=WINDOW.as_millis() as i64).contains(&ttl),
            "the released record lasts a retry window from its release: {ttl}"
        );
    }
    // Released once: a second call gives nothing more back.
    let again = parse_hold(confirm(&mut quiet_conn, "lost-2", "h1").await.unwrap());
    assert_eq!((again.code, again.remain), (5, 0));
    assert_eq!(hold_counts(&without_sweeper)["expired"], 1);
    assert_eq!(hold_counts(&with_sweeper)["expired"], 1);
}

/// Redis time stepped back (a failover to a primary whose clock is behind):
/// a hold seems placed in the future. Its CONFIRM still answers 0, and the
/// time it was held counts as 0, not as a bad reply (issue 22, 6).
#[tokio::test]
async fn a_confirm_of_a_hold_placed_in_the_future_answers_0() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    set(&mut direct, &stock_key("future"), 7);
    let now = redis_now_ms(&mut direct);
    let (held_at, expires) = (now + 3_600_000, now + 7_200_000);
    redis::cmd("SET")
        .arg(record_key("future", "f-1"))
        .arg(format!("3:H:3:ab12:{expires}.{held_at}:ORD-F"))
        .query::<()>(&mut direct)
        .unwrap();
    redis::cmd("ZADD")
        .arg(holds_key("future"))
        .arg(expires)
        .arg("f-1")
        .query::<()>(&mut direct)
        .unwrap();
    set(&mut direct, &held_key("future"), 3);
    let server = proxy(vec![redis.url()], |_| {}).await;
    let mut conn = client(&server, false).await;
    let done = parse_hold(confirm(&mut conn, "future", "f-1").await.unwrap());
    assert_eq!(
        (
            done.code,
            done.remain,
            done.order_no.as_str(),
            done.expires_at
        ),
        (0, 7, "ORD-F", expires)
    );
    assert_eq!(record_state(&mut direct, "future", "f-1"), 'C');
    assert_eq!(
        metric(&server, "stockgate_hold_held_seconds_count"),
        1,
        "held for 0 s, counted"
    );
    assert_eq!(
        metric(&server, "stockgate_hold_held_seconds_bucket{le=\"1\"}"),
        1
    );
}

/// The sweep index against a sweep that races a HOLD (issue 22, 6): a
/// sweep lists a SKU that already has a long hold, releases it before a
/// new short HOLD lands, and files it after: under the long hold's expiry,
/// had nothing followed. The marks stockgate sends around a HOLD (before
/// it by its ttl, after it by its expiry: `src/stock/sweeper.rs`) keep the
/// SKU filed no later than the short hold's expiry, in either order of the
/// filing and the mark after. The scripts are stockgate's own, run in the
/// order the race runs them.
#[test]
fn a_sweep_racing_a_hold_never_files_its_sku_past_the_hold() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    let scripts = stockgate::script::Scripts::new();
    let layout = layout();
    let eval = |conn: &mut redis::Connection,
                script: &stockgate::script::LuaScript,
                keys: &[&[u8]],
                args: &[&[u8]]|
     -> Value {
        redis::cmd("EVAL")
            .arg(&script.body)
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .query(conn)
            .unwrap()
    };
    for filing_first in [true, false] {
        let name = format!("race-{filing_first}");
        let sku = stockgate::params::Sku::parse(name.clone().into()).unwrap();
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&sku)];
        let index = [&shard.due[..], &shard.marks[..]];
        let sku_keys = layout.sku_keys(&sku);
        let hold_keys = |id: &str| {
            layout.request_keys(
                &sku,
                &stockgate::params::RequestId::parse(id.to_owned().into()).unwrap(),
            )
        };
        set(&mut direct, &stock_key(&name), 10);
        let place = |conn: &mut redis::Connection, id: &str, ttl: &str| -> i64 {
            let keys = hold_keys(id);
            let reply = eval(
                conn,
                &scripts.hold,
                &keys.all(),
                &[
                    b"1",
                    b"",
                    ttl.as_bytes(),
                    b"86400000 86400000 100 error 00",
                    b"ab12",
                ],
            );
            match reply {
                Value::Array(items) => match items[5] {
                    Value::Int(at) => at,
                    _ => panic!("{items:?}"),
                },
                other => panic!("{other:?}"),
            }
        };
        let mark = |conn: &mut redis::Connection, expires_at: Option<i64>, ttl_ms: u64| {
            let at = expires_at.map(|a| a.to_string()).unwrap_or_default();
            eval(
                conn,
                &scripts.due_mark,
                &index,
                &[
                    name.as_bytes(),
                    at.as_bytes(),
                    ttl_ms.to_string().as_bytes(),
                ],
            );
        };
        let score = |conn: &mut redis::Connection| -> i64 {
            redis::cmd("ZSCORE")
                .arg(&shard.due)
                .arg(&name)
                .query::<Option<i64>>(conn)
                .unwrap()
                .expect("the sku is in the index")
        };
        // A long hold, marked as stockgate marks it.
        let long = place(&mut direct, "long", "600000");
        mark(&mut direct, None, 600_000);
        mark(&mut direct, Some(long), 0);
        // The short HOLD's mark before it; then, its HOLD held up (its
        // node busy), a sweep comes round once the mark is due: it lists
        // the sku and releases it before the HOLD lands.
        mark(&mut direct, None, 1000);
        let due_at = score(&mut direct);
        wait_redis_past(&mut direct, due_at);
        let listed = eval(&mut direct, &scripts.due_sweep, &index, &[b"64", b"10000"]);
        let Value::Array(listed) = listed else {
            panic!()
        };
        let at = listed
            .iter()
            .position(|v| *v == Value::BulkString(name.clone().into_bytes()))
            .expect("the sku is due");
        let Value::BulkString(seen) = listed[at + 1].clone() else {
            panic!()
        };
        let released = eval(
            &mut direct,
            &scripts.release,
            &sku_keys.all(),
            &[b"86400000"],
        );
        let Value::Array(released) = released else {
            panic!()
        };
        assert_eq!(released[1], Value::Int(long), "only the long hold is there");
        let short = place(&mut direct, "short", "1000");
        assert!(short < long);
        let file = |conn: &mut redis::Connection| {
            eval(
                conn,
                &scripts.due_sweep,
                &index,
                &[
                    b"0",
                    b"10000",
                    name.as_bytes(),
                    &seen,
                    long.to_string().as_bytes(),
                ],
            );
        };
        if filing_first {
            file(&mut direct);
            mark(&mut direct, Some(short), 0);
        } else {
            mark(&mut direct, Some(short), 0);
            file(&mut direct);
        }
        let filed = score(&mut direct);
        assert!(
            filed <= short,
            "filing first: {filing_first}; the sku is filed at {filed}, after the short hold's expiry {short}"
        );
    }
}

/// HOLD.EXTEND or HOLD.SHRINK through `conn`, parsed as a HOLD reply.
async fn change(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &str,
    sku: &str,
    request_id: &str,
    change_id: &str,
    amount: &str,
) -> HoldReply {
    parse_hold(
        redis::cmd(command)
            .arg(sku)
            .arg(request_id)
            .arg(change_id)
            .arg(amount)
            .query_async(conn)
            .await
            .unwrap(),
    )
}

/// The hold's record, parsed.
fn record_of(
    conn: &mut impl redis::ConnectionLike,
    sku: &str,
    id: &str,
) -> stockgate::record::Record {
    let raw: String = redis::cmd("GET")
        .arg(record_key(sku, id))
        .query(conn)
        .unwrap();
    stockgate::record::Record::parse(&raw).unwrap()
}

matrix! { #[tokio::test] async fn extend_and_shrink_change_a_live_hold_once_per_change_id }
/// HOLD.EXTEND and HOLD.SHRINK in every state of the hold, over the wire:
/// the code, the record and the stock after, and a retry of each change
/// answered exactly (1, the same expiry, nothing changed again).
async fn extend_and_shrink_change_a_live_hold_once_per_change_id(kind: ServerKind) {
    let redis = standalone_of(kind);
    let mut direct = redis.node.connection().unwrap();
    let server = proxy(vec![redis.url()], |c| {
        c.sweeper = false;
        c.max_hold = Duration::from_secs(3600);
    })
    .await;
    let mut conn = client(&server, false).await;
    let sku = "chg";
    set(&mut direct, &stock_key(sku), 10);
    let held = parse_hold(
        hold(&mut conn, sku, "5", "h-1", "60000", Some("ORD-C"))
            .await
            .unwrap(),
    );
    assert_eq!((held.code, held.remain), (0, 5));
    let (_, held_at) = record_of(&mut direct, sku, "h-1").hold.unwrap();

    // Extend: a new expiry by Redis time, the holds set moved with it.
    let before = redis_now_ms(&mut direct);
    let longer = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-1", "120000").await;
    let after = redis_now_ms(&mut direct);
    assert_eq!(
        (longer.code, longer.remain, longer.order_no.as_str()),
        (0, 5, "ORD-C")
    );
    assert!(
        (before + 120_000..=after + 120_000).contains(&longer.expires_at),
        "Redis time plus ttl_ms: {longer:?}, Redis said {before}..{after}"
    );
    let score: i64 = redis::cmd("ZSCORE")
        .arg(holds_key(sku))
        .arg("h-1")
        .query(&mut direct)
        .unwrap();
    assert_eq!(score, longer.expires_at);
    let record = record_of(&mut direct, sku, "h-1");
    assert_eq!(record.hold, Some((longer.expires_at as u64, held_at)));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(record_key(sku, "h-1"))
        .query(&mut direct)
        .unwrap();
    assert_eq!(ttl, -1, "still a HELD record without a TTL");
    let again = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-1", "120000").await;
    assert_eq!(
        (again.code, again.remain, again.expires_at),
        (1, 5, longer.expires_at)
    );
    let reused = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-1", "130000").await;
    assert_eq!(reused.code, 3, "{reused:?}");
    let earlier = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-2", "60000").await;
    assert_eq!(earlier.code, 3, "an extension never shortens: {earlier:?}");
    // The bound: --max-hold from the hold's start, which now has passed.
    wait_redis_past(&mut direct, held_at as i64);
    let past = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-3", "3600000").await;
    assert_eq!(past.code, 3, "{past:?}");
    assert!(past.reason.unwrap().contains("at most"));
    let over = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-4", "3600001").await;
    assert_eq!(over.code, 3, "ttl_ms past --max-hold");
    assert_eq!(
        record_of(&mut direct, sku, "h-1").hold.unwrap().0,
        longer.expires_at as u64,
        "no refusal changed the hold"
    );

    // Shrink: units back at once, the rest held with its expiry.
    let smaller = change(&mut conn, "HOLD.SHRINK", sku, "h-1", "s-1", "2").await;
    assert_eq!(
        (smaller.code, smaller.remain, smaller.expires_at),
        (0, 7, longer.expires_at)
    );
    assert_eq!(get_int(&mut direct, &held_key(sku)), Some(3));
    let record = record_of(&mut direct, sku, "h-1");
    assert_eq!((record.qty, record.asked), (3, Some(5)));
    let again = change(&mut conn, "HOLD.SHRINK", sku, "h-1", "s-1", "2").await;
    assert_eq!(
        (again.code, again.remain),
        (1, 7),
        "nothing given back twice"
    );
    // Every unit or more (the script says so, with the stock), none or
    // below none (stockgate says so before Redis: remain -1).
    for (id, qty, remain) in [
        ("s-2", "3", 7),
        ("s-3", "4", 7),
        ("s-4", "0", -1),
        ("s-5", "-1", -1),
    ] {
        let bad = change(&mut conn, "HOLD.SHRINK", sku, "h-1", id, qty).await;
        assert_eq!((bad.code, bad.remain), (3, remain), "{qty}: {bad:?}");
    }
    assert_eq!(get_int(&mut direct, &stock_key(sku)), Some(7));
    assert_eq!(get_int(&mut direct, &held_key(sku)), Some(3));
    // The HOLD sent again still matches what it asked for.
    let hold_again = parse_hold(
        hold(&mut conn, sku, "5", "h-1", "60000", None)
            .await
            .unwrap(),
    );
    assert_eq!(
        (hold_again.code, hold_again.expires_at),
        (1, longer.expires_at)
    );
    let other = parse_hold(
        hold(&mut conn, sku, "3", "h-1", "60000", None)
            .await
            .unwrap(),
    );
    assert_eq!(other.code, 3);

    // CONFIRM takes what is left.
    let done = parse_hold(confirm(&mut conn, sku, "h-1").await.unwrap());
    assert_eq!((done.code, done.remain), (0, 7));
    assert_eq!(get_int(&mut direct, &held_key(sku)), None);
    let confirmed = change(&mut conn, "HOLD.EXTEND", sku, "h-1", "e-5", "120000").await;
    assert_eq!(
        (confirmed.code, confirmed.expires_at),
        (1, longer.expires_at)
    );
    let confirmed = change(&mut conn, "HOLD.SHRINK", sku, "h-1", "s-6", "1").await;
    assert_eq!(confirmed.code, 3, "a confirmed hold's units are sold");
    assert_eq!(record_state(&mut direct, sku, "h-1"), 'C');
    // Conservation: 7 available, 0 held, 3 sold of 10.
    assert_eq!(get_int(&mut direct, &stock_key(sku)), Some(7));

    // No hold, a deduction, a revoked id, an order's line: nothing changes.
    let none = change(&mut conn, "HOLD.EXTEND", sku, "h-none", "e-6", "120000").await;
    assert_eq!(none.code, 3);
    assert_eq!(record_state(&mut direct, sku, "h-none"), '-');
    assert_eq!(
        code_of(&deduct(&mut conn, sku, "1", "d-1", None).await.unwrap()),
        0
    );
    let deducted = change(&mut conn, "HOLD.SHRINK", sku, "d-1", "s-7", "1").await;
    assert_eq!(deducted.code, 3);
    assert_eq!(
        code_of(&revert(&mut conn, sku, "v-1").await.unwrap()),
        4,
        "revoked"
    );
    for command in ["HOLD.EXTEND", "HOLD.SHRINK"] {
        let revoked = change(&mut conn, command, sku, "v-1", "x-1", "1000").await;
        assert_eq!(revoked.code, 4, "{command}");
    }
    let line = change(&mut conn, "HOLD.EXTEND", sku, "~ord:o-1", "e-7", "120000").await;
    assert_eq!(line.code, 3);

    // Ran out: 5, and the units are back.
    let short = parse_hold(
        hold(&mut conn, sku, "2", "h-2", "1000", None)
            .await
            .unwrap(),
    );
    assert_eq!((short.code, short.remain), (0, 4));
    wait_redis_past(&mut direct, short.expires_at);
    let late = change(&mut conn, "HOLD.EXTEND", sku, "h-2", "e-8", "120000").await;
    assert_eq!(
        (late.code, late.remain, late.expires_at),
        (5, 6, short.expires_at)
    );
    let late = change(&mut conn, "HOLD.SHRINK", sku, "h-2", "s-8", "1").await;
    assert_eq!((late.code, late.remain), (5, 6));
    assert_eq!(record_state(&mut direct, sku, "h-2"), 'X');

    let counts = hold_counts(&server);
    assert_eq!((counts["extended"], counts["shrunk"]), (1, 1));
    assert_eq!(
        metric(
            &server,
            "stockgate_requests_total{command=\"hold.extend\",result=\"duplicate\"}"
        ),
        2
    );
}

/// An extended hold runs out at its new expiry, by Redis time: past the
/// old one it is still held, past the new one any call on the SKU gives
/// its units back. No sweeper: the calls alone release it.
#[tokio::test]
async fn an_extended_hold_runs_out_at_its_new_expiry() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    set(&mut direct, &stock_key("ext"), 4);
    let server = proxy(vec![redis.url()], |c| c.sweeper = false).await;
    let mut conn = client(&server, false).await;
    let held = parse_hold(
        hold(&mut conn, "ext", "4", "x-1", "1000", None)
            .await
            .unwrap(),
    );
    let longer = change(&mut conn, "HOLD.EXTEND", "ext", "x-1", "e-1", "2500").await;
    assert_eq!(longer.code, 0);
    assert!(longer.expires_at > held.expires_at);
    wait_redis_past(&mut direct, held.expires_at);
    // Any call on the SKU releases what ran out; this one releases nothing.
    let short = parse(deduct(&mut conn, "ext", "1", "d-1", None).await.unwrap());
    assert_eq!((short.code, short.remain), (2, 0), "still held");
    assert_eq!(record_state(&mut direct, "ext", "x-1"), 'H');
    wait_redis_past(&mut direct, longer.expires_at);
    let back = parse(deduct(&mut conn, "ext", "1", "d-2", None).await.unwrap());
    assert_eq!((back.code, back.remain), (0, 3), "given back, then 1 taken");
    assert_eq!(record_state(&mut direct, "ext", "x-1"), 'X');
    let late = parse_hold(confirm(&mut conn, "ext", "x-1").await.unwrap());
    assert_eq!((late.code, late.expires_at), (5, longer.expires_at));
}

/// Nobody touches the SKU of an extended hold: the sweeper gives its units
/// back, and never before the new expiry (Redis time when they are seen
/// back is past it).
#[tokio::test]
async fn the_sweeper_honours_an_extension() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    set(&mut direct, &stock_key("swept"), 3);
    let server = proxy(vec![redis.url()], |_| {}).await;
    let mut conn = client(&server, false).await;
    let held = parse_hold(
        hold(&mut conn, "swept", "3", "w-1", "1000", None)
            .await
            .unwrap(),
    );
    let longer = change(&mut conn, "HOLD.EXTEND", "swept", "w-1", "e-1", "3000").await;
    assert_eq!(longer.code, 0);
    assert!(longer.expires_at >= held.expires_at + 1500);
    let seen_at = loop_until_async(Duration::from_secs(30), || {
        let mut direct = redis.node.connection().unwrap();
        async move {
            (get_int(&mut direct, &stock_key("swept")) == Some(3))
                .then(|| redis_now_ms(&mut direct))
        }
    })
    .await;
    assert!(
        seen_at >= longer.expires_at,
        "released at {seen_at}, before the new expiry {}",
        longer.expires_at
    );
    assert_eq!(record_state(&mut direct, "swept", "w-1"), 'X');
}

/// A step of [`holds_extensions_and_shrinks_follow_a_plain_model`], with
/// request_ids and change_ids by number, so that they meet.
#[derive(Debug, Clone)]
enum Step {
    Deduct {
        id: usize,
        qty: u64,
    },
    Hold {
        id: usize,
        qty: u64,
    },
    Confirm {
        id: usize,
    },
    Revert {
        id: usize,
    },
    /// To level `level`: ttl_ms 600 s plus a minute a level, so that one
    /// level above another is later whenever it is sent within a minute.
    Extend {
        id: usize,
        change: usize,
        level: u64,
    },
    Shrink {
        id: usize,
        change: usize,
        qty: u64,
    },
}

/// Where a request stands, in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Modelled {
    None,
    Deducted {
        qty: u64,
    },
    Held {
        qty: u64,
        asked: u64,
        level: u64,
        expires: i64,
    },
    Confirmed {
        qty: u64,
        asked: u64,
        expires: i64,
    },
    Gone,
}

fn model_step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let id = 0..3usize;
    let change = 0..4usize;
    prop_oneof![
        1 => (id.clone(), 1u64..4).prop_map(|(id, qty)| Step::Deduct { id, qty }),
        3 => (id.clone(), 1u64..6).prop_map(|(id, qty)| Step::Hold { id, qty }),
        1 => id.clone().prop_map(|id| Step::Confirm { id }),
        1 => id.clone().prop_map(|id| Step::Revert { id }),
        3 => (id.clone(), change.clone(), 0u64..4)
            .prop_map(|(id, change, level)| Step::Extend { id, change, level }),
        3 => (id, change, 1u64..5).prop_map(|(id, change, qty)| Step::Shrink { id, change, qty }),
    ]
}

/// Random sequences of DEDUCT, HOLD, CONFIRM, REVERT, HOLD.EXTEND and
/// HOLD.SHRINK on one SKU, against a plain model of the state machine:
/// every code, every expiry a change answers (a retry's is the one the
/// change set; an extension's is later than the hold's), and after every
/// step the stock and the units held as the model has them, with stock +
/// held + sold always the stock it started with (conservation). No hold
/// runs out within a case (they last at least 600 s).
#[test]
fn holds_extensions_and_shrinks_follow_a_plain_model() {
    use proptest::prelude::*;
    const STOCK: u64 = 12;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = standalone();
    let server = runtime.block_on(proxy(vec![redis.url()], |c| c.sweeper = false));
    let conn = runtime.block_on(client(&server, false));
    let case = std::sync::atomic::AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 48,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in prop::collection::vec(model_step(), 1..40))| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sku = format!("model-{n}");
        let mut direct = redis.node.connection().unwrap();
        set(&mut direct, &stock_key(&sku), STOCK as i64);
        let mut conn = conn.clone();
        let (mut stock, mut held, mut sold) = (STOCK, 0u64, 0u64);
        let mut requests = [Modelled::None; 3];
        // change_id -> (kind, amount, request, expiry it set)
        let mut changes: std::collections::HashMap<usize, (&str, u64, usize, i64)> =
            Default::default();
        for (i, step) in steps.iter().enumerate() {
            let at = format!("step {i} {step:?} of {steps:?}");
            let rid = |id: usize| format!("r{id}");
            match *step {
                Step::Deduct { id, qty } => {
                    let got = parse(runtime.block_on(
                        deduct(&mut conn, &sku, &qty.to_string(), &rid(id), None)).unwrap());
                    let want = match requests[id] {
                        Modelled::None if stock >= qty => {
                            stock -= qty;
                            sold += qty;
                            requests[id] = Modelled::Deducted { qty };
                            0
                        }
                        Modelled::None => 2,
                        Modelled::Deducted { qty: q } => if q == qty { 1 } else { 3 },
                        Modelled::Held { .. } | Modelled::Confirmed { .. } => 3,
                        Modelled::Gone => 4,
                    };
                    prop_assert_eq!(got.code, want, "{}", at);
                }
                Step::Hold { id, qty } => {
                    let got = parse_hold(runtime.block_on(
                        hold(&mut conn, &sku, &qty.to_string(), &rid(id), "600000", None)).unwrap());
                    let want = match requests[id] {
                        Modelled::None if stock >= qty => {
                            stock -= qty;
                            held += qty;
                            requests[id] = Modelled::Held {
                                qty, asked: qty, level: 0, expires: got.expires_at,
                            };
                            0
                        }
                        Modelled::None => 2,
                        Modelled::Held { asked, expires, .. }
                        | Modelled::Confirmed { asked, expires, .. } => {
                            if asked == qty {
                                prop_assert_eq!(got.expires_at, expires, "{}", at);
                                1
                            } else {
                                3
                            }
                        }
                        Modelled::Deducted { .. } => 3,
                        Modelled::Gone => 4,
                    };
                    prop_assert_eq!(got.code, want, "{}", at);
                }
                Step::Confirm { id } => {
                    let got = parse_hold(runtime.block_on(confirm(&mut conn, &sku, &rid(id))).unwrap());
                    let want = match requests[id] {
                        Modelled::None => {
                            requests[id] = Modelled::Gone;
                            4
                        }
                        Modelled::Held { qty, asked, expires, .. } => {
                            held -= qty;
                            sold += qty;
                            requests[id] = Modelled::Confirmed { qty, asked, expires };
                            0
                        }
                        Modelled::Confirmed { .. } => 1,
                        Modelled::Deducted { .. } => 3,
                        Modelled::Gone => 4,
                    };
                    prop_assert_eq!(got.code, want, "{}", at);
                }
                Step::Revert { id } => {
                    let got = parse(runtime.block_on(revert(&mut conn, &sku, &rid(id))).unwrap());
                    let want = match requests[id] {
                        Modelled::None => 4,
                        Modelled::Deducted { qty } | Modelled::Confirmed { qty, .. } => {
                            stock += qty;
                            sold -= qty;
                            0
                        }
                        Modelled::Held { qty, .. } => {
                            stock += qty;
                            held -= qty;
                            0
                        }
                        Modelled::Gone => 1,
                    };
                    requests[id] = Modelled::Gone;
                    prop_assert_eq!(got.code, want, "{}", at);
                }
                Step::Extend { id, change: c, level } => {
                    let ttl = 600_000 + 60_000 * level;
                    let got = runtime.block_on(change(
                        &mut conn, "HOLD.EXTEND", &sku, &rid(id), &format!("c{c}"), &ttl.to_string()));
                    let want = match (changes.get(&c), requests[id]) {
                        (Some(&(kind, amount, of, expires)), _) => {
                            if (kind, amount, of) == ("extend", level, id) {
                                prop_assert_eq!(got.expires_at, expires, "{}", at);
                                1
                            } else {
                                3
                            }
                        }
                        (None, Modelled::Held { qty, asked, level: now, expires }) => {
                            // The same level again is later only when a
                            // millisecond passed since: either answer.
                            let later = level > now || (level == now && got.code == 0);
                            if later {
                                prop_assert!(got.expires_at > expires, "{}", at);
                                requests[id] = Modelled::Held {
                                    qty, asked, level, expires: got.expires_at,
                                };
                                changes.insert(c, ("extend", level, id, got.expires_at));
                                0
                            } else {
                                3
                            }
                        }
                        (None, Modelled::Confirmed { expires, .. }) => {
                            prop_assert_eq!(got.expires_at, expires, "{}", at);
                            1
                        }
                        (None, Modelled::None | Modelled::Deducted { .. }) => 3,
                        (None, Modelled::Gone) => 4,
                    };
                    prop_assert_eq!(got.code, want, "{}", at);
                }
                Step::Shrink { id, change: c, qty: back } => {
                    let got = runtime.block_on(change(
                        &mut conn, "HOLD.SHRINK", &sku, &rid(id), &format!("c{c}"), &back.to_string()));
                    let want = match (changes.get(&c), requests[id]) {
                        (Some(&(kind, amount, of, expires)), _) => {
                            if (kind, amount, of) == ("shrink", back, id) {
                                prop_assert_eq!(got.expires_at, expires, "{}", at);
                                1
                            } else {
                                3
                            }
                        }
                        (None, Modelled::Held { qty, asked, level, expires }) if back < qty => {
                            stock += back;
                            held -= back;
                            requests[id] = Modelled::Held { qty: qty - back, asked, level, expires };
                            changes.insert(c, ("shrink", back, id, expires));
                            prop_assert_eq!(got.expires_at, expires, "{}", at);
                            0
                        }
                        (None, Modelled::Gone) => 4,
                        (None, _) => 3,
                    };
                    prop_assert_eq!(got.code, want, "{}", at);
                }
            }
            let in_redis = (
                get_int(&mut direct, &stock_key(&sku)),
                get_int(&mut direct, &held_key(&sku)).unwrap_or(0),
            );
            prop_assert_eq!(in_redis, (Some(stock as i64), held as i64), "after {}", at);
            prop_assert_eq!(stock + held + sold, STOCK, "conservation after {}", at);
        }
    });
}

/// With the journal on, a shrink's units given back are one `cancel`
/// entry (the event a REVERT of a hold writes), and an extension writes
/// none: the journal's account still adds up to what Redis holds.
#[tokio::test]
async fn a_shrink_is_journaled_as_a_hold_given_back_and_an_extension_is_not() {
    use stockgate::journal::Event;
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    set(&mut direct, &stock_key("jr"), 9);
    let server = proxy(vec![redis.url()], |c| {
        c.sweeper = false;
        c.journal = true;
    })
    .await;
    let mut conn = client(&server, false).await;
    let held = parse_hold(
        hold(&mut conn, "jr", "4", "j-1", "600000", Some("ORD J"))
            .await
            .unwrap(),
    );
    assert_eq!(held.code, 0);
    let longer = change(&mut conn, "HOLD.EXTEND", "jr", "j-1", "e-1", "700000").await;
    assert_eq!(longer.code, 0);
    let smaller = change(&mut conn, "HOLD.SHRINK", "jr", "j-1", "s-1", "3").await;
    assert_eq!((smaller.code, smaller.remain), (0, 8));
    let sku = stockgate::params::Sku::parse("jr".into()).unwrap();
    let raw: Value = redis::cmd("XRANGE")
        .arg(layout().journal_key(&sku))
        .arg("-")
        .arg("+")
        .query(&mut direct)
        .unwrap();
    let entries = stockgate::journal::stream::entries(raw).unwrap();
    let seen: Vec<(Event, &str, i64, i64, i64, i64, &str)> = entries
        .iter()
        .map(|e| {
            let (event, id, order_no) = (e.event, e.id.as_str(), e.order_no.as_str());
            (
                event,
                id,
                e.stock_change,
                e.held_change,
                e.stock,
                e.held,
                order_no,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Event::Hold, "j-1", -4, 4, 5, 4, "ORD J"),
            (Event::Cancel, "j-1", 3, -3, 8, 1, "ORD J"),
        ]
    );
}

/// `--sweeper false` files no hold in the sweep index, whichever call
/// places or moves it (HOLD, HOLD.AT, HOLD.EXTEND): one rule for all. The
/// same calls with the sweeper on do file them, so the check can see a
/// mark when there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_sweeper_no_hold_is_filed_in_the_sweep_index() {
    for sweeper in [true, false] {
        let redis = standalone();
        let server = proxy(vec![redis.url()], |c| {
            c.sweeper = sweeper;
            c.admin_commands = true;
        })
        .await;
        let mut conn = client(&server, false).await;
        let mut direct = redis.node.connection().unwrap();
        set(&mut direct, &stock_key("unswept"), 10);
        let send = |args: &[&str]| redis::cmd(args[0]).arg(&args[1..]).to_owned();
        let mut sent: Vec<Value> = Vec::new();
        for args in [
            &["HOLD", "unswept", "1", "h-1", "600000"][..],
            &["HOLD.EXTEND", "unswept", "h-1", "e-1", "900000"],
            &["STOCK.SET", "unswept-at", "5", "s-1", "AT", "w1"],
            &["HOLD.AT", "unswept-at", "1", "h-2", "600000", "SPLIT", "w1"],
        ] {
            sent.push(send(args).query_async(&mut conn).await.unwrap());
        }
        let codes: Vec<i64> = sent
            .iter()
            .map(|reply| match reply {
                Value::Array(items) => match items[0] {
                    Value::Int(code) => code,
                    _ => panic!("{reply:?}"),
                },
                _ => panic!("{reply:?}"),
            })
            .collect();
        assert_eq!(codes, [0, 0, 0, 0], "{sent:?}");
        let filed = |direct: &mut redis::Connection| -> Vec<String> {
            redis::cmd("KEYS").arg("*sweep*").query(direct).unwrap()
        };
        if sweeper {
            loop_until_async(Duration::from_secs(10), || {
                let keys = filed(&mut direct);
                async move { (!keys.is_empty()).then_some(()) }
            })
            .await;
        } else {
            // The marks are sent beside the calls, not awaited: a moment
            // for any that would come.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(filed(&mut direct), Vec::<String>::new());
        }
    }
}

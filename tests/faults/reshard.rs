//! Fault 3: live resharding of busy skus' slots under load.
//!
//! While a slot moves, a new request's idempotency record does not exist
//! anywhere yet, so the source answers TRYAGAIN (some of the script's keys
//! here, some not) or ASK (none here), and the target answers TRYAGAIN to
//! an ASKING script whose record is missing, until the move finishes. The
//! cluster client retries all of them within `--timeout`; the script never
//! runs on a node holding only part of its keys. The added latency is
//! measured and printed, not asserted. A linearizability lane
//! ([`crate::linear`]) on skus that share the moving slots is checked
//! whole: migration moves each key whole and loses nothing.

use crate::checker::{Attempt, History, Outcome, Policy};
use crate::harness::*;
use std::time::{Duration, Instant};

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn live_resharding_of_busy_slots }
async fn live_resharding_of_busy_slots(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("reshard-{kind}");
    let cluster = cluster_of(kind, 2000, &[]);
    let (source, target) = (0, 1);
    let (fault, rest) = lanes(&cluster, &name, source);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    // The database as the third book: a sink moving the journals through
    // the moves (its reads meet ASK and MOVED too), killed and restarted,
    // and the database restarted, before the first slot moves.
    let mut books = crate::books::Books::start(&cluster, &name, kind);
    let (rounds, batch, pace) = if long_faults() {
        (fault.skus.len(), 10, Duration::from_millis(50))
    } else {
        (4, 20, Duration::from_millis(20))
    };
    // The linearizability lane: one sku in each slot that moves, so its
    // keys move with the busy sku's (no extra rounds). Slot migration
    // moves each key whole and loses nothing, so no --wait-replicas
    // (unless STOCKGATE_FAULT_WAIT asks) and the whole history is checked.
    let lin_skus = fault
        .skus
        .iter()
        .take(rounds)
        .map(|sku| sku_in_slot(&format!("lin-{name}"), sku_slot(sku)))
        .collect();
    let lane = crate::linear::start(&cluster, &name, lin_skus, fault.seed, wait_from_env()).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    books.upset(Duration::from_millis(300)).await;

    let counters = |node: usize| {
        (
            error_stat(&cluster.nodes[node], "ASK"),
            error_stat(&cluster.nodes[node], "TRYAGAIN"),
            error_stat(&cluster.nodes[node], "MOVED"),
        )
    };
    let (src_before, dst_before) = (counters(source), counters(target));
    // Move the busy skus' slots one at a time, each while its sku is loaded.
    let mut moves = Vec::new();
    for sku in fault.skus.iter().take(rounds) {
        let slot = sku_slot(sku);
        let started = Instant::now();
        let (took, keys) =
            migrate_slot(&cluster, slot, source, target, batch, pace, Duration::ZERO);
        moves.push((sku.clone(), slot, started, started + took, keys));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let moved = moves.last().expect("a slot moved").3;
    lane.run_past(moved).await;
    let lane = lane.stop().await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    let (src_after, dst_after) = (counters(source), counters(target));
    eprintln!(
        "[{name}] source :{} answered ASK {}, TRYAGAIN {}, MOVED {}; target :{} answered TRYAGAIN {}, MOVED {}",
        cluster.nodes[source].port,
        src_after.0 - src_before.0,
        src_after.1 - src_before.1,
        src_after.2 - src_before.2,
        cluster.nodes[target].port,
        dst_after.1 - dst_before.1,
        dst_after.2 - dst_before.2,
    );
    let first_move = moves[0].2;
    for (sku, slot, from, to, keys) in &moves {
        let on = |a: &&Attempt| fault_history.sku_name(a.sku) == sku;
        let before: Vec<&Attempt> = fault_history
            .attempts
            .iter()
            .filter(on)
            .filter(|a| a.ended() < first_move)
            .collect();
        let during: Vec<&Attempt> = fault_history
            .attempts
            .iter()
            .filter(on)
            .filter(|a| a.ended() >= *from && a.started <= *to)
            .collect();
        let after: Vec<&Attempt> = fault_history
            .attempts
            .iter()
            .filter(on)
            .filter(|a| a.started > *to)
            .collect();
        eprintln!(
            "[{name}] {sku} slot {slot}: {keys} keys moved in {}; latency before {} | while moving {} {:?} | after {}",
            ms(*to - *from),
            fault_history.latency(before.into_iter()),
            fault_history.latency(during.iter().copied()),
            fault_history.by_label(during.iter().copied()),
            fault_history.latency(after.into_iter()),
        );
        assert_eq!(
            owner(&cluster, *slot),
            target,
            "slot {slot} now served by the target"
        );
    }
    let moving = |h: &History| {
        h.latency(
            h.attempts
                .iter()
                .filter(|a| a.started >= first_move && a.started <= moves.last().unwrap().3),
        )
    };
    eprintln!(
        "[{name}] while slots moved, other skus of the source: {}; other primaries: {}",
        moving(&fault_history),
        moving(&rest_history)
    );
    let database = books.drain().await;
    fault_history
        .audit_with_database(&cluster, Policy::default(), &database)
        .assert_green();
    rest_history
        .audit_with_database(&cluster, Policy::default(), &database)
        .assert_green();
    server.stop_now();
    // The lane's skus share the moving slots, one each, in move order.
    let met: Vec<usize> = moves
        .iter()
        .zip(&lane.skus)
        .map(|((_, _, from, to, _), sku)| lane.overlapping(*from, *to, Some(sku)))
        .collect();
    eprintln!("[{name}] the lane's requests in flight while their sku's slot moved: {met:?}");
    lane.assert_linearizable(&lane.history, first_move, moved, (0, ""));
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_slot_move_shorter_than_the_deadline_surfaces_no_error }
/// A slot move shorter than `--timeout` must cost latency, not errors: the
/// deadline, "redirects and retries included", decides when to give up,
/// not the count of ASK and TRYAGAIN hops on the way.
async fn a_slot_move_shorter_than_the_deadline_surfaces_no_error(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("shortmove-{kind}");
    let cluster = cluster_of(kind, 2000, &[]);
    let (source, target) = (0, 1);
    let timeout = Duration::from_secs(2);
    let skus = skus_where(&cluster, &name, 1, |o| o == source);
    let mut load = crate::checker::Workload::new(&name, skus.clone(), timeout);
    load.clients = 8;
    load.seed(&cluster);
    let server = stockgate(cluster.seeds(), timeout).await;
    let running = load.start(server.addr).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hold = Duration::from_millis(600);
    let started = Instant::now();
    let (took, keys) = migrate_slot(
        &cluster,
        sku_slot(&skus[0]),
        source,
        target,
        1000,
        Duration::ZERO,
        hold,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let history = running.stop().await;
    let during: Vec<&Attempt> = history
        .attempts
        .iter()
        .filter(|a| a.ended() >= started && a.started <= started + took)
        .collect();
    eprintln!(
        "[{name}] {keys} keys, slot in migration for {} (--timeout {}); requests meanwhile: {} {:?}",
        ms(took),
        ms(timeout),
        history.latency(during.iter().copied()),
        history.by_label(during.iter().copied()),
    );
    history.audit(&cluster, Policy::default()).assert_green();
    assert_eq!(
        history
            .attempts
            .iter()
            .filter(|a| !a.outcome.is_code())
            .count(),
        0,
        "errors while the slot moved: {}",
        history.error_spans(started)
    );
    server.stop_now();
}

/// A request that meets 61 redirects or TRYAGAINs must still end as an
/// `-UPSTREAM` error by `--timeout`, and must not take the redis crate's
/// cluster connection down with it.
///
/// It once didn't, in debug builds (every `cargo test`): redis 1.8.1
/// computes a retry's backoff as `exponent_base.pow(retry) * factor` in
/// u64 (`RetryParams::wait_time_for_retry`), for every error reply a
/// request gets, the one after its last retry included. With
/// `retry_wait_formula(8, 2)` and 60 or more retries (`--timeout` 1400ms
/// and up) the 61st error computed 8 * 2^61 = 2^64: "attempt to multiply
/// with overflow", a panic in the task that drives the cluster connection,
/// and every request through the redis crate then failed as `redis
/// unreachable` until the health loop replaced it. `cluster_retries` now
/// caps the retries at 59 (src/upstream/connect.rs).
///
/// Here the slot stays in migration with its keys on the target, so the
/// DEDUCT goes ASK, TRYAGAIN, TRYAGAIN, ... and reaches its 61st error
/// after about 3 s of a 5 s deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_one_retries_leave_the_cluster_connection_working() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster(2000, &[]);
    let (source, target) = (0, 1);
    let timeout = Duration::from_secs(5);
    let skus = skus_where(&cluster, "stuck", 1, |o| o == source);
    let others = skus_where(&cluster, "elsewhere", 1, |o| o == 2);
    seed(&cluster, &skus, 1000);
    seed(&cluster, &others, 1000);
    let server = stockgate(cluster.seeds(), timeout).await;
    let mut conn = crate::support::client(&server, false).await;
    // The slot stays in migration with its keys on the target: the source
    // answers ASK, the target TRYAGAIN (a new request's record is missing),
    // again and again until the deadline.
    let slot = sku_slot(&skus[0]);
    let (src_id, dst_id) = (
        node_id(&cluster.nodes[source]),
        node_id(&cluster.nodes[target]),
    );
    let setslot = |node: usize, how: &str, id: &str| {
        let reply = text(
            &cluster.nodes[node],
            &["CLUSTER", "SETSLOT", &slot.to_string(), how, id],
        );
        assert_eq!(reply.as_deref(), Some("OK"), "SETSLOT {how} on {node}");
    };
    setslot(target, "IMPORTING", &src_id);
    setslot(source, "MIGRATING", &dst_id);
    let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut cluster.nodes[source].connection().unwrap())
        .unwrap();
    redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(cluster.nodes[target].port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&keys)
        .query::<()>(&mut cluster.nodes[source].connection().unwrap())
        .unwrap();

    let sent = Instant::now();
    let stuck = crate::support::deduct(&mut conn, &skus[0], "1", "stuck-1", None)
        .await
        .expect_err("the slot never settles, so the DEDUCT cannot succeed");
    eprintln!(
        "[stuck] the stuck DEDUCT answered after {}: {stuck}",
        ms(sent.elapsed())
    );
    // Whatever the stuck request ran into, the connection must still serve
    // a slot that is not moving, through the redis crate (STOCK.GET).
    let elsewhere: redis::RedisResult<Option<i64>> = redis::cmd("STOCK.GET")
        .arg(&others[0])
        .query_async(&mut conn)
        .await;
    // Settle the slot again before asserting, so a failure leaves a clean cluster.
    setslot(target, "NODE", &dst_id);
    setslot(source, "NODE", &dst_id);
    assert!(
        stuck.to_string().contains("TRYAGAIN") || stuck.to_string().contains("no reply"),
        "the stuck DEDUCT ends as TRYAGAIN or a timeout, got {stuck}"
    );
    assert_eq!(
        elsewhere.map_err(|e| e.to_string()),
        Ok(Some(1000)),
        "a STOCK.GET on another primary right after the stuck DEDUCT"
    );
    server.stop_now();
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_slot_migrating_mid_order }
/// One line's slot migrates while a load of orders runs, each over 2–3
/// skus, one per primary, most of them naming the moving one. The line
/// calls and the intent's compare-and-sets meet ASK and TRYAGAIN mid-saga;
/// every order must end whole or not at all, and the books add up. An
/// `-UPSTREAM` error is allowed only as a retryable fault that the retry,
/// with the same request_id, then resolves; or, for the half of the
/// orders whose caller never retries, as one that leaves the order to
/// stockgate, which must end it on its own.
async fn a_slot_migrating_mid_order(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("ordermove-{kind}");
    let cluster = cluster_of(kind, 2000, &[]);
    let (source, target) = (0, 1);
    let skus = skus_on_every_primary(&cluster, &name, 1);
    let moving = skus
        .iter()
        .position(|s| owner(&cluster, sku_slot(s)) == source)
        .expect("a sku on the source");
    let slot = sku_slot(&skus[moving]);
    let mut load = crate::checker::Workload::new(&name, skus.clone(), TIMEOUT);
    (load.order_pct, load.unretried_pct) = (100, 50);
    load.clients = 8;
    load.seed(&cluster);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let running = load.start(server.addr).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let redirects = || {
        error_stat(&cluster.nodes[source], "ASK")
            + error_stat(&cluster.nodes[source], "TRYAGAIN")
            + error_stat(&cluster.nodes[target], "TRYAGAIN")
    };
    let redirects_before = redirects();
    let from = Instant::now();
    // The slot stays in migration a while after its keys moved, past
    // --timeout: a line call on it meets TRYAGAIN until the move ends, so
    // some sagas stop half way, their other lines held on the other
    // primaries. Retried orders resume then; the others are left to
    // stockgate's recovery (the audit waits for it, so stockgate runs
    // until the audit is done).
    let (took, keys) = migrate_slot(
        &cluster,
        slot,
        source,
        target,
        10,
        Duration::from_millis(30),
        Duration::from_millis(2000),
    );
    let to = from + took;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let history = running.stop().await;

    assert_eq!(owner(&cluster, slot), target, "slot {slot} moved");
    let during: Vec<&Attempt> = history
        .attempts
        .iter()
        .filter(|a| a.lines.iter().any(|(sku, _)| *sku == moving))
        .filter(|a| a.ended() >= from && a.started <= to)
        .collect();
    eprintln!(
        "[{name}] {} slot {slot}: {keys} keys moved in {}, {} ASK and TRYAGAIN answered; orders naming it while it moved: {} {:?}",
        skus[moving],
        ms(took),
        redirects() - redirects_before,
        history.latency(during.iter().copied()),
        history.by_label(during.iter().copied()),
    );
    assert!(
        during.iter().any(|a| a.outcome.is_code()),
        "orders naming {} were answered while its slot moved",
        skus[moving]
    );
    for a in history.attempts.iter().filter(|a| !a.outcome.is_code()) {
        assert!(
            matches!(&a.outcome, Outcome::Fault { word, .. } if word == "UPSTREAM"),
            "{:?} {} got {:?}: only -UPSTREAM may come back",
            a.op,
            a.id,
            a.outcome
        );
        assert!(
            history.left.iter().any(|l| l.id == a.id)
                || history.attempts.iter().any(|b| b.id == a.id
                    && b.op == a.op
                    && b.started > a.started
                    && b.outcome.is_code()),
            "{:?} {} got {:?}, and no retry of it a business code",
            a.op,
            a.id,
            a.outcome
        );
    }
    let audit = history.audit(&cluster, Policy::default());
    audit.assert_green();
    assert!(
        audit.orders_applied > 0 && audit.orders_undone > 0,
        "orders ended applied and undone: {}",
        audit.summary()
    );
    eprintln!(
        "[{name}] orders left behind that recovery ended: {}",
        crate::support::metric(
            &server,
            "stockgate_order_recoveries_total{result=\"ended\"}"
        ),
    );
    server.stop_now();
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_confirm_meeting_its_moved_journal_waits_for_the_move }
/// A slot in migration whose SKU's journal moved first. A CONFIRM declares
/// the journal with the SKU's other keys, so the source answers TRYAGAIN
/// before anything runs (some of its keys here, some not), and stockgate
/// asks again until the target answers once the move ends. When the
/// journal was not declared, Redis let the script run and refused its
/// access to the journal as "non local key", which came back as
/// `-BADREPLY` (the slot migrating mid-order met it on Redis 8.2).
async fn a_confirm_meeting_its_moved_journal_waits_for_the_move(kind: ServerKind) {
    a_call_meeting_its_moved_journal(kind, "journalmove", CallOnTheHold::Confirm).await;
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_shrink_meeting_its_moved_journal_gives_the_units_back_once }
/// The same for a HOLD.SHRINK (journaled): it waits for the move and gives
/// its units back once, on the target. Its change record is new, a key
/// missing on both nodes until the move ends, so the call waits whether or
/// not the journal is declared (with it left out, this passes too). The
/// journal is declared all the same: a change_id sent again finds its
/// record and runs, and first gives the SKU's expired holds back, with
/// their journal entries.
async fn a_shrink_meeting_its_moved_journal_gives_the_units_back_once(kind: ServerKind) {
    a_call_meeting_its_moved_journal(kind, "shrinkmove", CallOnTheHold::Shrink).await;
}

/// What is sent on hold h1 (3 units) while its slot's journal has moved.
#[derive(Clone, Copy, PartialEq, Debug)]
enum CallOnTheHold {
    /// CONFIRM h1.
    Confirm,
    /// HOLD.SHRINK h1 by 2 units.
    Shrink,
}

impl CallOnTheHold {
    async fn send(
        self,
        client: &mut redis::aio::MultiplexedConnection,
        sku: &str,
    ) -> redis::RedisResult<redis::Value> {
        match self {
            CallOnTheHold::Confirm => crate::support::confirm(client, sku, "h1").await,
            CallOnTheHold::Shrink => {
                redis::cmd("HOLD.SHRINK")
                    .arg(sku)
                    .arg("h1")
                    .arg("s1")
                    .arg("2")
                    .query_async(client)
                    .await
            }
        }
    }
}

/// A SKU with 100 units and a hold h1 of 3; its slot starts moving, the
/// journal first, and `call` is sent on h1: refused by the source until
/// the move ends, then answered 0 by the target, with the stock, the units
/// held and the journal's entries (each once) as one call made them.
async fn a_call_meeting_its_moved_journal(kind: ServerKind, test: &str, call: CallOnTheHold) {
    let _serial = SERIAL.lock().await;
    let mut moving = MovingSku::start(kind, test).await;
    let (sku, slot) = (moving.sku.clone(), moving.slot);
    let held = crate::support::hold(&mut moving.client, &sku, "3", "h1", "600000", None)
        .await
        .expect("HOLD");
    assert_eq!(crate::support::parse_hold(held).code, 0, "held");

    // The slot starts moving, the journal first.
    let (mut src, mut dst) = moving.begin();
    moving.migrate(&mut src, std::slice::from_ref(&moving.journal));

    let refusals = || moving.refusals(&[MovingSku::SOURCE]);
    let refused_before = refusals();
    let sending = {
        let (mut client, sku) = (moving.client.clone(), sku.clone());
        tokio::spawn(async move { call.send(&mut client, &sku).await })
    };
    // Until the source has refused the call at least once.
    let waited = Instant::now();
    while refusals() == refused_before {
        assert!(
            waited.elapsed() < Duration::from_secs(8) && !sending.is_finished(),
            "the {call:?}'s script was never refused its moved journal"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    moving.end();
    let answered = sending
        .await
        .expect("the call's task")
        .unwrap_or_else(|e| panic!("{call:?} answered, not a fault: {e}"));
    assert_eq!(crate::support::parse_hold(answered).code, 0, "{call:?}");
    assert_eq!(
        owner(&moving.cluster, slot),
        MovingSku::TARGET,
        "slot {slot} moved"
    );

    // The books on the target: a CONFIRM keeps the 3 units taken and holds
    // none; a shrink gave 2 back, once, and holds 1.
    use stockgate::journal::Event;
    let (after, last_entry) = match call {
        CallOnTheHold::Confirm => ((97, 0), (Event::Confirm, 0, -3)),
        CallOnTheHold::Shrink => ((99, 1), (Event::Cancel, 2, -2)),
    };
    assert_eq!(
        moving.stock_and_held(&mut dst),
        after,
        "{sku}: stock and held units"
    );
    let entries: Vec<_> = moving
        .journal_on(&mut dst)
        .into_iter()
        .map(|e| (e.event, e.id, e.stock_change, e.held_change))
        .collect();
    let (event, stock_change, held_change) = last_entry;
    assert_eq!(
        entries,
        [
            (Event::Hold, "h1".to_owned(), -3, 3),
            (event, "h1".to_owned(), stock_change, held_change)
        ],
        "{sku}: the journal"
    );
    moving.server.stop_now();
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_release_meeting_its_moved_journal_gives_the_units_back_once }
/// A slot in migration whose SKU's journal moved first, and a hold that
/// expires meanwhile. Whoever releases it (the sweeper, or the CONFIRM of
/// another hold, which releases the SKU's expired holds first) must run
/// whole or not at all: with the journal undeclared, the release gave its
/// units back before its journal entry was refused, stayed in the holds
/// set and gave them back again once the move ended.
async fn a_release_meeting_its_moved_journal_gives_the_units_back_once(kind: ServerKind) {
    expiry_during_a_move(kind, "releasemove", FirstMoved::Journal).await;
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_release_before_its_hold_record_moved_keeps_the_hold }
/// A slot in migration whose keys all moved but an expired hold's record.
/// The CONFIRM of another hold finds every key it declares on the target,
/// which runs it (ASK, then ASKING) and reads the expired hold's record,
/// a key no call declares, as missing (on all four servers: a read of one
/// key, which ASKING lets through), and the release took the hold for one
/// whose record had expired long ago and dropped it, its units held for
/// good. The hold must stay, and go back to stock once its record is
/// there.
async fn a_release_before_its_hold_record_moved_keeps_the_hold(kind: ServerKind) {
    expiry_during_a_move(kind, "recordmove", FirstMoved::AllButTheHold).await;
}

/// Which of the slot's keys move before the hold expires.
#[derive(Clone, Copy, PartialEq)]
enum FirstMoved {
    /// The SKU's journal.
    Journal,
    /// Every key but the expiring hold's record.
    AllButTheHold,
}

/// A SKU with 100 units, a hold h1 of 3 that expires while its slot moves
/// (`first` moved before it does), and a hold h2 of 5 confirmed meanwhile:
/// once the move ends and a STOCK.GET released what was due, 92 units,
/// none held, and the journal's entries each once.
async fn expiry_during_a_move(kind: ServerKind, test: &str, first: FirstMoved) {
    let _serial = SERIAL.lock().await;
    let mut moving = MovingSku::start(kind, test).await;
    let (sku, slot) = (moving.sku.clone(), moving.slot);
    for (id, qty, ttl_ms) in [("h1", "3", "1000"), ("h2", "5", "600000")] {
        let held = crate::support::hold(&mut moving.client, &sku, qty, id, ttl_ms, None)
            .await
            .expect("HOLD");
        assert_eq!(crate::support::parse_hold(held).code, 0, "{id} held");
    }

    // The slot starts moving, before h1 expires.
    let (mut src, mut dst) = moving.begin();
    let h1_record = [moving.stock_key.as_slice(), b":req:h1"].concat();
    let first_keys: Vec<Vec<u8>> = match first {
        FirstMoved::Journal => vec![moving.journal.clone()],
        FirstMoved::AllButTheHold => {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut src)
                .expect("GETKEYSINSLOT");
            keys.into_iter().filter(|k| *k != h1_record).collect()
        }
    };
    let due: f64 = redis::cmd("ZSCORE")
        .arg([moving.stock_key.as_slice(), b":holds"].concat())
        .arg("h1")
        .query(&mut src)
        .expect("h1's expiry");
    moving.migrate(&mut src, &first_keys);
    // Until h1 is due by Redis's clock.
    loop {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut src).expect("TIME");
        if (secs * 1000 + micros / 1000) as f64 > due {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The CONFIRM of h2, which releases h1 first, on whichever node runs
    // it: the rest of the slot stays where it is until a node has refused
    // it or it was answered, and the sweeper has had its turn.
    let refusals = || moving.refusals(&[MovingSku::SOURCE, MovingSku::TARGET]);
    let refused_before = refusals();
    let confirming = {
        let (mut client, sku) = (moving.client.clone(), sku.clone());
        tokio::spawn(async move { crate::support::confirm(&mut client, &sku, "h2").await })
    };
    let waited = Instant::now();
    while refusals() == refused_before && !confirming.is_finished() {
        assert!(
            waited.elapsed() < Duration::from_secs(8),
            "the CONFIRM was neither refused nor answered"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    moving.end();
    let confirmed = confirming
        .await
        .expect("the CONFIRM's task")
        .expect("CONFIRM answered, not a fault");
    assert_eq!(
        crate::support::parse_hold(confirmed).code,
        0,
        "h2 confirmed"
    );
    assert_eq!(
        owner(&moving.cluster, slot),
        MovingSku::TARGET,
        "slot {slot} moved"
    );
    // A read releases what is due, as every call on the SKU does.
    redis::cmd("STOCK.GET")
        .arg(&sku)
        .query_async::<redis::Value>(&mut moving.client)
        .await
        .expect("STOCK.GET");

    // 100 - 3 (h1, given back) - 5 (h2, confirmed): h1's units came back,
    // once.
    assert_eq!(
        moving.stock_and_held(&mut dst),
        (95, 0),
        "{sku}: stock and held units"
    );
    use stockgate::journal::Event;
    let mut events: Vec<_> = moving
        .journal_on(&mut dst)
        .iter()
        .map(|e| (e.event.name(), e.id.clone()))
        .collect();
    // The CONFIRM may have run before the release (the hold's record away).
    events.sort();
    let mut expected = [
        (Event::Hold.name(), "h1".to_owned()),
        (Event::Hold.name(), "h2".to_owned()),
        (Event::Expire.name(), "h1".to_owned()),
        (Event::Confirm.name(), "h2".to_owned()),
    ];
    expected.sort();
    assert_eq!(events, expected, "{sku}: the journal");
    moving.server.stop_now();
}

/// What the tests of a slot moving under a SKU's calls start from: a
/// two-primary cluster, a SKU of 100 units on its first primary (the
/// source), a stockgate and a client of it.
struct MovingSku {
    cluster: stockgate::dev::LocalCluster,
    sku: String,
    slot: u16,
    stock_key: Vec<u8>,
    journal: Vec<u8>,
    server: stockgate::server::Server,
    client: redis::aio::MultiplexedConnection,
}

impl MovingSku {
    const SOURCE: usize = 0;
    const TARGET: usize = 1;

    async fn start(kind: ServerKind, test: &str) -> MovingSku {
        let name = format!("{test}-{kind}");
        let cluster = cluster_of(kind, 2000, &[]);
        let sku = skus_on_every_primary(&cluster, &name, 1)
            .into_iter()
            .find(|s| owner(&cluster, sku_slot(s)) == Self::SOURCE)
            .expect("a sku on the source");
        let stock_key = crate::support::stock_key(&sku);
        let mut direct = cluster.cluster_connection().expect("cluster connection");
        redis::cmd("SET")
            .arg(&stock_key)
            .arg(100)
            .query::<()>(&mut direct)
            .expect("seed the stock");
        let server = stockgate(cluster.seeds(), Duration::from_secs(10)).await;
        let client = crate::support::client(&server, false).await;
        let journal = crate::support::layout()
            .journal_key(&stockgate::params::Sku::parse(sku.clone().into()).expect("a sku"));
        MovingSku {
            slot: sku_slot(&sku),
            cluster,
            sku,
            stock_key,
            journal,
            server,
            client,
        }
    }

    /// The slot starts moving: connections to the source and the target.
    fn begin(&self) -> (redis::Connection, redis::Connection) {
        begin_migration(&self.cluster, self.slot, Self::SOURCE, Self::TARGET)
    }

    /// Moves `keys` of the slot to the target.
    fn migrate(&self, src: &mut redis::Connection, keys: &[Vec<u8>]) {
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.cluster.nodes[Self::TARGET].port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query::<()>(src)
            .expect("MIGRATE");
    }

    /// The rest of the slot moves, and the move ends.
    fn end(&self) {
        migrate_slot(
            &self.cluster,
            self.slot,
            Self::SOURCE,
            Self::TARGET,
            100,
            Duration::ZERO,
            Duration::ZERO,
        );
    }

    /// Calls the `nodes` refused so far (ERR and TRYAGAIN).
    fn refusals(&self, nodes: &[usize]) -> u64 {
        nodes
            .iter()
            .map(|&n| {
                let node = &self.cluster.nodes[n];
                error_stat(node, "ERR") + error_stat(node, "TRYAGAIN")
            })
            .sum()
    }

    /// The SKU's stock and units held, as a node has them.
    fn stock_and_held(&self, node: &mut redis::Connection) -> (i64, i64) {
        let (stock, held): (i64, Option<i64>) = redis::pipe()
            .cmd("GET")
            .arg(&self.stock_key)
            .cmd("GET")
            .arg([self.stock_key.as_slice(), b":held"].concat())
            .query(node)
            .expect("the stock");
        (stock, held.unwrap_or(0))
    }

    /// The SKU's journal, as a node has it.
    fn journal_on(&self, node: &mut redis::Connection) -> Vec<stockgate::journal::Entry> {
        let raw: redis::Value = redis::cmd("XRANGE")
            .arg(&self.journal)
            .arg("-")
            .arg("+")
            .query(node)
            .expect("XRANGE");
        stockgate::journal::stream::entries(raw).expect("entries")
    }
}

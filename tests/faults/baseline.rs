//! The checker itself, on each server of the upstream matrix: a load with
//! no fault (holds and orders among its chains, some of the orders with a
//! caller that never retries) must audit green with nothing but business
//! codes, and violations planted behind stockgate's back must each be
//! found.
//!
//! The audit reads the servers directly (SCAN on every primary, GET, PTTL,
//! CLUSTER NODES for slot ownership), so this is what shows that it reads
//! Valkey as faithfully as Redis: a checker that read nothing would pass
//! every fault test.

use crate::checker::{Attempt, Left, Op, Outcome, Policy, Workload};
use crate::harness::*;
use std::time::Duration;

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_quiet_load_audits_green_and_planted_violations_are_caught }
async fn a_quiet_load_audits_green_and_planted_violations_are_caught(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("quiet-{kind}");
    let cluster = cluster_of(kind, 2000, &[]);
    let skus = skus_on_every_primary(&cluster, &name, 2);
    let mut load = Workload::new(&name, skus.clone(), TIMEOUT)
        .with_holds()
        .with_orders();
    load.clients = 8;
    load.seed(&cluster);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    // The database as the third book, kept by a sink through the load.
    let mut books = crate::books::Books::start(&cluster, &name, kind);
    let running = load.start(server.addr).await;
    // Long enough for short holds (1–3 s) to run out, and for CONFIRMs
    // sent around their expiry to come back 5.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let mut history = running.stop().await;
    server.stop_now();

    let database = books.drain().await;
    let audit = history.audit_with_database(&cluster, Policy::default(), &database);
    audit.assert_green();
    let faults: Vec<_> = audit
        .by_label
        .iter()
        .filter(|(label, _)| !label.starts_with("code"))
        .collect();
    assert!(faults.is_empty(), "no fault, yet errors: {faults:?}");
    assert!(
        audit.units_recorded > 0 && audit.units_recorded == audit.units_taken,
        "the load deducted, and the audit accounted for it: {}",
        audit.summary()
    );
    assert!(
        audit.units_held > 0
            && audit.units_confirmed > 0
            && audit.holds_expired > 0
            && audit.by_label.contains_key("code 5"),
        "the load held, confirmed, and saw holds run out (a CONFIRM too late): {}",
        audit.summary()
    );

    assert!(
        audit.orders_applied > 0 && audit.orders_undone > 0,
        "the load's orders ended applied and undone: {}",
        audit.summary()
    );

    // Seven violations behind stockgate's back, one of each kind the audit
    // reads from the servers, and two in the database.
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    // 1,000 units, more than the lines given back behind the scripts' back
    // below (at most 5 each) can make up: had it been 1, an ORDER line of
    // 1 unit put back on the same sku cancelled it, and the journal's
    // account ended where Redis did (a CI run failed so).
    redis::cmd("DECRBY")
        .arg(crate::support::stock_key(&skus[0]))
        .arg(1000)
        .query::<()>(&mut conn)
        .expect("DECRBY");
    let forged = crate::support::record_key(&skus[1], "never-sent");
    redis::cmd("SET")
        .arg(&forged)
        .arg("D:1:x")
        .arg("PX")
        .arg(600_000)
        .query::<()>(&mut conn)
        .expect("SET a forged record");
    let applied = history
        .attempts
        .iter()
        .find(|a| a.op == Op::Deduct && matches!(a.outcome, Outcome::Code { code: 0, .. }))
        .expect("a DEDUCT answered 0");
    let (sku, id) = (
        history.sku_name(applied.sku).to_owned(),
        applied.id.to_string(),
    );
    let persisted: i64 = redis::cmd("PERSIST")
        .arg(crate::support::record_key(&sku, &id))
        .query(&mut conn)
        .expect("PERSIST");
    assert_eq!(persisted, 1, "the record of {sku} {id} had a TTL to remove");
    // A long hold nobody confirmed or reverted is still HELD: drop it from
    // its sku's holds set, as a lost write would.
    let placed = history
        .attempts
        .iter()
        .filter(|a| a.op == Op::Hold && a.ttl_ms > 60_000)
        .filter(|a| matches!(a.outcome, Outcome::Code { code: 0, .. }))
        .find(|a| {
            history
                .attempts
                .iter()
                .all(|b| b.id != a.id || b.op == Op::Hold)
        })
        .expect("a long hold left alone");
    let (held_sku, held_id) = (
        history.sku_name(placed.sku).to_owned(),
        placed.id.to_string(),
    );
    let mut holds_key = crate::support::stock_key(&held_sku);
    holds_key.extend_from_slice(b":holds");
    let removed: i64 = redis::cmd("ZREM")
        .arg(&holds_key)
        .arg(&held_id)
        .query(&mut conn)
        .expect("ZREM");
    assert_eq!(removed, 1, "{held_sku} {held_id} was in its holds set");

    // An ORDER applied and left alone, half given back: one line's record
    // REVERTED and its units back in stock, so that the books still add
    // up and only all-or-nothing is broken.
    let ordered = history
        .attempts
        .iter()
        .filter(|a| a.op == Op::Order && matches!(a.outcome, Outcome::Code { code: 0, .. }))
        .find(|a| {
            history
                .attempts
                .iter()
                .all(|b| b.id != a.id || b.op == Op::Order)
        })
        .expect("an ORDER applied and left alone");
    let (line_sku, line_qty) = (history.sku_name(ordered.lines[0].0), ordered.lines[0].1);
    let reverted_line_sku = line_sku.to_owned();
    let line_key = crate::support::record_key(line_sku, &format!("~ord:{}", ordered.id));
    let raw: String = redis::cmd("GET")
        .arg(&line_key)
        .query(&mut conn)
        .expect("GET a line record");
    let line = stockgate::record::Record::parse(&raw).expect("a line record");
    // An ORDER's lines are taken with DEDUCT.
    assert_eq!(line.state, stockgate::record::State::Deducted, "{raw}");
    redis::cmd("SET")
        .arg(&line_key)
        .arg(format!(
            "3:R:{}:{}::{}",
            line.qty, line.nonce, line.order_no
        ))
        .arg("KEEPTTL")
        .query::<()>(&mut conn)
        .expect("SET the line REVERTED");
    redis::cmd("INCRBY")
        .arg(crate::support::stock_key(line_sku))
        .arg(line_qty)
        .query::<()>(&mut conn)
        .expect("INCRBY");
    // And its intent record made to last for ever.
    let persisted: i64 = redis::cmd("PERSIST")
        .arg(format!("stock:{{order:{}}}:intent", ordered.id))
        .query(&mut conn)
        .expect("PERSIST");
    assert_eq!(persisted, 1, "the intent of {} had a TTL", ordered.id);
    let ordered_id = ordered.id.clone();

    // Another ORDER applied and left alone, played as one whose caller
    // never retried: its one attempt failed (so the history says), and
    // its saga stopped half way through HOLDING, its first line taken and
    // the second not yet, filed nowhere among the orders in flight, so no
    // recovery will ever end it. The books still add up (the second
    // line's units are back in stock, with no record): only "ended on its
    // own" is broken.
    let (at, unfinished) = history
        .attempts
        .iter()
        .enumerate()
        .filter(|(_, a)| a.op == Op::Order && a.id != ordered_id)
        .filter(|(_, a)| matches!(a.outcome, Outcome::Code { code: 0, .. }))
        // Sent once: a retry of it would still say it applied (the load
        // sends some requests twice on purpose), and the audit would rightly
        // count that as one more violation than the one planted here.
        .find(|(_, a)| history.attempts.iter().filter(|b| b.id == a.id).count() == 1)
        .map(|(at, a)| (at, a.clone()))
        .expect("another ORDER applied, sent once and left alone");
    history.attempts[at].outcome = Outcome::Fault {
        word: "UPSTREAM".into(),
        text: "no reply from redis within 1000 ms (planted)".into(),
    };
    history.left.push(Left {
        op: Op::Order,
        id: unfinished.id.clone(),
        at: unfinished.ended(),
    });
    redis::cmd("HSET")
        .arg(format!("stock:{{order:{}}}:intent", unfinished.id))
        .arg("p")
        .arg("HOLDING")
        .query::<()>(&mut conn)
        .expect("HSET the intent HOLDING");
    redis::cmd("ZREM")
        .arg(crate::checker::orders_in_flight_key(&unfinished.id))
        .arg(&*unfinished.id)
        .query::<()>(&mut conn)
        .expect("ZREM from the orders in flight");
    let (untaken, untaken_qty) = unfinished.lines[1];
    let untaken = history.sku_name(untaken).to_owned();
    let line_key = crate::support::record_key(&untaken, &format!("~ord:{}", unfinished.id));
    let raw: String = redis::cmd("GET")
        .arg(&line_key)
        .query(&mut conn)
        .expect("GET a line record");
    let line = stockgate::record::Record::parse(&raw).expect("a line record");
    assert_eq!(line.state, stockgate::record::State::Deducted, "{raw}");
    redis::cmd("DEL")
        .arg(&line_key)
        .query::<()>(&mut conn)
        .expect("DEL the second line's record");
    redis::cmd("INCRBY")
        .arg(crate::support::stock_key(&untaken))
        .arg(untaken_qty)
        .query::<()>(&mut conn)
        .expect("INCRBY: the second line's units back in stock");
    // And, not a violation: an ORDER whose one attempt failed before it
    // began (its filing among the orders in flight failed, say), left by
    // its caller. No intent, no line: it ended as nothing.
    let never_begun = Attempt {
        id: format!("{name}-never-begun").into(),
        started: std::time::Instant::now(),
        took: Duration::from_millis(1),
        retry: 0,
        outcome: history.attempts[at].outcome.clone(),
        ..unfinished.clone()
    };
    history.left.push(Left {
        op: Op::Order,
        id: never_begun.id.clone(),
        at: never_begun.ended(),
    });
    history.attempts.push(never_begun);

    // In the database: an entry lost from the middle of a sku's account,
    // and a conflict (an id Redis gave twice, as a failover without
    // --wait-replicas can).
    let (lost_sku, lost) = database
        .entries
        .iter()
        .filter(|(sku, entries)| skus.contains(sku) && entries.len() >= 3)
        .map(|(sku, entries)| (sku.clone(), entries[1].clone()))
        .min_by(|a, b| a.0.cmp(&b.0))
        .expect("a sku with three entries in the database");
    let db = books.db();
    let deleted = db
        .execute(&format!(
            "DELETE FROM stockgate_journal WHERE sku = '{lost_sku}' AND entry_ms = {} AND entry_seq = {}",
            lost.at.0, lost.at.1
        ))
        .await;
    assert_eq!(deleted, 1, "{lost_sku} {lost:?} was in the database");
    db.execute(
        "INSERT INTO stockgate_journal_conflicts (sku, entry_ms, entry_seq, format, event, \
         request_id, order_no, stock_change, held_change, stock_after, held_after) \
         SELECT sku, entry_ms, entry_seq, format, event, CONCAT(request_id, '-other'), order_no, \
         stock_change, held_change, stock_after, held_after FROM stockgate_journal \
         ORDER BY entry_ms LIMIT 1",
    )
    .await;
    let database = books.read().await;

    let audit = history.audit_with_database(&cluster, Policy::default(), &database);
    eprintln!("{} (after planting nine)", audit.summary());
    for found in &audit.violations {
        eprintln!("[{name}]   found: {found}");
    }
    let mut expected = vec![
        format!("{}: conservation broken", skus[0]),
        format!(
            "{} never-sent: a record for a request_id never sent",
            skus[1]
        ),
        format!("{sku} {id}: record without a TTL"),
        format!("{held_sku} {held_id}: HELD, but not in the holds set"),
        format!("order {ordered_id}: half applied"),
        format!("order {ordered_id}: intent without a TTL"),
        format!("order {}: unfinished", unfinished.id),
        // The stock changed behind the scripts' back, three times: the
        // journal (the third book) has no entry for any of them.
        format!("{}: the journal's account ends at", skus[0]),
        format!("{reverted_line_sku}: the journal's account ends at"),
        format!("{untaken}: the journal's account ends at"),
        // The database's two.
        format!("{lost_sku}: journal entry"),
        "the database holds 1 conflicting entries".to_owned(),
    ];
    // Two of those may be on one sku: one violation for both.
    expected.sort();
    expected.dedup();
    for want in &expected {
        assert!(
            audit
                .violations
                .iter()
                .any(|v| v.starts_with(want.as_str())),
            "the audit missed {want:?}; it found {:?}",
            audit.violations
        );
    }
    assert_eq!(
        audit.violations.len(),
        expected.len(),
        "only the planted violations: {:?}",
        audit.violations
    );
}

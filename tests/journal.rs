//! The journal (issue 26, part 1): with `--journal`, every change of a
//! SKU's stock or held units is one entry in the SKU's journal, written in
//! the call that made it; a call that changes nothing writes none; a SKU
//! is listed in its shard's set of journals before its first entry; and
//! without the flag nothing is written. Against a real 3-primary cluster.

mod support;

use redis::Value;
use std::collections::HashMap;
use std::time::Duration;
use stockgate::journal::{Entry, Event};
use stockgate::params::Sku;
use support::*;

/// Every entry of `sku`'s journal, oldest first, read as the sink reads
/// them.
fn entries(cluster: &stockgate::dev::LocalCluster, sku: &str) -> Vec<Entry> {
    let mut conn = cluster.cluster_connection().unwrap();
    let key = layout().journal_key(&Sku::parse(sku.to_owned().into()).unwrap());
    let raw: Value = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    stockgate::journal::stream::entries(raw).unwrap()
}

/// Whether `sku` is in its shard's set of journals.
fn listed(cluster: &stockgate::dev::LocalCluster, sku: &str) -> bool {
    let layout = layout();
    let sku = Sku::parse(sku.to_owned().into()).unwrap();
    let shard = &layout.sweep_shards()[layout.sweep_shard_index(&sku)];
    let mut conn = cluster.cluster_connection().unwrap();
    redis::cmd("SISMEMBER")
        .arg(&shard.journals)
        .arg(sku.as_bytes())
        .query(&mut conn)
        .unwrap()
}

/// The journal tells the SKU's account: from its first `set`, each entry
/// moves the stock and held units by its changes, says what they were
/// after it, and the last one is what Redis holds now.
fn assert_books(cluster: &stockgate::dev::LocalCluster, sku: &str, entries: &[Entry]) {
    let mut account: Option<(i64, i64)> = None;
    for entry in entries {
        if entry.event == Event::Set {
            account = Some((entry.stock, entry.held));
            continue;
        }
        let (stock, held) = account.expect("the account starts with a set");
        let moved = (stock + entry.stock_change, held + entry.held_change);
        assert_eq!(moved, (entry.stock, entry.held), "{sku}: {entry:?}");
        account = Some(moved);
    }
    assert_eq!(
        account.map(|(stock, held)| (Some(stock), held)),
        Some((get_stock(cluster, sku), held(cluster, sku))),
        "{sku}: the journal's account is the stock and held units Redis has"
    );
}

async fn send(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.unwrap()
}

fn code(reply: &Value) -> i64 {
    match reply {
        Value::Array(items) => match items[0] {
            Value::Int(code) => code,
            _ => panic!("{items:?}"),
        },
        other => panic!("{other:?}"),
    }
}

/// Every kind of change through stockgate, each once, and the calls that
/// change nothing: the journal has exactly one entry per change, with the
/// request's id and order_no, and adds up to what Redis holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_is_one_entry_and_the_journal_adds_up() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| {
        c.journal = true;
        c.admin_commands = true;
        c.sweeper = false;
    })
    .await;
    let mut conn = client(&server, false).await;
    let sku = "books-1";
    assert!(!listed(&cluster, sku));
    let opened = metric(&server, "stockgate_journal_opened_total");

    let calls: &[(&[&str], i64)] = &[
        (&["STOCK.SET", sku, "100", "op-set"], 0),
        (&["STOCK.SET", sku, "100", "op-set"], 1),
        (&["DEDUCT", sku, "3", "d-1", "ORD-1"], 0),
        (&["DEDUCT", sku, "3", "d-1", "ORD-1"], 1),
        (&["DEDUCT", sku, "1000", "d-2"], 2),
        (&["REVERT", sku, "d-1"], 0),
        (&["REVERT", sku, "d-1"], 1),
        (&["REVERT", sku, "never"], 4),
        (&["DEDUCT", sku, "1", "never"], 4),
        (&["HOLD", sku, "5", "h-1", "60000", "ORD-2"], 0),
        (&["CONFIRM", sku, "h-1"], 0),
        (&["CONFIRM", sku, "h-1"], 1),
        (&["HOLD", sku, "4", "h-2", "60000"], 0),
        (&["REVERT", sku, "h-2"], 0),
        (&["HOLD", sku, "2", "h-3", "1000"], 0),
        (&["STOCK.ADD", sku, "-10", "op-add"], 0),
        (&["STOCK.ADD", sku, "-10", "op-add"], 1),
    ];
    for (args, want) in calls {
        let reply = send(&mut conn, args).await;
        assert_eq!(code(&reply), *want, "{args:?}: {reply:?}");
    }
    // h-3 runs out; the next call on the SKU gives it back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let reply = send(&mut conn, &["DEDUCT", sku, "1", "d-3"]).await;
    assert_eq!(code(&reply), 0, "{reply:?}");

    let got = entries(&cluster, sku);
    let shown: Vec<(Event, &str, &str, i64, i64)> = got
        .iter()
        .map(|e| {
            (
                e.event,
                e.id.as_str(),
                e.order_no.as_str(),
                e.stock_change,
                e.held_change,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (Event::Set, "op-set", "", 100, 0),
            (Event::Deduct, "d-1", "ORD-1", -3, 0),
            (Event::Revert, "d-1", "ORD-1", 3, 0),
            (Event::Hold, "h-1", "ORD-2", -5, 5),
            (Event::Confirm, "h-1", "ORD-2", 0, -5),
            (Event::Hold, "h-2", "", -4, 4),
            (Event::Cancel, "h-2", "", 4, -4),
            (Event::Hold, "h-3", "", -2, 2),
            (Event::Add, "op-add", "", -10, 0),
            (Event::Expire, "h-3", "", 2, -2),
            (Event::Deduct, "d-3", "", -1, 0),
        ]
    );
    assert_books(&cluster, sku, &got);
    assert!(got.windows(2).all(|w| w[0].at < w[1].at), "ordered ids");
    assert!(listed(&cluster, sku), "listed before its first entry");
    // Its journal was opened once, by the first call on it.
    assert_eq!(
        metric(&server, "stockgate_journal_opened_total") - opened,
        1
    );
}

/// An ORDER's lines are journaled as the DEDUCTs they are (their id the
/// line id), an ORDER.HOLD's as holds; an order that comes up short, or is
/// reverted, leaves entries that add up to nothing taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_lines_are_journaled_as_their_calls() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| c.journal = true).await;
    let mut conn = client(&server, false).await;
    let (a, b) = ("books-line-a", "books-line-b");
    set_stock(&cluster, a, 10);
    set_stock(&cluster, b, 1);
    let ok = send(&mut conn, &["ORDER", "o-1", a, "2", b, "1"]).await;
    assert_eq!(code(&ok), 0, "{ok:?}");
    let short = send(&mut conn, &["ORDER", "o-2", a, "2", b, "1"]).await;
    assert_eq!(code(&short), 2, "{short:?}");
    let held = send(&mut conn, &["ORDER.HOLD", "o-3", "60000", a, "1"]).await;
    assert_eq!(code(&held), 0, "{held:?}");
    let reverted = send(&mut conn, &["ORDER.REVERT", "o-3"]).await;
    assert_eq!(code(&reverted), 0, "{reverted:?}");

    let on_a: Vec<(Event, String)> = entries(&cluster, a)
        .into_iter()
        .map(|e| (e.event, e.id))
        .collect();
    // o-2's line on a was taken then given back (its b line was short),
    // or revoked before it was taken: either way nothing is left taken.
    let taken: i64 = entries(&cluster, a).iter().map(|e| e.stock_change).sum();
    assert_eq!(taken, -2, "only o-1's line stays taken: {on_a:?}");
    assert_eq!(on_a[0], (Event::Deduct, "~ord:o-1".to_owned()));
    assert!(
        on_a.contains(&(Event::Hold, "~ord:o-3".to_owned())),
        "{on_a:?}"
    );
    assert!(
        on_a.contains(&(Event::Cancel, "~ord:o-3".to_owned())),
        "{on_a:?}"
    );
    let on_b: Vec<(Event, String)> = entries(&cluster, b)
        .into_iter()
        .map(|e| (e.event, e.id))
        .collect();
    assert_eq!(on_b, [(Event::Deduct, "~ord:o-1".to_owned())]);
    for sku in [a, b] {
        // set_stock wrote no `set` entry: the account here starts at the
        // stock before the first entry.
        let got = entries(&cluster, sku);
        let first = &got[0];
        let start = first.stock - first.stock_change;
        let end = got.iter().fold(start, |s, e| s + e.stock_change);
        assert_eq!(Some(end), get_stock(&cluster, sku), "{sku}");
    }
}

/// Many clients deducting one hot SKU (the calls coalesce into
/// `lua/deduct_many.lua`), with retries: one entry per deduction that took
/// stock, none for the duplicates and the ones that came up short, and
/// the books add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_skus_coalesced_deductions_are_one_entry_each() {
    const CLIENTS: usize = 8;
    const EACH: usize = 40;
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| {
        c.journal = true;
        c.admin_commands = true;
        c.coalesce_deducts = 16;
    })
    .await;
    let sku = "books-hot";
    let mut conn = client(&server, false).await;
    assert_eq!(
        code(&send(&mut conn, &["STOCK.SET", sku, "200", "op-hot"]).await),
        0
    );
    let coalesced_before = metric(&server, "stockgate_coalesced_calls_total");
    let addr = server.addr;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(async move {
                let mut conn = client_at(addr, false).await;
                let mut taken = Vec::new();
                for i in 0..EACH {
                    let id = format!("hot-{c}-{i}");
                    // Each sent twice, pipelined: the second is a duplicate.
                    let mut twin = conn.clone();
                    let (first, again) = tokio::join!(
                        deduct(&mut twin, sku, "1", &id, None),
                        deduct(&mut conn, sku, "1", &id, None)
                    );
                    let codes = [parse(first.unwrap()).code, parse(again.unwrap()).code];
                    assert!(
                        codes == [0, 1] || codes == [1, 0] || codes == [2, 2],
                        "{id}: {codes:?}"
                    );
                    if codes != [2, 2] {
                        taken.push(id);
                    }
                }
                taken
            })
        })
        .collect();
    let mut taken: HashMap<String, usize> = HashMap::new();
    for task in tasks {
        for id in task.await.unwrap() {
            *taken.entry(id).or_default() += 1;
        }
    }
    assert_eq!(taken.len(), 200, "the stock ran out at 200");
    let got = entries(&cluster, sku);
    let deducted: Vec<&Entry> = got.iter().filter(|e| e.event == Event::Deduct).collect();
    assert_eq!(deducted.len(), 200, "one entry per deduction, none twice");
    for entry in &deducted {
        assert_eq!(entry.stock_change, -1);
        assert!(taken.contains_key(&entry.id), "{entry:?}");
    }
    assert_books(&cluster, sku, &got);
    assert!(
        metric(&server, "stockgate_coalesced_calls_total") > coalesced_before,
        "some calls were coalesced"
    );
}

/// Without `--journal` nothing is written: no stream, no listing.
#[tokio::test]
async fn without_the_flag_no_journal_is_written() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
    let mut conn = client(&server, false).await;
    let sku = "books-off";
    assert_eq!(
        code(&send(&mut conn, &["STOCK.SET", sku, "5", "op-off"]).await),
        0
    );
    assert_eq!(
        parse(deduct(&mut conn, sku, "1", "off-1", None).await.unwrap()).code,
        0
    );
    assert_eq!(
        code(&send(&mut conn, &["HOLD", sku, "1", "off-h", "60000"]).await),
        0
    );
    assert!(entries(&cluster, sku).is_empty());
    assert!(!listed(&cluster, sku));
    assert_eq!(metric(&server, "stockgate_journal_opened_total"), 0);
}

/// A hold nobody touches after it runs out: the sweeper gives it back, and
/// that release is journaled like any other (its own call, `lua/release.lua`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweepers_releases_are_journaled() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| {
        c.journal = true;
        c.admin_commands = true;
    })
    .await;
    let mut conn = client(&server, false).await;
    let sku = "books-swept";
    assert_eq!(
        code(&send(&mut conn, &["STOCK.SET", sku, "9", "op-swept"]).await),
        0
    );
    assert_eq!(
        code(&send(&mut conn, &["HOLD", sku, "4", "swept-1", "1000"]).await),
        0
    );
    let cluster_ref = &cluster;
    loop_until_async(Duration::from_secs(30), || async move {
        (held(cluster_ref, sku) == 0).then_some(())
    })
    .await;
    let got = entries(&cluster, sku);
    let events: Vec<Event> = got.iter().map(|e| e.event).collect();
    assert_eq!(events, [Event::Set, Event::Hold, Event::Expire]);
    assert_eq!(got[2].id, "swept-1");
    assert_books(&cluster, sku, &got);
}

/// `stockgate check` says how many entries wait for the sink, read
/// through the shards' sets of journals, and warns once the oldest is
/// older than the sink's alert allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_tells_the_journals_backlog() {
    let cluster = cluster();
    let check = || {
        let out = std::process::Command::new(stockgate_bin())
            .args(["check", "--upstream", &cluster.seeds().join(",")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.contains("journal"))
            .unwrap_or_else(|| panic!("no journal line in {text}"))
            .to_owned()
    };
    assert!(check().contains("no SKU has a journal"), "{}", check());
    let server = proxy(cluster.seeds(), |c| c.journal = true).await;
    let mut conn = client(&server, false).await;
    for (sku, n) in [("backlog-a", 3), ("backlog-b", 2)] {
        set_stock(&cluster, sku, 100);
        for i in 0..n {
            let id = format!("{sku}-{i}");
            assert_eq!(
                parse(deduct(&mut conn, sku, "1", &id, None).await.unwrap()).code,
                0
            );
        }
    }
    let line = check();
    assert!(
        line.contains("2 SKUs with a journal; 5 entries not moved by the sink yet"),
        "{line}"
    );
    assert!(line.starts_with("PASS"), "{line}");
    // An entry six minutes old (as a sink that stopped would leave one).
    let mut direct = cluster.cluster_connection().unwrap();
    let old_id = format!(
        "{}-0",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            - 360_000
    );
    let sku = Sku::parse("backlog-old".to_owned().into()).unwrap();
    let layout = layout();
    let shard = &layout.sweep_shards()[layout.sweep_shard_index(&sku)];
    redis::cmd("SADD")
        .arg(&shard.journals)
        .arg("backlog-old")
        .query::<()>(&mut direct)
        .unwrap();
    redis::cmd("XADD")
        .arg(layout.journal_key(&sku))
        .arg(&old_id)
        .arg("e")
        .arg("1 deduct old-1 -1 0 99 0 ")
        .query::<String>(&mut direct)
        .unwrap();
    let line = check();
    assert!(
        line.starts_with("WARN") && line.contains("the sink is behind or not running"),
        "{line}"
    );
}

/// lua/deduct.lua asks for the journal only where it would write to it:
/// a DEDUCT that changes nothing answers its code without one, one that
/// would deduct, or release an expired hold first, is refused with
/// NOJOURNAL having changed nothing, and once the journal exists both
/// changes are entries that add up, as are those of calls with the
/// journal off (plain and coalesced).
#[test]
fn a_deduct_needs_a_journal_only_to_change_the_sku() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    let scripts = stockgate::script::Scripts::new();
    let sku = "nojournal";
    let stock = stock_key(sku);
    let holds = [stock.as_slice(), b":holds"].concat();
    let held_key = [stock.as_slice(), b":held"].concat();
    // Each call a nonce of its own: a call that finds its own nonce is the
    // same call sent again, and answers 0 as it did.
    let nonces = std::cell::Cell::new(0u32);
    let deduct = |id: &str, qty: &str, journal: &str, direct: &mut redis::Connection| {
        nonces.set(nonces.get() + 1);
        let nonce = format!("{:x}", nonces.get());
        redis::cmd("EVAL")
            .arg(&scripts.deduct.body)
            .arg(6)
            .arg(&stock)
            .arg(record_key(sku, id))
            .arg(&holds)
            .arg(&held_key)
            .arg([stock.as_slice(), b":journal:on"].concat())
            .arg([stock.as_slice(), b":journal"].concat())
            // The settings; the flags: replicate off, then the journal's.
            .arg(&[
                qty,
                "o-1",
                &format!("86400000 100 error 0{journal}"),
                &nonce,
            ])
            .query::<Value>(direct)
    };
    let get = |key: &[u8], direct: &mut redis::Connection| -> Option<String> {
        redis::cmd("GET").arg(key).query(direct).unwrap()
    };
    redis::cmd("SET")
        .arg(&stock)
        .arg(10)
        .query::<()>(&mut direct)
        .unwrap();

    // A deduction with no journal: refused, nothing changed.
    let refused = deduct("r1", "2", "1", &mut direct).unwrap_err();
    assert_eq!(refused.code(), Some("NOJOURNAL"), "{refused:?}");
    assert_eq!(get(&stock, &mut direct).as_deref(), Some("10"));
    assert_eq!(get(&record_key(sku, "r1"), &mut direct), None);

    // Calls that change nothing need no journal: a duplicate (its record
    // written with the journal off) and insufficient stock.
    assert_eq!(parse(deduct("r2", "3", "0", &mut direct).unwrap()).code, 0);
    let duplicate = parse(deduct("r2", "3", "1", &mut direct).unwrap());
    assert_eq!((duplicate.code, duplicate.remain), (1, 7));
    assert_eq!(parse(deduct("r3", "50", "1", &mut direct).unwrap()).code, 2);

    // A hold that ran out (its record and the SKU's hold keys as
    // lua/hold.lua leaves them, expired a minute ago): the deduction would
    // give its units back first, which journals too. Refused, nothing
    // changed.
    let hold_record = record_key(sku, "h1");
    let now_ms = {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut direct).unwrap();
        s * 1000 + us / 1000
    };
    let expired = format!("3:H:4:00aa:{}.{}:o-h", now_ms - 60_000, now_ms - 120_000);
    redis::pipe()
        .cmd("SET")
        .arg(&hold_record)
        .arg(&expired)
        .cmd("ZADD")
        .arg(&holds)
        .arg(now_ms - 60_000)
        .arg("h1")
        .cmd("SET")
        .arg(&held_key)
        .arg(4)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(4)
        .query::<()>(&mut direct)
        .unwrap();
    let refused = deduct("r4", "1", "1", &mut direct).unwrap_err();
    assert_eq!(refused.code(), Some("NOJOURNAL"), "{refused:?}");
    assert_eq!(get(&stock, &mut direct).as_deref(), Some("3"));
    assert_eq!(get(&hold_record, &mut direct), Some(expired));
    assert_eq!(get(&held_key, &mut direct).as_deref(), Some("4"));
    assert_eq!(get(&record_key(sku, "r4"), &mut direct), None);

    // The journal opened as stockgate opens it: the release and the
    // deduction are one entry each, in that order, and add up.
    let journal = layout().journal_key(&Sku::parse(sku.to_owned().into()).unwrap());
    redis::cmd("EVAL")
        .arg(&scripts.journal_open.body)
        .arg(1)
        .arg(&journal)
        .arg("make")
        .query::<Value>(&mut direct)
        .unwrap();
    let deducted = parse(deduct("r4", "1", "1", &mut direct).unwrap());
    assert_eq!((deducted.code, deducted.remain), (0, 6));
    let raw: Value = redis::cmd("XRANGE")
        .arg(&journal)
        .arg("-")
        .arg("+")
        .query(&mut direct)
        .unwrap();
    let entries = stockgate::journal::stream::entries(raw).unwrap();
    let seen: Vec<_> = entries
        .iter()
        .map(|e| {
            (
                e.event,
                &*e.id,
                e.stock_change,
                e.held_change,
                e.stock,
                e.held,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Event::Expire, "h1", 4, -4, 7, 0),
            (Event::Deduct, "r4", -1, 0, 6, 0),
        ]
    );

    // A SKU with a journal is journaled whatever the caller's flag: a
    // DEDUCT with the journal off, and a coalesced call of two.
    assert_eq!(parse(deduct("r5", "1", "0", &mut direct).unwrap()).code, 0);
    // A flat reply: -1 - remain, order_no for each member's 0.
    let many: Vec<Value> = redis::cmd("EVAL")
        .arg(&scripts.deduct_many.body)
        .arg(7)
        .arg(&stock)
        .arg(&holds)
        .arg(&held_key)
        .arg([stock.as_slice(), b":journal:on"].concat())
        .arg(&journal)
        .arg(record_key(sku, "r6"))
        .arg(record_key(sku, "r7"))
        .arg(&["86400000", "100", "error", "0", "0"])
        .arg(&["1", "", "aa", "2", "o-7", "ab"])
        .query(&mut direct)
        .unwrap();
    assert_eq!(
        (&many[0], &many[2]),
        (&Value::Int(-5), &Value::Int(-3)),
        "{many:?}"
    );
    let raw: Value = redis::cmd("XRANGE")
        .arg(&journal)
        .arg("-")
        .arg("+")
        .query(&mut direct)
        .unwrap();
    let later: Vec<_> = stockgate::journal::stream::entries(raw).unwrap()[2..]
        .iter()
        .map(|e| (e.event, e.id.to_string(), e.stock_change, e.stock))
        .collect();
    assert_eq!(
        later,
        [
            (Event::Deduct, "r5".to_owned(), -1, 5),
            (Event::Deduct, "r6".to_owned(), -1, 4),
            (Event::Deduct, "r7".to_owned(), -2, 2),
        ]
    );

    // A journal an older release opened: its stream, without the marker
    // the calls read (lua/common.lua, journal_of). With the journal on, a
    // deduction is refused until the journal is opened again, which marks
    // it; then a call with the journal off appends to it too.
    let marker = [journal.as_slice(), b":on"].concat();
    redis::cmd("DEL")
        .arg(&marker)
        .query::<()>(&mut direct)
        .unwrap();
    let refused = deduct("r8", "1", "1", &mut direct).unwrap_err();
    assert_eq!(refused.code(), Some("NOJOURNAL"), "{refused:?}");
    redis::cmd("EVAL")
        .arg(&scripts.journal_open.body)
        .arg(1)
        .arg(&journal)
        .arg("make")
        .query::<Value>(&mut direct)
        .unwrap();
    assert_eq!(parse(deduct("r8", "1", "0", &mut direct).unwrap()).code, 0);
    let length: i64 = redis::cmd("XLEN").arg(&journal).query(&mut direct).unwrap();
    assert_eq!(length, 6, "r8's entry");
}

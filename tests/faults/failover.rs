//! Primaries that go away: a crash (`kill -9`) and a manual `CLUSTER
//! FAILOVER`, and the scripts a primary loses or a promoted replica never
//! had.

use crate::checker::{History, Policy, Workload};
use crate::harness::*;
use crate::support::history::Answer;
use std::time::{Duration, Instant};

/// How long the load runs before and after a fault.
fn phase() -> Duration {
    if long_faults() {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(1500)
    }
}

/// Prints how the shard of `fault` recovered after `promoted`, and what
/// the other shards saw meanwhile; returns the first success's end.
fn report_recovery(
    name: &str,
    fault: &History,
    rest: &History,
    injected: Instant,
    promoted: Instant,
) -> Instant {
    let Some(first) = fault.first_code_after(promoted, |_| true) else {
        panic!(
            "[{name}] the shard never served after the promotion; its errors relative to the fault: {}; last ones: {:?}",
            fault.error_spans(injected),
            fault
                .attempts
                .iter()
                .rev()
                .take(3)
                .map(|a| &a.outcome)
                .collect::<Vec<_>>()
        );
    };
    let last_before = fault.last_code_before(injected, |_| true);
    eprintln!(
        "[{name}] fault at {}; replica promoted {} later; first success on the shard {} after the promotion ({:?} {} -> code {:?}, that attempt took {}); shard unavailable for {}",
        fault.at(injected),
        ms(promoted - injected),
        ms(first.ended().saturating_duration_since(promoted)),
        first.op,
        first.id,
        first.outcome.code(),
        ms(first.took),
        ms(first.ended() - last_before.map_or(injected, |a| a.ended())),
    );
    eprintln!(
        "[{name}] errors on the shard, by kind, with when they came relative to the fault: {}",
        fault.error_spans(injected)
    );
    fn window(h: &History, from: Instant, to: Instant) -> Vec<&crate::checker::Attempt> {
        h.attempts
            .iter()
            .filter(|a| a.started >= from && a.started < to)
            .collect()
    }
    let window = |h| window(h, injected, promoted);
    eprintln!(
        "[{name}] between the fault and the promotion: this shard {:?}; other shards {:?}, latency {}",
        fault.by_label(window(fault).into_iter()),
        rest.by_label(window(rest).into_iter()),
        rest.latency(window(rest).into_iter()),
    );
    first.ended()
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn killed_primary_replica_promoted_stockgate_recovers }
/// Fault 1: a primary is killed under load; its replica is promoted and
/// stockgate finds it by itself. Prints the time from promotion to the
/// first success on that shard, and the acknowledged changes the
/// asynchronous failover lost (counted, not failed: Redis Cluster may lose
/// them by design; `--wait-replicas` is the answer to that).
///
/// Beside it, a linearizability lane ([`crate::linear`]) through two
/// stockgates with `--wait-replicas 1`, checked by porcupine once the old
/// primary is a replica again, less the reads, 2s and 3s the old primary
/// answered before the kill (dirty reads, which Redis allows: below).
async fn killed_primary_replica_promoted_stockgate_recovers(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("kill-{kind}");
    let mut cluster = cluster_of(kind, 1000, &[]);
    let victim = 0;
    let (fault, rest) = lanes(&cluster, &name, victim);
    // Holds too: the promoted replica's holds set and held counter must
    // still agree with its records (async replication keeps a prefix).
    // Orders on the victim's skus: their lines on the killed shard, their
    // intents anywhere (some on it). Most of them have a caller that never
    // retries, so the kill leaves a few after an error (a handful a run),
    // for stockgate's recovery to end (the audit waits for it); the rest
    // are retried as before. Not on the other lane's,
    // audited strictly: an intent of theirs on the victim may lose its
    // last change.
    let (mut fault, rest) = (fault.with_holds().with_orders(), rest.with_holds());
    (fault.order_pct, fault.unretried_pct) = (30, 60);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    // The database as the third book: a sink moving the journals, killed
    // and restarted, and the database restarted, before the primary dies.
    let mut books = crate::books::Books::start(&cluster, &name, kind);
    // The linearizability lane, on skus of the victim, with
    // --wait-replicas 1: without it an acknowledged write may be lost in
    // the failover (asynchronous replication, as the audit counts), and no
    // history is linearizable then.
    let lin_skus = skus_where(&cluster, &format!("lin-{name}"), 4, |o| o == victim);
    let lane = crate::linear::start(&cluster, &name, lin_skus, fault.seed, Some(WAIT_ONE)).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(phase()).await;
    books.upset(Duration::from_millis(300)).await;

    let replica = replica_of(&cluster, victim);
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    // Reaped: nothing sent from now on can run on the old primary.
    let dead = Instant::now();
    let promoted = wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    tokio::time::sleep(phase()).await;
    // The crashed node comes back as the new primary's replica (with
    // STOCKGATE_FAULT_WAIT=1, writes on this shard wait for that).
    let rejoined = rejoin(&mut cluster, victim, replica);
    // The lane's writes are confirmed again from here on.
    lane.run_past(rejoined).await;
    let lane = lane.stop().await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    report_recovery(&name, &fault_history, &rest_history, killed, promoted);
    eprintln!(
        "[{name}] the old primary rejoined as a replica {} after the promotion",
        ms(rejoined - promoted)
    );
    let policy = Policy {
        allow_lost_acks: true,
    };
    let database = books.drain().await;
    let audit = fault_history.audit_with_database(&cluster, policy, &database);
    audit.assert_green();
    eprintln!(
        "[{name}] acknowledged changes lost in the failover (async replication): {}; orders left behind that recovery ended: {}",
        audit.lost_acks,
        crate::support::metric(
            &server,
            "stockgate_order_recoveries_total{result=\"ended\"}"
        ),
    );
    rest_history
        .audit_with_database(&cluster, Policy::default(), &database)
        .assert_green();
    server.stop_now();

    // Until the old primary rejoins, the promoted one has no replica, and
    // a write on it is answered `not replicated`: its script ran (the
    // error reports its code 0, 1 or 4 unconfirmed) on a primary that
    // never fails after, so it took effect before its error came back.
    // Checked so (its answer still unknown): stricter than an unknown
    // outcome, which may take effect any time after its call or never,
    // and a smaller search for porcupine.
    let dead_ns = lane.history.at(dead);
    let (marked, applied) = lane.history.applied(|o| {
        o.call_ns > dead_ns
            && o.error
                .as_deref()
                .is_some_and(|e| e.contains("not replicated"))
    });
    // What WAIT does not cover: an answer that wrote nothing (STOCK.GET,
    // a 2 short of stock, a 3) waits for no replica, so the old primary
    // may have answered it from a write that was never replicated, whose
    // caller got an error, and that the failover then lost: a dirty read,
    // which Redis's asynchronous replication allows. Only such answers on
    // the victim's skus sent before it died are left out (they changed
    // nothing, so the model misses no change); every write's answer, and
    // every answer sent after the kill, when the old primary was gone,
    // is checked.
    let (checked, left_out) = marked.without(|o| {
        o.call_ns < dead_ns
            && match &o.answer {
                Some(Answer::Stock(_)) => true,
                Some(Answer::Code(code, _)) => matches!(code, 2 | 3),
                None => false,
            }
    });
    eprintln!(
        "[{name}] linearizability: {} of the lane's requests in flight between the kill and the promotion; {applied} writes sent after the kill answered `not replicated`, checked as applied before their error",
        lane.overlapping(killed, promoted, None)
    );
    lane.assert_linearizable(
        &checked,
        killed,
        rejoined,
        (
            left_out,
            "reads, 2s and 3s sent before the kill: the old primary may have answered them from writes it then lost",
        ),
    );
    // Measured, not asserted: whether this run's history was linearizable
    // with those answers in too (a dirty read needs a write the failover
    // lost, and with --wait-replicas only one no replica had confirmed by
    // the kill can be). Ten seconds at most: a measurement must not cost
    // CI more.
    eprintln!(
        "[{name}] with the {left_out} answers left out put back: {:?}",
        marked.check_within(&format!("{name}-lin-whole"), Duration::from_secs(10))
    );
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_hot_sku_killed_mid_coalesced_calls_keeps_exact_books }
/// A flash sale's shape under a crash: every client on one SKU, so its
/// DEDUCTs run coalesced (lua/deduct_many.lua), some of them in the call
/// that is in Redis when its primary is killed. Each member was sent again
/// alone through the slow path; the books must still balance exactly, each
/// reply agree with its record, and no fault become a code.
async fn a_hot_sku_killed_mid_coalesced_calls_keeps_exact_books(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("hot-kill-{kind}");
    let mut cluster = cluster_of(kind, 1000, &[]);
    let victim = 0;
    let mut hot = Workload::new(
        &name,
        skus_where(&cluster, &name, 1, |o| o == victim),
        TIMEOUT,
    )
    .with_holds();
    hot.clients = 16;
    hot.seed(&cluster);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let load = hot.start(server.addr).await;
    tokio::time::sleep(phase()).await;

    let replica = replica_of(&cluster, victim);
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    tokio::time::sleep(phase()).await;
    let history = load.stop().await;
    let calls = crate::support::metric(&server, "stockgate_coalesced_calls_total");
    server.stop_now();

    eprintln!(
        "[{name}] {calls} coalesced calls; killed {} before the promotion",
        ms(promoted - killed)
    );
    assert!(calls > 0, "16 clients on one sku never shared a call");
    let audit = history.audit(
        &cluster,
        Policy {
            allow_lost_acks: true,
        },
    );
    audit.assert_green();
    assert!(
        audit.units_recorded > 0,
        "the load deducted: {}",
        audit.summary()
    );
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn manual_failover_old_primary_redirects_and_nothing_is_lost }
/// Fault 2: `CLUSTER FAILOVER` on a replica under load. The old primary
/// becomes a replica, and stockgate's next DEDUCT for that shard still goes
/// to it: the script's `#!lua` flags make the replica answer MOVED (not
/// READONLY after running half a script), and the cluster client follows.
/// A manual failover waits for the replica to catch up, so nothing
/// acknowledged may be lost: the audit is strict, and the linearizability
/// lane beside it ([`crate::linear`]) is checked whole.
async fn manual_failover_old_primary_redirects_and_nothing_is_lost(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("failover-{kind}");
    let cluster = cluster_of(kind, 1000, &[]);
    let victim = 0;
    let (fault, rest) = lanes(&cluster, &name, victim);
    let (fault, rest) = (fault.with_holds(), rest.with_holds());
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    // The linearizability lane, on skus of the victim. No --wait-replicas
    // needed (unless STOCKGATE_FAULT_WAIT asks): a manual failover stops
    // the primary's writes and lets the replica catch up before it takes
    // over, so nothing the old primary answered is lost, and the whole
    // history is checked.
    let lin_skus = skus_where(&cluster, &format!("lin-{name}"), 4, |o| o == victim);
    let lane = crate::linear::start(&cluster, &name, lin_skus, fault.seed, wait_from_env()).await;
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(phase()).await;

    let (old, new) = (
        &cluster.nodes[victim],
        &cluster.nodes[replica_of(&cluster, victim)],
    );
    let moved_before = error_stat(old, "MOVED");
    let asked = Instant::now();
    let reply = text(new, &["CLUSTER", "FAILOVER"]);
    assert_eq!(reply.as_deref(), Some("OK"), "CLUSTER FAILOVER");
    let promoted = wait_promoted(new, Duration::from_secs(30));
    let demoted_by = Instant::now() + Duration::from_secs(10);
    while is_primary(old) {
        assert!(Instant::now() < demoted_by, "the old primary stepped down");
        std::thread::sleep(Duration::from_millis(5));
    }
    let demoted = Instant::now();
    tokio::time::sleep(phase()).await;
    lane.run_past(demoted).await;
    let lane = lane.stop().await;
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    report_recovery(&name, &fault_history, &rest_history, asked, promoted);
    let first_deduct = fault_history
        .attempts
        .iter()
        .find(|a| a.ended() >= promoted && a.op == crate::checker::Op::Deduct)
        .expect("a DEDUCT after the failover");
    let moved = error_stat(old, "MOVED") - moved_before;
    eprintln!(
        "[{name}] first DEDUCT after the switch: {} -> {} in {}; the old primary answered MOVED {moved} times, READONLY {} times",
        first_deduct.id,
        first_deduct.outcome.label(),
        ms(first_deduct.took),
        error_stat(old, "READONLY"),
    );
    assert!(
        moved > 0,
        "requests reached the old primary and were redirected"
    );
    assert_eq!(
        error_stat(old, "READONLY"),
        0,
        "no script ran on the demoted primary"
    );
    // The library is replicated like data: the promoted replica had it,
    // and served FCALLs without one `Function not found` (which stockgate
    // would have answered with EVAL, as it does NOSCRIPT).
    let (fcalls, evals) = (command_calls(new, "fcall"), command_calls(new, "eval"));
    eprintln!("[{name}] the promoted replica ran FCALL {fcalls} times, EVAL {evals} times");
    assert_eq!(
        server.shared().upstream.calling(),
        stockgate::script::Calling::Function
    );
    assert!(fcalls > 0, "FCALLs reached the promoted replica");
    assert_eq!(evals, 0, "it never lacked the library");
    audit_lanes_and_stop(
        &cluster,
        server,
        (&fault_history, Policy::default()),
        &rest_history,
    );
    eprintln!(
        "[{name}] the lane's requests in flight between CLUSTER FAILOVER and the old primary stepping down: {}",
        lane.overlapping(asked, demoted, None)
    );
    lane.assert_linearizable(&lane.history, asked, demoted, (0, ""));
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn lost_scripts_are_reloaded_without_client_errors }
/// Fault 4: NOSCRIPT, with stockgate calling by EVALSHA (`--scripts
/// eval`, as where FUNCTION is refused; the library's own faults are
/// [`crate::functions`]'s). First `SCRIPT FLUSH` on a primary under load:
/// the EVAL fallback hides it completely (no error at all). Then a primary
/// is killed: its replica never had the script (SCRIPT LOAD is not
/// replicated in Redis 7), and once promoted it serves without a client
/// ever seeing NOSCRIPT.
async fn lost_scripts_are_reloaded_without_client_errors(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("noscript-{kind}");
    let mut cluster = cluster_of(kind, 1000, &[]);
    let victim = 1;
    let (fault, rest) = lanes(&cluster, &name, victim);
    let server = stockgate_calling(
        cluster.seeds(),
        TIMEOUT,
        wait_from_env(),
        stockgate::config::ScriptCalls::Eval,
    )
    .await;
    let sha = stockgate::script::Scripts::new().deduct.sha.clone();
    let replica = replica_of(&cluster, victim);
    // stockgate's SCRIPT LOAD reaches replicas too (the cluster client
    // sends it to every node it knows), but a replica restarted or added
    // since has none: play that replica.
    assert_eq!(
        text(&cluster.nodes[replica], &["SCRIPT", "FLUSH"]).as_deref(),
        Some("OK")
    );
    assert!(
        !has_script(&cluster.nodes[replica], &sha),
        "the replica has no script before its promotion"
    );
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(phase()).await;

    // SCRIPT FLUSH on a primary of the other lane.
    let flushed = Instant::now();
    assert_eq!(
        text(&cluster.nodes[0], &["SCRIPT", "FLUSH"]).as_deref(),
        Some("OK")
    );
    tokio::time::sleep(phase()).await;
    assert!(
        has_script(&cluster.nodes[0], &sha),
        "the fallback cached the script again"
    );

    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    tokio::time::sleep(phase()).await;
    if wait_from_env().is_some() {
        // Writes on this shard need a replica to confirm them again.
        rejoin(&mut cluster, victim, replica);
    }
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    let flush_window = |h: &History| {
        h.attempts
            .iter()
            .filter(|a| a.started >= flushed && a.ended() < killed)
            .filter(|a| !a.outcome.is_code())
            .count()
    };
    eprintln!(
        "[{name}] after SCRIPT FLUSH on :{}: it answered NOSCRIPT {} times, clients saw {} errors (this lane) + {} (other lane) in {} requests",
        cluster.nodes[0].port,
        error_stat(&cluster.nodes[0], "NOSCRIPT"),
        flush_window(&fault_history),
        flush_window(&rest_history),
        fault_history
            .attempts
            .iter()
            .chain(&rest_history.attempts)
            .filter(|a| a.started >= flushed && a.ended() < killed)
            .count()
    );
    assert_eq!(
        flush_window(&fault_history) + flush_window(&rest_history),
        0
    );

    let served = report_recovery(&name, &fault_history, &rest_history, killed, promoted);
    let after: Vec<_> = fault_history
        .attempts
        .iter()
        .filter(|a| a.started >= served)
        .collect();
    let errors_after = after.iter().filter(|a| !a.outcome.is_code()).count();
    eprintln!(
        "[{name}] promoted replica :{} answered NOSCRIPT {} times (hidden by the EVAL fallback) and has the script now: {}; after its first success, {} requests, {} errors",
        cluster.nodes[replica].port,
        error_stat(&cluster.nodes[replica], "NOSCRIPT"),
        has_script(&cluster.nodes[replica], &sha),
        after.len(),
        errors_after
    );
    assert_eq!(
        errors_after, 0,
        "the promoted replica serves without errors"
    );
    let noscript = fault_history
        .attempts
        .iter()
        .chain(&rest_history.attempts)
        .filter(|a| match &a.outcome {
            crate::checker::Outcome::Fault { text, .. } => {
                text.to_ascii_lowercase().contains("noscript")
            }
            _ => false,
        })
        .count();
    assert_eq!(noscript, 0, "NOSCRIPT never reaches a client");
    let lossy = Policy {
        allow_lost_acks: true,
    };
    audit_lanes_and_stop(&cluster, server, (&fault_history, lossy), &rest_history);
}

/// Σ of each sku's `:held` counter and `:holds` set size, read from
/// `node` itself: reading releases nothing (a STOCK.GET through stockgate
/// would).
fn held_on(node: &stockgate::dev::RedisNode, skus: &[String]) -> Option<(i64, i64)> {
    let mut conn = node.connection().ok()?;
    let mut pipe = redis::pipe();
    for sku in skus {
        let stock = crate::support::stock_key(sku);
        pipe.cmd("GET").arg([&stock[..], b":held"].concat());
        pipe.cmd("ZCARD").arg([&stock[..], b":holds"].concat());
    }
    let values: Vec<Option<i64>> = pipe.query(&mut conn).ok()?;
    Some(values.chunks(2).fold((0, 0), |(held, set), pair| {
        (held + pair[0].unwrap_or(0), set + pair[1].unwrap_or(0))
    }))
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn primary_fails_over_mid_sweep_and_every_hold_comes_back_once }
/// A primary killed while the sweeper releases its expired holds. Short
/// holds (1–2.5 s) are placed on skus of one primary, whose sweep index
/// shard lives there too, and nothing else touches them: only the sweeper
/// gives them back. Once it has begun (some units came back), the primary
/// is killed; its replica takes over with whatever releases had reached
/// it. The sweeper must then finish on the new primary: every hold back
/// exactly once, none twice, none left. With `--wait-replicas 1` every
/// acknowledged HOLD, CONFIRM and REVERT is on the replica, so the books
/// are exact: initial − final = Σ confirmed, nothing held, every set
/// empty. (A release that reached the replica is never redone: its record
/// is EXPIRED there; one that did not is redone, once, from its HELD
/// record.)
async fn primary_fails_over_mid_sweep_and_every_hold_comes_back_once(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("sweep-{kind}");
    let mut cluster = cluster_of(kind, 1000, &[]);
    let victim = 0;
    let replica = replica_of(&cluster, victim);
    let layout = crate::support::layout();
    let index_owner = |sku: &str| {
        let sku = stockgate::params::Sku::parse(sku.to_owned().into()).expect("sku");
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&sku)];
        owner(&cluster, stockgate::keys::slot(&shard.due))
    };
    let skus: Vec<String> = skus_where(&cluster, &name, 64, |o| o == victim)
        .into_iter()
        .filter(|sku| index_owner(sku) == victim)
        .take(8)
        .collect();
    assert_eq!(skus.len(), 8, "skus whose index shares their primary");
    let initial = 1_000_000;
    seed(&cluster, &skus, initial);
    let server = stockgate_with(cluster.seeds(), TIMEOUT, Some(WAIT_ONE)).await;
    let conn = crate::support::client(&server, false).await;

    // 30 holds per sku, qty 1–5, expiring over 1.5 s; a quarter
    // confirmed and an eighth reverted at once, the rest left to run out.
    let holds: Vec<(String, String, u32, u32)> = (0..240u32)
        .map(|i| {
            let sku = skus[i as usize % skus.len()].clone();
            (
                sku,
                format!("{name}-{i}"),
                1 + i % 5,
                1000 + (i * 37) % 1500,
            )
        })
        .collect();
    let placed = futures_util::future::join_all(holds.iter().map(|(sku, id, qty, ttl)| {
        let mut conn = conn.clone();
        async move {
            let reply =
                crate::support::hold(&mut conn, sku, &qty.to_string(), id, &ttl.to_string(), None)
                    .await
                    .expect("HOLD");
            crate::support::parse_hold(reply).code
        }
    }))
    .await;
    assert!(
        placed.iter().all(|c| *c == 0),
        "every HOLD held: {placed:?}"
    );
    let mut confirmed: Vec<(&str, &str, u32)> = Vec::new();
    let mut reverted: Vec<&str> = Vec::new();
    let mut conn = conn;
    for (i, (sku, id, qty, _)) in holds.iter().enumerate() {
        if i % 4 == 1 {
            let reply = crate::support::confirm(&mut conn, sku, id)
                .await
                .expect("CONFIRM");
            match crate::support::parse_hold(reply).code {
                0 => confirmed.push((sku, id, *qty)),
                5 => {} // it ran out first: left to the sweeper (or already back)
                other => panic!("CONFIRM {sku} {id}: code {other}"),
            }
        } else if i % 8 == 2 {
            let reply = crate::support::revert(&mut conn, sku, id)
                .await
                .expect("REVERT");
            match crate::support::parse(reply).code {
                0 => reverted.push(id),
                1 => {} // it ran out first
                other => panic!("REVERT {sku} {id}: code {other}"),
            }
        }
    }
    let (held_at_start, _) = held_on(&cluster.nodes[victim], &skus).expect("held");
    assert!(held_at_start > 0, "holds left for the sweeper");

    // The sweeper at work: kill the primary as soon as some units came back.
    let begun_by = Instant::now() + Duration::from_secs(30);
    let (held_at_kill, set_at_kill) = loop {
        let (held, set) = held_on(&cluster.nodes[victim], &skus).expect("held");
        if held < held_at_start {
            break (held, set);
        }
        assert!(Instant::now() < begun_by, "the sweeper never began");
        std::thread::sleep(Duration::from_millis(5));
    };
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let promoted = wait_promoted(&cluster.nodes[replica], Duration::from_secs(30));
    let (held_after, set_after) = held_on(&cluster.nodes[replica], &skus).expect("held");
    // With --wait-replicas, writes on this shard wait for a replica again.
    let rejoined = rejoin(&mut cluster, victim, replica);
    eprintln!(
        "[{name}] {} holds, {held_at_start} units held when the sweep began; killed with {held_at_kill} units in {set_at_kill} holds left; the promoted replica ({} later) had {held_after} units in {set_after} holds; replica again {} later",
        holds.len(),
        ms(promoted - killed),
        ms(rejoined - promoted),
    );

    let done_by = Instant::now() + Duration::from_secs(60);
    loop {
        wait_stable(&cluster);
        let new = owner(&cluster, sku_slot(&skus[0]));
        if held_on(&cluster.nodes[new], &skus) == Some((0, 0)) {
            break;
        }
        assert!(
            Instant::now() < done_by,
            "the sweeper did not release every hold after the failover: {:?} left",
            held_on(&cluster.nodes[new], &skus)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "[{name}] every hold back {} after the kill",
        ms(killed.elapsed())
    );

    let violations = crate::checker::conservation(&cluster, &name, &skus, initial);
    assert!(violations.is_empty(), "{violations:#?}");
    let mut check = cluster.cluster_connection().expect("cluster connection");
    for (sku, id, qty, _) in &holds {
        let raw: String = redis::cmd("GET")
            .arg(crate::support::record_key(sku, id))
            .query(&mut check)
            .expect("a record for every hold");
        let want = if confirmed.iter().any(|(_, c, _)| c == id) {
            'C'
        } else if reverted.contains(&id.as_str()) {
            'R'
        } else {
            'X'
        };
        assert_eq!(
            crate::support::summary(&raw),
            format!("{want}:{qty}:"),
            "{sku} {id}"
        );
    }
    for sku in &skus {
        let stock = crate::support::get_stock(&cluster, sku).expect("stock");
        let sold: i64 = confirmed
            .iter()
            .filter(|(s, _, _)| s == sku)
            .map(|(_, _, q)| *q as i64)
            .sum();
        assert_eq!(
            initial - stock,
            sold,
            "{sku}: only the confirmed units are gone"
        );
    }
    server.stop_now();
}

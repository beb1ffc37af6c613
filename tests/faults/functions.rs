//! Fault 4, with Redis Functions: stockgate's scripts are one function
//! library, called with FCALL (`src/script.rs`). The library is persisted
//! and replicated like data, so a promoted replica has it
//! (`failover::manual_failover_old_primary_redirects_and_nothing_is_lost`
//! checks that); but a node can still lack it: `FUNCTION FLUSH`, or a new
//! primary that takes slots (new shards get no functions by themselves,
//! redis#11780). Such a node answers `Function not found`, which stockgate
//! answers like NOSCRIPT: the call goes again as EVAL with the body to the
//! node that owns the key, and the library is loaded again in the
//! background. Never an error for the client, never a business code.

use crate::checker::{History, Outcome, Policy};
use crate::harness::*;
use std::time::{Duration, Instant};
use stockgate::script::Calling;

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_flushed_library_and_a_new_primary_cost_no_client_an_error }
/// Under load: `FUNCTION FLUSH` on two primaries; then a new, empty
/// primary joins the cluster and two busy skus' slots move to it. The
/// flushes cost no client an error; the move costs what any slot move
/// costs (ASK, TRYAGAIN, followed), and nothing for the missing library;
/// the library is back on every primary, the new one included, which then
/// serves FCALLs; the audit is strict.
async fn a_flushed_library_and_a_new_primary_cost_no_client_an_error(kind: ServerKind) {
    let _serial = SERIAL.lock().await;
    let name = format!("functions-{kind}");
    let mut cluster = cluster_of(kind, 2000, &[]);
    let source = 0;
    let (fault, rest) = lanes(&cluster, &name, source);
    let server = stockgate(cluster.seeds(), TIMEOUT).await;
    let upstream = &server.shared().upstream;
    assert_eq!(
        upstream.calling(),
        Calling::Function,
        "{}",
        upstream.calling_text()
    );
    let library = stockgate::script::Library::of(&stockgate::script::Scripts::new().all())
        .expect("scripts")
        .name;
    for node in &cluster.nodes {
        assert!(
            has_library(node, &library),
            ":{} has {library} (primaries load it; replicas get it by replication)",
            node.port
        );
    }
    let (fault_load, rest_load) = (
        fault.start(server.addr).await,
        rest.start(server.addr).await,
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // FUNCTION FLUSH on the fault lane's primary and one of the other's.
    let flushed = Instant::now();
    let not_found_before = [0, 1].map(|i| error_stat(&cluster.nodes[i], "ERR"));
    for i in [0, 1] {
        assert_eq!(
            text(&cluster.nodes[i], &["FUNCTION", "FLUSH"]).as_deref(),
            Some("OK")
        );
        assert!(!has_library(&cluster.nodes[i], &library));
    }
    wait_until("the library back on the flushed primaries", || {
        [0, 1]
            .iter()
            .all(|&i| has_library(&cluster.nodes[i], &library))
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let flush_over = Instant::now();
    eprintln!(
        "[{name}] after FUNCTION FLUSH, the primaries answered ERR (Function not found) {:?} times; the library was back {} later",
        [0, 1].map(|i| error_stat(&cluster.nodes[i], "ERR") - not_found_before[i]),
        ms(flush_over - flushed - Duration::from_millis(1000)),
    );

    // A new primary, and two of the fault lane's slots moved to it.
    let new = cluster.add_node().expect("a new node joins");
    assert!(!has_library(&cluster.nodes[new], &library));
    let moved_from = Instant::now();
    let mut slots = Vec::new();
    for sku in fault.skus.iter().take(2) {
        let slot = sku_slot(sku);
        let (took, keys) = migrate_slot(
            &cluster,
            slot,
            source,
            new,
            20,
            Duration::from_millis(20),
            Duration::ZERO,
        );
        eprintln!(
            "[{name}] {sku}: slot {slot}, {keys} keys moved to the new primary in {}",
            ms(took)
        );
        slots.push(slot);
    }
    wait_until("the library on the new primary", || {
        has_library(&cluster.nodes[new], &library)
    });
    let fcalls_before = command_calls(&cluster.nodes[new], "fcall");
    wait_until("FCALLs served by the new primary", || {
        command_calls(&cluster.nodes[new], "fcall") > fcalls_before
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let moved = Instant::now();
    let (fault_history, rest_history) = (fault_load.stop().await, rest_load.stop().await);

    let errors = |h: &History, from: Instant, to: Instant| {
        h.attempts
            .iter()
            .filter(|a| a.started >= from && a.ended() < to)
            .filter(|a| !a.outcome.is_code())
            .count()
    };
    let new_node = &cluster.nodes[new];
    eprintln!(
        "[{name}] while slots moved: {} + {} client errors; the new primary :{} answered ERR (Function not found) {} times, ASK-TRYAGAIN {}, and has run FCALL {} and EVAL {} times",
        errors(&fault_history, moved_from, moved),
        errors(&rest_history, moved_from, moved),
        new_node.port,
        error_stat(new_node, "ERR"),
        error_stat(new_node, "TRYAGAIN"),
        command_calls(new_node, "fcall"),
        command_calls(new_node, "eval"),
    );
    assert_eq!(
        errors(&fault_history, flushed, flush_over) + errors(&rest_history, flushed, flush_over),
        0,
        "FUNCTION FLUSH costs no client an error"
    );
    let about_functions = fault_history
        .attempts
        .iter()
        .chain(&rest_history.attempts)
        .filter(|a| match &a.outcome {
            Outcome::Fault { text, .. } => text.to_ascii_lowercase().contains("function"),
            _ => false,
        })
        .count();
    assert_eq!(
        about_functions, 0,
        "`Function not found` never reaches a client"
    );
    assert_eq!(upstream.calling(), Calling::Function, "still FCALL");
    for slot in slots {
        assert_eq!(
            owner(&cluster, slot),
            new,
            "slot {slot} is the new primary's"
        );
    }
    audit_lanes_and_stop(
        &cluster,
        server,
        (&fault_history, Policy::default()),
        &rest_history,
    );
}

/// Waits until `ok` holds, failing after 30 s: a state that never comes.
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

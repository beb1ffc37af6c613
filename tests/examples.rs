//! The Rust examples, run as their users run them, against a real cluster
//! and stockgate.
//!
//! `examples/order_flow.rs` places orders concurrently, fails some
//! payments, REVERTs those, retries what it could not settle and then
//! reconciles. Here it runs while Redis stalls: every primary is paused
//! for writes (`CLIENT PAUSE ... WRITE`) as the run starts, and stockgate's
//! deadline is short, so early DEDUCTs get `-UPSTREAM` and are applied
//! later anyway, the case retries with the same request_id exist for.
//! Whether a given request hits the pause depends on timing, so nothing
//! here counts retries; what must hold whatever the timing is that the
//! books balance, checked twice: by the example's own report, and by this
//! test from Redis alone (stock, and every record the run left).
//!
//! # Finding the example binary
//!
//! The test builds it with the cargo that is running the tests
//! (`env!("CARGO")`, `cargo build --example order_flow`) and takes the path
//! from cargo's JSON messages, rather than guessing
//! `target/debug/examples/order_flow`: `cargo test --test examples` alone
//! does not build examples, so a guessed path could be missing or stale, and
//! the real one moves with `CARGO_TARGET_DIR`, `--release` or `--target`.
//! When the example is up to date the build is a no-op of about a second.

mod support;

use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use support::*;

/// How long the example may run before the test gives up on it: a watchdog
/// against a hang, far above the few seconds it takes.
const WATCHDOG: Duration = Duration::from_secs(180);

/// Variables cargo sets for a crate (see "Environment variables Cargo sets
/// for crates"), besides the `CARGO_PKG_*` and `CARGO_BIN_EXE_*` families.
const PER_PACKAGE: &[&str] = &[
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// Builds `examples/<name>.rs` as `cargo test` would and returns its path.
fn example_binary(name: &str) -> PathBuf {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut build = std::process::Command::new(env!("CARGO"));
    build.args([
        "build",
        "--quiet",
        "--manifest-path",
        manifest,
        "--example",
        name,
        "--message-format=json-render-diagnostics",
    ]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    // What cargo sets for the test process describes this package, not the
    // build: passed on, it makes build scripts that watch one of them rerun
    // (ring's watches CARGO_MANIFEST_DIR), and rebuilds half the tree here
    // and again at the next `cargo test`.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if PER_PACKAGE.contains(&name.as_ref())
            || name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
        {
            build.env_remove(name.as_ref());
        }
    }
    let out = build.stderr(Stdio::inherit()).output().expect("cargo runs");
    assert!(out.status.success(), "cargo build --example {name} failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Json>(line).ok())
        .find(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no executable for example {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_flow_books_balance_while_redis_stalls() {
    const SKU: &str = "flow";
    const STOCK: i64 = 120;
    const ORDERS: u64 = 150;
    const RUN: &str = "t";
    let binary = tokio::task::spawn_blocking(|| example_binary("order_flow"));
    let cluster = cluster();
    set_stock(&cluster, SKU, STOCK);
    // A short deadline, so a stalled Redis shows as UPSTREAM soon.
    let server = proxy(cluster.seeds(), |c| {
        c.upstream.timeout = Duration::from_millis(200)
    })
    .await;
    let binary = binary.await.unwrap();

    for node in &cluster.nodes[..cluster.masters] {
        let mut conn = node.connection().unwrap();
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(1500)
            .arg("WRITE")
            .query::<()>(&mut conn)
            .unwrap();
    }
    let mut run = tokio::process::Command::new(&binary);
    run.arg(server.addr.to_string())
        // --keep: the books below are read from what the run left.
        .args(["--sku", SKU, "--run-id", RUN, "--seed", "42", "--keep"])
        .args(["--orders", &ORDERS.to_string(), "--concurrency", "16"])
        .args(["--payment-failures", "25", "--duplicates", "15"])
        // Shorter than stockgate's deadline now and then under load, so
        // client timeouts happen too; plenty of attempts to outlast the pause.
        .args(["--timeout-ms", "300", "--attempts", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(WATCHDOG, run.output())
        .await
        .unwrap_or_else(|_| panic!("order_flow still running after {WATCHDOG:?}: hung?"))
        .expect("order_flow runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}"); // shown when the test fails, or with --nocapture
    assert!(
        out.status.success(),
        "order_flow says the books don't balance:\n{report}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .unwrap_or("")
            .starts_with("books balance:"),
        "{report}"
    );

    // The example's figures, by name.
    let figures: HashMap<String, i64> = stdout
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_owned(), value.trim().parse().ok()?))
        })
        .collect();
    let figure = |name: &str| -> i64 {
        *figures
            .get(name)
            .unwrap_or_else(|| panic!("no {name:?} in the report:\n{report}"))
    };

    // Redis alone: the stock, and one record (or none) per order.
    let after = get_stock(&cluster, SKU).unwrap();
    let mut redis = cluster.cluster_connection().unwrap();
    let mut states: HashMap<char, (i64, i64)> = HashMap::new(); // state -> (orders, units)
    let mut without_record = 0;
    for i in 0..ORDERS {
        let record: Option<String> = redis::cmd("GET")
            .arg(record_key(SKU, &format!("{RUN}-{i}")))
            .query(&mut redis)
            .unwrap();
        let Some(record) = record else {
            without_record += 1;
            continue;
        };
        let parsed = stockgate::record::Record::parse(&record).expect("a record");
        let state = parsed.state.letter();
        let qty = parsed.qty as i64;
        let order_no = parsed.order_no.as_str();
        let expected_order_no = if state == 'V' {
            String::new()
        } else {
            format!("ORD-{RUN}-{i}")
        };
        assert_eq!(
            order_no, expected_order_no,
            "record {record:?} of order {i}"
        );
        let entry = states.entry(state).or_default();
        entry.0 += 1;
        entry.1 += qty;
    }
    let (deducted, deducted_units) = states.get(&'D').copied().unwrap_or_default();
    let (reverted, reverted_units) = states.get(&'R').copied().unwrap_or_default();
    let (revoked, _) = states.get(&'V').copied().unwrap_or_default();
    assert_eq!(
        states.keys().filter(|s| !"DRV".contains(**s)).count(),
        0,
        "only D, R and V records: {states:?}"
    );

    // The books from Redis alone: what is still deducted is what left the stock.
    assert_eq!(STOCK - after, deducted_units, "{report}");
    // And they agree with the example's report, order by order.
    assert_eq!(figure("stock before"), STOCK);
    assert_eq!(figure("stock after"), after);
    assert_eq!(figure("orders placed"), ORDERS as i64);
    assert_eq!(figure("unsettled"), 0, "{report}");
    assert_eq!(figure("records disagreeing"), 0, "{report}");
    assert_eq!(figure("kept (paid)"), deducted, "{report}");
    assert_eq!(
        figure("reverted (payment failed)") + figure("cancelled, had been deducted"),
        reverted,
        "{report}"
    );
    assert_eq!(figure("cancelled, never deducted"), revoked, "{report}");
    assert_eq!(figure("failed for stock"), without_record, "{report}");
    assert_eq!(figure("deducted"), deducted + reverted, "{report}");
    assert_eq!(
        figure("units deducted"),
        deducted_units + reverted_units,
        "{report}"
    );
    assert_eq!(figure("units given back"), reverted_units, "{report}");
}

/// `examples/deduct.rs`, run as its header says: each outcome it names,
/// and the stock checked in Redis after each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduct_example_handles_each_outcome_as_its_header_says() {
    let binary = tokio::task::spawn_blocking(|| example_binary("deduct"));
    let cluster = cluster();
    set_stock(&cluster, "ex-sku", 3);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let binary = binary.await.unwrap();
    let addr = server.addr.to_string();
    let addr = addr.as_str();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&binary)
            .args(args)
            .output()
            .expect("the deduct example runs");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let deducted = "deducted (now or by an earlier try): 1 left, order \"ORD-1\"\n";
    assert_eq!(run(&[addr, "ex-sku", "2", "ex-1", "ORD-1"]), deducted);
    // Run twice, the second is a retry of the same request_id: the same
    // answer, nothing taken again. The order_no printed is the one
    // stockgate stored with the first call, whatever the retry sends.
    assert_eq!(run(&[addr, "ex-sku", "2", "ex-1", "ORD-1"]), deducted);
    assert_eq!(run(&[addr, "ex-sku", "2", "ex-1"]), deducted);
    assert_eq!(get_stock(&cluster, "ex-sku"), Some(1));
    assert_eq!(
        run(&[addr, "ex-sku", "2", "ex-2"]),
        "insufficient stock: fail the order\n"
    );
    let invalid = run(&[addr, "ex-sku", "0", "ex-3"]);
    assert!(invalid.starts_with("invalid request: qty"), "{invalid}");
    assert_eq!(
        run(&["--revert", addr, "ex-sku", "ex-1"]),
        "compensation done: given back: 3 in stock\n"
    );
    assert_eq!(get_stock(&cluster, "ex-sku"), Some(3));
    assert_eq!(
        run(&[addr, "ex-sku", "2", "ex-1"]),
        "reverted or revoked earlier: the order was cancelled, don't proceed\n"
    );
    let unknown = run(&[addr, "no-such-sku", "1", "ex-4"]);
    assert!(unknown.starts_with("needs an operator"), "{unknown}");
    assert_eq!(get_stock(&cluster, "ex-sku"), Some(3), "nothing else moved");
    // Without an order_no, none is sent, and none is printed.
    assert_eq!(
        run(&[addr, "ex-sku", "1", "ex-5"]),
        "deducted (now or by an earlier try): 2 left\n"
    );
}

//! Lifecycle and operations: drain, fast stop, access log, INFO, `check`.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use stockgate::dev::{LocalRedis, RedisOptions};
use support::*;

#[test]
fn sigterm_answers_every_request_already_sent_then_exits_zero() {
    let cluster = cluster();
    set_stock(&cluster, "drain", 1_000_000);
    let mut gate = Launch::serve(&cluster.seeds())
        .args(["--shutdown-grace", "20s"])
        .start();

    let mut idle = TcpStream::connect(gate.addr).unwrap();
    let mut busy = TcpStream::connect(gate.addr).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let burst: Vec<u8> = (0..1000)
        .flat_map(|i| encode_request(&["DEDUCT", "drain", "1", &format!("d-{i}")]))
        .collect();
    busy.write_all(&burst).unwrap();
    // The first reply shows stockgate is working through the burst.
    let mut first = [0u8; 1];
    busy.read_exact(&mut first).unwrap();
    gate.signal(libc::SIGTERM);

    let mut replies = first.to_vec();
    busy.read_to_end(&mut replies).unwrap();
    let text = String::from_utf8(replies).unwrap();
    let count = text.matches("*4\r\n:0\r\n").count();
    assert_eq!(
        count,
        1000,
        "every request sent before SIGTERM is answered:\n{}",
        &text[..text.len().min(300)]
    );
    assert!(closed_by_peer(&mut idle), "idle connections are closed");
    assert!(
        TcpStream::connect(gate.addr).is_err(),
        "no new connections once the drain has begun"
    );
    let (status, log) = gate.wait();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(log.contains("SIGTERM: draining"), "{log}");
    assert_eq!(get_stock(&cluster, "drain"), Some(1_000_000 - 1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_false_at_once_and_in_flight_requests_finish() {
    // Redis holds every write (CLIENT PAUSE WRITE) until the test lets it
    // go, so the request is still waiting on Redis when the drain begins,
    // however slow the machine: each step waits for a state it can see,
    // never for a time to pass. Reads (stockgate's health checks) go on.
    let redis = LocalRedis::start(&RedisOptions::default()).unwrap();
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("slow"))
        .arg(10)
        .query::<()>(&mut direct)
        .unwrap();
    let server = proxy(vec![redis.url()], |c| {
        c.upstream.timeout = Duration::from_secs(60)
    })
    .await;
    let admin = server.admin_addr.port();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query::<()>(&mut direct)
        .unwrap();
    let mut conn = client(&server, false).await;
    let pending = tokio::spawn(async move { deduct(&mut conn, "slow", "1", "slow-1", None).await });
    // The DEDUCT's script is held inside Redis.
    let blocked = |direct: &mut redis::Connection| {
        let clients: String = redis::cmd("CLIENT").arg("LIST").query(direct).unwrap();
        clients.lines().any(|l| {
            l.contains(" flags=b ") && (l.contains(" cmd=fcall ") || l.contains(" cmd=evalsha "))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !blocked(&mut direct) {
        assert!(Instant::now() < deadline, "the DEDUCT never reached Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let drain = tokio::spawn(server.drain(Duration::from_secs(60)));
    // Readiness is false while the request is still in flight: it cannot
    // finish before Redis is unpaused below.
    let readyz = move || http_get(admin, "/readyz").ok().map(|(status, _)| status);
    while tokio::task::spawn_blocking(readyz).await.unwrap() != Some(503) {
        assert!(
            Instant::now() < deadline,
            "readiness never turned false during the drain"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!pending.is_finished(), "the request is still in flight");
    assert!(!drain.is_finished(), "the drain waits for it");
    assert!(blocked(&mut direct), "and it is still held in Redis");

    redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query::<()>(&mut direct)
        .unwrap();
    let reply = parse(
        pending
            .await
            .unwrap()
            .expect("the in-flight request completes"),
    );
    assert_eq!((reply.code, reply.remain), (0, 9));
    assert!(drain.await.unwrap(), "drained within the grace");
}

#[test]
fn sigint_stops_at_once() {
    let cluster = cluster();
    let mut gate = Launch::serve(&cluster.seeds())
        .args(["--shutdown-grace", "60s"])
        .start();
    let mut idle = TcpStream::connect(gate.addr).unwrap();
    idle.write_all(b"PING\r\n").unwrap();
    let mut pong = [0u8; 7];
    idle.read_exact(&mut pong).unwrap();
    gate.signal(libc::SIGINT);
    let (status, log) = gate.wait();
    assert!(status.success(), "{log}");
    assert!(log.contains("SIGINT: stopping now"), "{log}");
}

#[test]
fn the_access_log_has_the_designs_fields_and_nothing_more() {
    let cluster = cluster();
    set_stock(&cluster, "logged", 50);
    for (mode, expect_ok_line) in [("all", true), ("errors", false), ("off", false)] {
        let gate = Launch::serve(&cluster.seeds())
            .args(["--log-format", "json", "--access-log", mode])
            .start();
        let port = gate.addr.port();
        let id = format!("req-{mode}");
        redis_cli(port, &["DEDUCT", "logged", "1", &id, "ORDER-SECRET-42"]);
        redis_cli(port, &["DEDUCT", "nope", "1", &id]);
        let order = format!("ord-{mode}");
        redis_cli(port, &["ORDER", &order, "logged", "2"]);
        let (status, log) = gate.stop();
        assert!(status.success());
        let access: Vec<serde_json::Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "stockgate::access")
            .collect();
        let ok_line = access.iter().find(|v| v["fields"]["code"] == 0);
        let err_line = access
            .iter()
            .find(|v| v["fields"]["error"] == "unknown_sku");
        assert_eq!(
            ok_line.is_some(),
            expect_ok_line,
            "--access-log {mode}: {log}"
        );
        assert_eq!(
            err_line.is_some(),
            mode != "off",
            "--access-log {mode}: {log}"
        );
        // A fault is a WARN, a business code an INFO: a level filter then
        // keeps exactly the lines an operator must look at.
        if let Some(line) = err_line {
            assert_eq!(line["level"], "WARN", "{line}");
        }
        if let Some(line) = ok_line {
            assert_eq!(line["level"], "INFO", "{line}");
            let f = &line["fields"];
            assert_eq!(f["request_id"], id.as_str());
            assert_eq!(f["key"], "stock:{logged}");
            assert_eq!(f["qty"], "1");
            assert_eq!(f["command"], "deduct");
            assert!(f["latency_us"].as_u64().unwrap() > 0);
        }
        // An ORDER's line calls are logged each as the call it is, on the
        // line's id, key and qty, beside the order's own line.
        let line_id = format!("~ord:{order}");
        let line_calls: Vec<&str> = access
            .iter()
            .filter(|v| v["fields"]["request_id"] == line_id.as_str())
            .map(|v| {
                assert_eq!(v["fields"]["key"], "stock:{logged}", "{v}");
                assert_eq!(v["fields"]["code"], 0, "{v}");
                v["fields"]["command"].as_str().unwrap()
            })
            .collect();
        let order_lines = access
            .iter()
            .filter(|v| {
                v["fields"]["command"] == "order" && v["fields"]["request_id"] == order.as_str()
            })
            .count();
        if expect_ok_line {
            assert_eq!(line_calls, ["deduct"], "{log}");
            assert_eq!(order_lines, 1, "{log}");
            let hold = access
                .iter()
                .find(|v| v["fields"]["request_id"] == line_id.as_str())
                .unwrap();
            assert_eq!(hold["fields"]["qty"], "2", "{hold}");
        } else {
            assert!(line_calls.is_empty() && order_lines == 0, "{log}");
        }
        assert!(
            !log.contains("ORDER-SECRET-42"),
            "the order_no never reaches the log"
        );
    }
}

/// Operators' stock changes reach the log through the audit target's own
/// writer, among the access log's lines: one line per change applied, none
/// for a retry of the same op_id.
#[test]
fn every_stock_change_is_one_audit_line_beside_the_access_log() {
    let cluster = cluster();
    set_stock(&cluster, "audited", 5);
    let gate = Launch::serve(&cluster.seeds())
        .args([
            "--log-format",
            "json",
            "--access-log",
            "all",
            "--admin-commands",
        ])
        .start();
    let port = gate.addr.port();
    let burst: Vec<u8> = (0..200)
        .flat_map(|i| encode_request(&["DEDUCT", "audited", "1", &format!("a-{i}")]))
        .collect();
    let mut busy = TcpStream::connect(("127.0.0.1", port)).unwrap();
    busy.write_all(&burst).unwrap();
    for (args, code) in [
        (&["STOCK.ADD", "audited", "1000", "restock-1"][..], "0"),
        (&["STOCK.ADD", "audited", "1000", "restock-1"], "1"),
        (&["STOCK.SET", "audited", "50", "recount-1"], "0"),
    ] {
        let reply = redis_cli(port, args);
        assert_eq!(reply.lines().next(), Some(code), "{args:?}: {reply}");
    }
    let (status, log) = gate.stop();
    assert!(status.success(), "{log}");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let audit: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v["target"] == "stockgate::audit")
        .collect();
    assert_eq!(audit.len(), 2, "{log}");
    let (add, set) = (&audit[0]["fields"], &audit[1]["fields"]);
    assert_eq!(
        (&add["command"], &add["delta"], &add["op_id"]),
        (&"STOCK.ADD".into(), &1000.into(), &"restock-1".into()),
        "{add}"
    );
    assert_eq!(
        (&set["command"], &set["qty"], &set["stock_after"]),
        (&"STOCK.SET".into(), &50.into(), &50.into()),
        "{set}"
    );
    assert!(
        lines.iter().any(|v| v["target"] == "stockgate::access"),
        "the access log runs beside it: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_reports_totals_and_the_upstream() {
    let cluster = cluster();
    set_stock(&cluster, "info", 1);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    deduct(&mut conn, "info", "1", "i1", None).await.unwrap();
    deduct(&mut conn, "info", "1", "i1", None).await.unwrap();
    deduct(&mut conn, "info", "1", "i2", None).await.unwrap();
    deduct(&mut conn, "missing", "1", "i3", None)
        .await
        .unwrap_err();
    redis::cmd("REVERT")
        .arg("info")
        .arg("i1")
        .query_async::<redis::Value>(&mut conn)
        .await
        .unwrap();
    hold(&mut conn, "info", "1", "h1", "600000", None)
        .await
        .unwrap();
    confirm(&mut conn, "info-none", "h2").await.unwrap_err();
    let info: redis::InfoDict = redis::cmd("INFO").query_async(&mut conn).await.unwrap();
    for (key, want) in [
        ("hold_ok", 1),
        ("confirm_error", 1),
        ("holds_placed", 1),
        ("holds_confirmed", 0),
        ("deduct_ok", 1),
        ("deduct_duplicate", 1),
        ("deduct_insufficient", 1),
        ("deduct_error", 1),
        ("revert_ok", 1),
        ("upstream_errors_unknown_sku", 2),
        ("script_version", stockgate::outcome::SCRIPT_VERSION),
    ] {
        assert_eq!(info.get::<i64>(key), Some(want), "{key}");
    }
    assert!(info.get::<i64>("uptime_in_seconds").is_some());
    assert_eq!(
        info.get::<String>("stockgate_version").as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let primaries: String = info.get("upstream_primaries").unwrap();
    assert_eq!(primaries.split(',').count(), 3, "{primaries}");
}

fn check(seeds: &[String]) -> (bool, String) {
    let out = Command::new(stockgate_bin())
        .args(["check", "--upstream", &seeds.join(",")])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What `stockgate check` must print as the server of `node`, read from
/// the node's own INFO here rather than by check's parser: Valkey's release
/// is `valkey_version` (its `redis_version` is a compatibility level).
fn expected_server(node: &stockgate::dev::RedisNode, kind: ServerKind) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut node.connection().unwrap())
        .unwrap();
    let version_field = format!("{}_version:", kind.name());
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix(&version_field))
        .unwrap_or_else(|| panic!("no {version_field} in {info}"))
        .trim();
    format!("{} {version}", kind.name())
}

matrix! { #[test] fn check_passes_a_healthy_cluster_and_fails_a_risky_eviction_policy }
fn check_passes_a_healthy_cluster_and_fails_a_risky_eviction_policy(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let (ok, report) = check(&cluster.seeds());
    assert!(ok, "{report}");
    let server = format!(
        "PASS  server           {} on every primary",
        expected_server(&cluster.nodes[0], kind)
    );
    for line in [
        "PASS  connect          cluster mode, 3 primaries",
        server.as_str(),
        "PASS  cluster state    ok on every primary",
        "PASS  slots            all 16384 slots are served",
        "PASS  scripts",
        "PASS  key slots",
        "PASS  eviction",
        "WARN  replicas",
        "WARN  node timeout",
    ] {
        assert!(report.contains(line), "missing {line:?} in\n{report}");
    }
    // The probe wrote nothing.
    let mut redis = cluster.cluster_connection().unwrap();
    for node in &cluster.nodes {
        let size: i64 = redis::cmd("DBSIZE")
            .query(&mut node.connection().unwrap())
            .unwrap();
        assert_eq!(size, 0, "check wrote to port {}", node.port);
    }
    let _ = &mut redis;

    let mut node = cluster.nodes[1].connection().unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1gb")
        .query::<()>(&mut node)
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-lru")
        .query::<()>(&mut node)
        .unwrap();
    let (ok, report) = check(&cluster.seeds());
    assert!(!ok, "a FAIL exits non-zero:\n{report}");
    assert!(report.contains("FAIL  eviction"), "{report}");
    assert!(
        report.contains("evict exactly the idempotency records"),
        "{report}"
    );
}

matrix! { #[test] fn check_understands_a_standalone_server_and_an_unreachable_one }
fn check_understands_a_standalone_server_and_an_unreachable_one(kind: ServerKind) {
    let redis = standalone_of(kind);
    let (ok, report) = check(&[redis.url()]);
    assert!(ok, "{report}");
    assert!(
        report.contains("PASS  connect          standalone mode, 1 primary"),
        "{report}"
    );
    let server = format!(
        "PASS  server           {} on every primary",
        expected_server(&redis.node, kind)
    );
    assert!(report.contains(&server), "missing {server:?} in\n{report}");
    assert!(!report.contains("cluster state"), "{report}");
    let port = free_port();
    let (ok, report) = check(&[format!("redis://127.0.0.1:{port}")]);
    assert!(!ok);
    assert!(report.contains("FAIL  connect"), "{report}");
}

/// `--upstream` pointed at a stockgate (the port at hand after `stockgate
/// dev`) is named for what it is, at connect, instead of failing at SCRIPT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_plainly_when_the_upstream_is_a_stockgate() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let url = format!("redis://{}", server.addr);
    let (ok, report) = tokio::task::spawn_blocking(move || check(&[url]))
        .await
        .unwrap();
    assert!(!ok, "{report}");
    let expected = format!(
        "FAIL  connect          {} (stockgate {}) is a stockgate, not Redis: --upstream must name the Redis servers",
        server.addr,
        env!("CARGO_PKG_VERSION")
    );
    assert!(report.contains(&expected), "{report}");
    assert!(
        !report.contains("scripts"),
        "nothing past connect is tried: {report}"
    );
}

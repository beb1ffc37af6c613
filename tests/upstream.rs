//! The Redis side: script loss, Redis down and back, readiness, metrics.

mod support;

use std::time::{Duration, Instant};
use stockgate::config::ScriptCalls;
use support::*;

/// The value of one exact series line in Prometheus text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_on_every_primary_is_invisible_to_clients() {
    lost_scripts_on_every_primary_are_invisible_to_clients(ScriptCalls::Eval).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_on_every_primary_is_invisible_to_clients() {
    lost_scripts_on_every_primary_are_invisible_to_clients(ScriptCalls::Function).await
}

/// Every primary loses what stockgate calls (`SCRIPT FLUSH` with
/// `--scripts eval`, `FUNCTION FLUSH` with FCALL); every sku (spread over
/// all three primaries) is still served, with no error reaching the
/// client, and what was lost is back.
async fn lost_scripts_on_every_primary_are_invisible_to_clients(scripts: ScriptCalls) {
    let cluster = cluster();
    let skus: Vec<String> = (0..12).map(|i| format!("flush-{i}")).collect();
    for sku in &skus {
        set_stock(&cluster, sku, 10);
    }
    let server = proxy(cluster.seeds(), |c| c.upstream.scripts = scripts).await;
    let mut conn = client(&server, false).await;
    for sku in &skus {
        assert_eq!(
            parse(deduct(&mut conn, sku, "1", "before", None).await.unwrap()).code,
            0
        );
    }
    let flush = match scripts {
        ScriptCalls::Eval => "SCRIPT",
        _ => "FUNCTION",
    };
    for node in &cluster.nodes[..cluster.masters] {
        redis::cmd(flush)
            .arg("FLUSH")
            .query::<()>(&mut node.connection().unwrap())
            .unwrap();
    }
    for sku in &skus {
        let reply = parse(deduct(&mut conn, sku, "2", "after", None).await.unwrap());
        assert_eq!((reply.code, reply.remain), (0, 7), "{sku}");
        let again = parse(deduct(&mut conn, sku, "2", "after", None).await.unwrap());
        assert_eq!(again.code, 1, "{sku}");
    }
    // The fallback put the script back where it was missing (EVAL caches
    // it); the health loop loads the library again, within a tick of the
    // first `Function not found`.
    let scripts = stockgate::script::Scripts::new();
    let library = stockgate::script::Library::of(&scripts.all()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for node in &cluster.nodes[..cluster.masters] {
        let mut conn = node.connection().unwrap();
        if flush == "SCRIPT" {
            let exists: Vec<i64> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(&scripts.deduct.sha)
                .query(&mut conn)
                .unwrap();
            assert_eq!(exists, vec![1], "port {}", node.port);
            continue;
        }
        loop {
            let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
                .arg("LIST")
                .arg("LIBRARYNAME")
                .arg(&library.name)
                .query(&mut conn)
                .unwrap();
            if !listed.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "port {}: the library never came back",
                node.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(
        server.shared().upstream.calling(),
        match flush {
            "SCRIPT" => stockgate::script::Calling::Eval,
            _ => stockgate::script::Calling::Function,
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_replies_are_errors_within_the_deadline_and_service_comes_back() {
    let mut cluster = cluster();
    set_stock(&cluster, "outage", 5);
    let deadline = Duration::from_millis(500);
    let server = proxy(cluster.seeds(), |c| {
        c.upstream.timeout = deadline;
        c.upstream.connect_timeout = Duration::from_millis(200);
    })
    .await;
    let mut conn = client(&server, false).await;
    assert_eq!(
        parse(deduct(&mut conn, "outage", "1", "o-0", None).await.unwrap()).code,
        0
    );

    for node in &mut cluster.nodes {
        node.kill();
    }
    for i in 1..=5 {
        let started = Instant::now();
        let result = deduct(&mut conn, "outage", "1", &format!("o-{i}"), None).await;
        let took = started.elapsed();
        let err = result.expect_err("no business code while Redis is down");
        assert_eq!(err.code(), Some("UPSTREAM"), "{err:?}");
        let text = err.detail().unwrap();
        assert!(
            text.contains("retrying with the same request_id is safe"),
            "{text}"
        );
        // A loose bound: it proves the request does not hang, without
        // timing anything finer than a loaded CI machine can promise.
        assert!(
            took < deadline * 4 + Duration::from_secs(2),
            "took {took:?}"
        );
    }
    // Readiness notices within a few health checks.
    let (status, body) = loop_until(Duration::from_secs(10), || {
        let (status, body) = http_get(server.admin_addr.port(), "/readyz").unwrap();
        (status == 503).then_some((status, body))
    });
    assert_eq!(status, 503, "{body}");

    for node in &mut cluster.nodes {
        node.restart().unwrap();
    }
    cluster
        .wait_for("the restarted cluster", |info, _| {
            info.contains("cluster_state:ok")
        })
        .unwrap();
    assert!(
        server.wait_ready(Duration::from_secs(20)).await,
        "ready again without a restart"
    );
    // The nodes kept no data (tests run without persistence); what matters
    // is that stockgate serves again, on the same client connection.
    set_stock(&cluster, "outage", 5);
    let reply = parse(
        deduct(&mut conn, "outage", "1", "o-after", None)
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 4));
    // Ready at start, not ready in the outage, ready again: three flips.
    let text = server.shared().metrics.render();
    let flips = sample(&text, "stockgate_upstream_ready_changes_total").unwrap();
    assert!(flips >= 3.0, "{flips} readiness changes counted");
}

fn loop_until<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_redis_and_health_does_not() {
    // Nothing listens on this port yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config =
        stockgate::config::Config::for_upstream(vec![format!("redis://127.0.0.1:{port}")]);
    config.upstream.connect_timeout = Duration::from_millis(200);
    let server = stockgate::server::start(config).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        http_get(server.admin_addr.port(), "/healthz").unwrap().0,
        200
    );
    let (status, body) = http_get(server.admin_addr.port(), "/readyz").unwrap();
    assert_eq!(status, 503);
    assert!(body.starts_with("not ready: "), "{body}");
    // Requests are refused as faults, not as codes.
    let mut conn = client(&server, false).await;
    let err = deduct(&mut conn, "x", "1", "r", None).await.unwrap_err();
    assert_eq!(err.code(), Some("UPSTREAM"));
    assert!(
        err.detail()
            .unwrap()
            .starts_with("not connected to redis yet"),
        "{err:?}"
    );
    assert!(server.drain(Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_result_without_user_data_in_labels() {
    let cluster = cluster();
    set_stock(&cluster, "metered-sku-XYZ", 1);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    deduct(
        &mut conn,
        "metered-sku-XYZ",
        "1",
        "secret-request-id",
        Some("ORDER-SECRET"),
    )
    .await
    .unwrap();
    deduct(
        &mut conn,
        "metered-sku-XYZ",
        "1",
        "secret-request-id",
        Some("ORDER-SECRET"),
    )
    .await
    .unwrap();
    deduct(&mut conn, "metered-sku-XYZ", "1", "another-id", None)
        .await
        .unwrap();
    deduct(&mut conn, "metered-sku-XYZ", "0", "bad-qty", None)
        .await
        .unwrap();
    deduct(&mut conn, "no-such-sku", "1", "r", None)
        .await
        .unwrap_err();

    let (status, text) = http_get(server.admin_addr.port(), "/metrics").unwrap();
    assert_eq!(status, 200);
    let count = |result: &str| {
        sample(
            &text,
            &format!("stockgate_requests_total{{command=\"deduct\",result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("ok"), Some(1.0));
    assert_eq!(count("duplicate"), Some(1.0));
    assert_eq!(count("insufficient"), Some(1.0));
    assert_eq!(count("invalid"), Some(1.0));
    assert_eq!(count("error"), Some(1.0));
    assert_eq!(
        sample(
            &text,
            "stockgate_upstream_errors_total{kind=\"unknown_sku\"}"
        ),
        Some(1.0)
    );
    assert_eq!(sample(&text, "stockgate_client_connections"), Some(1.0));
    assert!(text.contains("# TYPE stockgate_request_duration_seconds histogram"));
    assert_eq!(
        sample(
            &text,
            "stockgate_request_duration_seconds_count{command=\"deduct\",result=\"ok\"}"
        ),
        Some(1.0)
    );
    assert!(text.contains("le=\"0.0005\""), "sub-millisecond buckets");
    let build = format!(
        "stockgate_build_info{{version=\"{}\",script_version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        stockgate::outcome::SCRIPT_VERSION
    );
    assert!(text.contains(&build), "{build} missing");
    for secret in [
        "metered-sku-XYZ",
        "secret-request-id",
        "ORDER-SECRET",
        "another-id",
    ] {
        assert!(!text.contains(secret), "{secret} leaked into /metrics");
    }
    drop(conn);
    loop_until(Duration::from_secs(5), || {
        let (_, text) = http_get(server.admin_addr.port(), "/metrics").unwrap();
        (sample(&text, "stockgate_client_connections") == Some(0.0)).then_some(())
    });
}

/// Calls of each command `conn`'s node has served so far (INFO
/// commandstats), without INFO itself: the test's own reads.
fn command_calls(conn: &mut redis::Connection) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// What a healthy sidecar costs the cluster while nobody uses it: the
/// commands its background work sends to a 3-primary cluster, counted by
/// the servers themselves (a script's own commands included) over a
/// window. A fleet multiplies this by its size (1,000 sidecars at the
/// former 14 commands per second were 14,000). A lone sidecar also leads
/// the hold sweep, which costs the fleet one lease look (its script and
/// three commands) every `sweeper::IDLE_EVERY` whatever its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_sends_at_most_one_command_every_two_seconds() {
    const WINDOW: Duration = Duration::from_secs(20);
    /// The budget: 0.5 commands per second per healthy sidecar...
    const PER_SECOND: f64 = 0.5;
    // ... and the sweep leader's looks, four commands each.
    let leader = (WINDOW.as_secs() / stockgate::stock::sweeper::IDLE_EVERY.as_secs() + 1) * 4;
    /// For a check that straddles the window's start or end.
    const SLACK: u64 = 3;
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    // Connections first: opening one sends commands of its own.
    let mut primaries: Vec<redis::Connection> = cluster.nodes[..cluster.masters]
        .iter()
        .map(|node| node.connection().unwrap())
        .collect();
    let before: Vec<_> = primaries.iter_mut().map(command_calls).collect();
    tokio::time::sleep(WINDOW).await;
    let after: Vec<_> = primaries.iter_mut().map(command_calls).collect();
    let mut sent = std::collections::BTreeMap::<String, u64>::new();
    for (before, after) in before.iter().zip(&after) {
        for (name, calls) in after {
            *sent.entry(name.clone()).or_default() +=
                calls - before.get(name).copied().unwrap_or(0);
        }
    }
    sent.retain(|_, calls| *calls > 0);
    let total: u64 = sent.values().sum();
    eprintln!(
        "an idle stockgate sent {total} commands in {WINDOW:?} to 3 primaries ({:.2}/s): {sent:?}",
        total as f64 / WINDOW.as_secs_f64()
    );
    let budget = (PER_SECOND * WINDOW.as_secs_f64()) as u64 + leader + SLACK;
    assert!(
        total <= budget,
        "{total} commands, budget {budget}: {sent:?}"
    );
    assert!(server.is_ready(), "and it is still ready");
    assert!(total > 0, "it still checks on the cluster: {sent:?}");
}

/// Fewer background commands must not make readiness lie: with no
/// request to fail, an idle sidecar still notices the cluster going away
/// (by its periodic CLUSTER SLOTS), and comes back by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_still_notices_redis_going_away_and_coming_back() {
    let mut cluster = cluster();
    let server = proxy(cluster.seeds(), |c| {
        c.upstream.connect_timeout = Duration::from_millis(200);
        c.upstream.timeout = Duration::from_millis(500);
    })
    .await;
    let admin = server.admin_addr;
    for node in &mut cluster.nodes {
        node.kill();
    }
    let down = Instant::now();
    let (status, body) = tokio::task::spawn_blocking(move || {
        loop_until(Duration::from_secs(30), || {
            let (status, body) = http_get(admin.port(), "/readyz").unwrap();
            (status == 503).then_some((status, body))
        })
    })
    .await
    .unwrap();
    eprintln!(
        "idle: /readyz turned 503 {:?} after the cluster went down: {body}",
        down.elapsed()
    );
    assert_eq!(status, 503);
    assert!(body.starts_with("not ready: "), "{body}");
    for node in &mut cluster.nodes {
        node.restart().unwrap();
    }
    cluster
        .wait_for("the restarted cluster", |info, _| {
            info.contains("cluster_state:ok")
        })
        .unwrap();
    assert!(
        server.wait_ready(Duration::from_secs(30)).await,
        "ready again without a request or a restart"
    );
}

/// The TCP keepalive of every socket this process has open to one of
/// `ports`: `(port, [SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL,
/// TCP_KEEPCNT])`, seconds and probes as the kernel holds them.
fn keepalive_to(ports: &[u16]) -> Vec<(u16, [i32; 4])> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: getpeername and getsockopt write at most the lengths
        // given into buffers of those lengths; an fd that is not a socket
        // (or closed since) makes them fail, and it is skipped.
        unsafe {
            let mut peer: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::getpeername(fd, (&raw mut peer).cast(), &mut len) != 0
                || i32::from(peer.sin_family) != libc::AF_INET
            {
                continue;
            }
            let port = u16::from_be(peer.sin_port);
            if !ports.contains(&port) {
                continue;
            }
            let option = |level, name| {
                let mut value: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                libc::getsockopt(fd, level, name, (&raw mut value).cast(), &mut len);
                value
            };
            found.push((
                port,
                [
                    option(libc::SOL_SOCKET, libc::SO_KEEPALIVE),
                    option(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
                    option(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
                    option(libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
                ],
            ));
        }
    }
    found
}

/// Every upstream connection, the node pipes' and the redis crate's, has
/// TCP keepalive as docs/operations.md documents it: the first probe after 10 s
/// without traffic, then one every 5 s, reset after 3 unanswered. A flow
/// the network drops while idle (a conntrack or NAT entry gone) is then
/// found within 25 s, instead of by the next request's timeout (issue 23,
/// 2). Standalone and cluster: the redis crate opens each in its own way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_upstream_connection_has_tcp_keepalive() {
    for clustered in [false, true] {
        let (_servers, seeds, ports): (Box<dyn std::any::Any>, Vec<String>, Vec<u16>) = if clustered
        {
            let cluster = cluster();
            let seeds = cluster.seeds();
            let ports = cluster.nodes.iter().map(|n| n.port).collect();
            set_stock(&cluster, "kept-alive", 10);
            (Box::new(cluster), seeds, ports)
        } else {
            let redis = standalone();
            redis::cmd("SET")
                .arg(stock_key("kept-alive"))
                .arg(10)
                .query::<()>(&mut redis.node.connection().unwrap())
                .unwrap();
            let (seeds, ports) = (vec![redis.url()], vec![redis.node.port]);
            (Box::new(redis), seeds, ports)
        };
        let server = proxy(seeds, |_| {}).await;
        let mut conn = client(&server, false).await;
        // A DEDUCT opens its node pipe; a STOCK.GET uses the redis crate.
        let reply = parse(
            deduct(&mut conn, "kept-alive", "1", "k1", None)
                .await
                .unwrap(),
        );
        assert_eq!(reply.code, 0);
        let stock: i64 = redis::cmd("STOCK.GET")
            .arg("kept-alive")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(stock, 9);
        // The test's own connections to the servers are closed by now: every
        // socket to them is stockgate's.
        let sockets = keepalive_to(&ports);
        eprintln!("cluster {clustered}: stockgate's upstream sockets {sockets:?}");
        assert!(
            sockets.len() >= 2,
            "cluster {clustered}: the node pipe's and the redis crate's connections, at least: {sockets:?}"
        );
        for (port, settings) in &sockets {
            assert_eq!(
                *settings,
                [1, 10, 5, 3],
                "cluster {clustered}: the connection to :{port} keeps alive as documented"
            );
        }
        server.stop_now();
    }
}

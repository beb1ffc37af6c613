//! Client authentication, protected mode, limits, TLS to Redis, and
//! secrets kept out of logs, INFO and metrics.

mod support;

use redis::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use stockgate::auth::Password;
use stockgate::dev::{LocalRedis, RedisOptions};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_but_auth_hello_quit_reset_needs_the_password() {
    let cluster = cluster();
    set_stock(&cluster, "guarded", 5);
    let server = proxy(cluster.seeds(), |c| c.password = Password::new("client-pw")).await;
    let mut request = Vec::new();
    for args in [
        &["PING"][..],
        &["RESET"],
        &["DEDUCT", "guarded", "1", "a"],
        &["INFO"],
        &["CLIENT", "SETNAME", "x"],
        &["HELLO", "3"],
        &["AUTH", "wrong"],
        &["AUTH", "admin", "client-pw"],
        &["HELLO", "3", "AUTH", "default", "wrong"],
        &["AUTH", "client-pw"],
        &["DEDUCT", "guarded", "1", "a"],
        &["QUIT"],
    ] {
        request.extend_from_slice(&encode_request(args));
    }
    let got = raw_until(server.addr, &request, "+OK\r\n+OK\r\n");
    let expected = [
        // PING too, as in Redis (tests/conformance.rs compares them).
        "-NOAUTH Authentication required.",
        "+RESET",
        "-NOAUTH Authentication required.",
        "-NOAUTH Authentication required.",
        "-NOAUTH Authentication required.",
        "-NOAUTH HELLO must be called with the client already authenticated",
        "-WRONGPASS invalid username-password pair or user is disabled.",
        "-WRONGPASS invalid username-password pair or user is disabled.",
        "-WRONGPASS invalid username-password pair or user is disabled.",
        "+OK",
        "*4",
    ];
    let lines: Vec<&str> = got.split("\r\n").collect();
    let mut at = 0;
    for want in expected {
        while !lines[at].starts_with(want.split(' ').next().unwrap())
            || !lines[at].starts_with(want)
        {
            at += 1;
            assert!(at < lines.len(), "{want:?} missing in {got:?}");
        }
        at += 1;
    }
    assert_eq!(
        get_stock(&cluster, "guarded"),
        Some(4),
        "only the authenticated DEDUCT ran"
    );
    let metrics = server.shared().metrics.render();
    // Counted by the user a login named: `default` twice; `admin` is no
    // user, and a name a client makes up is never a label.
    assert!(
        metrics.contains("stockgate_auth_failures_total{user=\"default\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("stockgate_auth_failures_total{user=\"\"} 1"),
        "{metrics}"
    );

    // Real clients authenticate the usual way: the password in the URL.
    for resp3 in [false, true] {
        let url = format!(
            "redis://:client-pw@{}{}",
            server.addr,
            if resp3 { "/?protocol=resp3" } else { "" }
        );
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let reply = parse(
            deduct(&mut conn, "guarded", "1", &format!("url-{resp3}"), None)
                .await
                .unwrap(),
        );
        assert_eq!(reply.code, 0);
    }
    let wrong = redis::Client::open(format!("redis://:nope@{}", server.addr))
        .unwrap()
        .get_multiplexed_async_connection()
        .await;
    assert!(wrong.is_err(), "a wrong password is refused at connect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_needs_the_password_as_a_bearer_token() {
    let cluster = cluster();
    set_stock(&cluster, "web-guarded", 5);
    let server = proxy(cluster.seeds(), |c| {
        c.password = Password::new("client-pw");
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let http = server.http_addr.unwrap();
    let send = |auth: Option<&str>| {
        let body = r#"{"sku":"web-guarded","qty":1,"request_id":"h1"}"#;
        let mut s = TcpStream::connect(http).unwrap();
        let auth = auth
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "POST /v1/deduct HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        response
    };
    // No credentials (a Basic token without a `:` carries none) say
    // NOAUTH; a wrong password says WRONGPASS, as RESP's.
    for (auth, said) in [
        (None, "NOAUTH"),
        (Some("Bearer wrong"), "WRONGPASS"),
        (Some("Basic Y2xpZW50LXB3"), "NOAUTH"),
    ] {
        let response = send(auth);
        assert!(response.starts_with("HTTP/1.1 401"), "{auth:?}: {response}");
        assert!(
            response
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer")
        );
        assert!(
            response.contains(&format!("{{\"error\":\"{said}")),
            "{auth:?}: {response}"
        );
    }
    // A route that is no route: a 404 that says so.
    let mut s = TcpStream::connect(http).unwrap();
    write!(
        s,
        "GET /v1/nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
    assert!(
        response.ends_with(r#"{"error":"no such route"}"#),
        "{response}"
    );
    assert_eq!(get_stock(&cluster, "web-guarded"), Some(5));
    let response = send(Some("Bearer client-pw"));
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(get_stock(&cluster, "web-guarded"), Some(4));
}

#[test]
fn protected_mode_refuses_a_public_listener_without_a_password() {
    let out = Command::new(stockgate_bin())
        .args([
            "serve",
            "--upstream",
            "redis://127.0.0.1:1",
            "--listen",
            "0.0.0.0:6390",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to serve --listen 0.0.0.0:6390 without a client password"),
        "{err}"
    );
    assert!(err.contains("--allow-unauthenticated-remote"), "{err}");
    let out = Command::new(stockgate_bin())
        .args([
            "serve",
            "--upstream",
            "redis://127.0.0.1:1",
            "--http-listen",
            "0.0.0.0:8390",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--http-listen 0.0.0.0:8390"));

    // With the flag, or a password, the configuration is accepted (checked
    // without binding: tests stay on loopback).
    use clap::Parser;
    for extra in [
        &["--allow-unauthenticated-remote"][..],
        &["--requirepass", "pw"],
    ] {
        let mut argv = vec![
            "stockgate",
            "serve",
            "--upstream",
            "redis://127.0.0.1:1",
            "--listen",
            "0.0.0.0:6390",
        ];
        argv.extend_from_slice(extra);
        let stockgate::config::Cli {
            command: stockgate::config::Command::Serve(args),
        } = stockgate::config::Cli::try_parse_from(argv).unwrap()
        else {
            unreachable!()
        };
        assert!(args.proxy.validate(args.upstream).is_ok(), "{extra:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_clients_refuses_the_one_too_many_and_idle_clients_time_out() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| {
        c.max_clients = 2;
        c.idle_timeout = Some(Duration::from_millis(500));
    })
    .await;
    let mut a = TcpStream::connect(server.addr).unwrap();
    let mut b = TcpStream::connect(server.addr).unwrap();
    for s in [&mut a, &mut b] {
        s.write_all(b"PING\r\n").unwrap();
        let mut pong = [0u8; 7];
        s.read_exact(&mut pong).unwrap();
    }
    let (got, closed) = raw(server.addr, b"PING\r\n", 1000);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR max number of clients reached\r\n"
    );
    assert!(closed);

    // `a` keeps talking; `b` goes quiet and is closed after the idle timeout.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        a.write_all(b"PING\r\n").unwrap();
        let mut pong = [0u8; 7];
        a.read_exact(&mut pong).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed_by_peer(&mut b), "the idle connection was closed");
    // Its place is free again, once the closed connection's linger for
    // what the client still sends (at most a second) is over.
    let freed = Instant::now();
    loop {
        let (got, _) = raw(server.addr, b"PING\r\n", 7);
        if got == b"+PONG\r\n" {
            break;
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR ma",
            "refused, or served"
        );
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "the place of a connection closed for being idle is never freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_redis_with_a_ca_and_client_certificates() {
    let certs = support::certs::Certs::for_server("IP:127.0.0.1");
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = |f: &str| certs.param(f);
    let redis = LocalRedis::start(&RedisOptions {
        extra_args: vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            path("server.crt"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.crt"),
            "--tls-auth-clients".into(),
            "yes".into(),
        ],
        ..RedisOptions::default()
    })
    .expect("redis-server with TLS (Debian's is built with it)");
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("tls-sku"))
        .arg(3)
        .query::<()>(&mut direct)
        .unwrap();
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let config = |ca: &str, client_cert: bool| {
        use clap::Parser;
        let mut argv = vec![
            "stockgate".to_owned(),
            "serve".into(),
            "--upstream".into(),
            url.clone(),
            "--upstream-tls-ca".into(),
            path(ca),
            "--connect-timeout".into(),
            "500ms".into(),
        ];
        if client_cert {
            argv.extend([
                "--upstream-tls-cert".into(),
                path("client.crt"),
                "--upstream-tls-key".into(),
                path("client.key"),
            ]);
        }
        let stockgate::config::Cli {
            command: stockgate::config::Command::Serve(args),
        } = stockgate::config::Cli::try_parse_from(argv).unwrap()
        else {
            unreachable!()
        };
        let mut config = args.proxy.validate(args.upstream).unwrap();
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.admin_listen = "127.0.0.1:0".parse().unwrap();
        config
    };

    let server = stockgate::server::start(config("ca.crt", true))
        .await
        .unwrap();
    assert!(
        server.wait_ready(Duration::from_secs(15)).await,
        "{:?}",
        server.shared().upstream.problem()
    );
    let mut conn = client(&server, false).await;
    let reply = parse(deduct(&mut conn, "tls-sku", "1", "t1", None).await.unwrap());
    assert_eq!((reply.code, reply.remain), (0, 2));
    assert!(server.drain(Duration::from_secs(5)).await);

    // A CA that didn't sign the server's certificate: a clear reason.
    let wrong = stockgate::server::start(config("other-ca.crt", true))
        .await
        .unwrap();
    assert!(!wrong.wait_ready(Duration::from_secs(3)).await);
    let problem = wrong.shared().upstream.problem().unwrap_or_default();
    assert!(
        problem.contains("not signed by --upstream-tls-ca"),
        "{problem}"
    );
    assert!(wrong.drain(Duration::from_secs(5)).await);

    // The server requires a client certificate; without one, no connection.
    let anonymous = stockgate::server::start(config("ca.crt", false))
        .await
        .unwrap();
    assert!(
        !anonymous.wait_ready(Duration::from_secs(3)).await,
        "tls-auth-clients yes refuses us"
    );
    assert!(anonymous.drain(Duration::from_secs(5)).await);
    let _ = Value::Nil;
}

#[test]
fn secrets_never_reach_logs_info_or_metrics() {
    const UPSTREAM_SECRET: &str = "upstream-Secret-8472";
    const CLIENT_SECRET: &str = "client-Secret-1931";
    let redis = LocalRedis::start(&RedisOptions {
        password: Some(UPSTREAM_SECRET.into()),
        ..RedisOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("client-password");
    std::fs::write(&pw_file, format!("{CLIENT_SECRET}\n")).unwrap();
    // Ready: stockgate authenticated to Redis with the URL's password.
    let gate = Launch::new("serve")
        .env("STOCKGATE_UPSTREAM", redis.url())
        .env("STOCKGATE_REQUIREPASS_FILE", &pw_file)
        .env("STOCKGATE_LOG", "debug")
        .env("STOCKGATE_ACCESS_LOG", "all")
        .start();
    let port = gate.addr.port();
    // INFO needs the password, and a wrong one is refused.
    let wrong = redis_cli(port, &["-a", "not-it", "--no-auth-warning", "INFO"]);
    assert!(
        wrong.contains("WRONGPASS") || wrong.contains("NOAUTH"),
        "{wrong}"
    );
    let info = redis_cli(port, &["-a", CLIENT_SECRET, "--no-auth-warning", "INFO"]);
    assert!(
        info.contains("upstream_seeds:redis://:***@127.0.0.1"),
        "{info}"
    );
    redis_cli(
        port,
        &[
            "-a",
            CLIENT_SECRET,
            "--no-auth-warning",
            "DEDUCT",
            "nope",
            "1",
            "r",
        ],
    );
    let (_, metrics) = http_get(gate.admin.port(), "/metrics").unwrap();
    let (status, log) = gate.stop();
    assert!(status.success());
    assert!(
        log.contains("client connected"),
        "the log ran at debug level:\n{log}"
    );
    for (what, text) in [("log", &log), ("INFO", &info), ("/metrics", &metrics)] {
        for secret in [UPSTREAM_SECRET, CLIENT_SECRET] {
            assert!(
                !text.contains(secret),
                "{secret} leaked into the {what}:\n{text}"
            );
        }
    }
}

/// A stockgate serving TLS (client certificates of the test CA required)
/// with a users file where `certuser` is an operator, in front of the
/// shared cluster.
fn tls_gate(certs: &support::certs::Certs, extra: &[&str]) -> (Stockgate, tempfile::TempDir) {
    use support::certs::CLIENT_USER;
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    std::fs::write(
        &users,
        format!("[users.{CLIENT_USER}]\npasswords = [\"cert-pw\"]\nrights = [\"operator\"]\n"),
    )
    .unwrap();
    let gate = Launch::serve(&shared_cluster().seeds())
        .arg("--tls-cert")
        .arg(certs.path("server.crt"))
        .arg("--tls-key")
        .arg(certs.path("server.key"))
        .arg("--tls-client-ca")
        .arg(certs.path("ca.crt"))
        .arg("--users-file")
        .arg(&users)
        .args(extra)
        .start();
    (gate, dir)
}

/// Sends `request` (inline) on a TLS connection and reads one reply line
/// (a bulk reply's text for `$`), or "" at the end of the stream.
async fn ask<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    request: &str,
) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    stream
        .write_all(format!("{request}\r\n").as_bytes())
        .await
        .unwrap();
    let mut reader = tokio::io::BufReader::new(stream);
    let mut line = String::new();
    let _ = reader.read_line(&mut line).await;
    if line.starts_with('$') {
        line.clear();
        let _ = reader.read_line(&mut line).await;
    }
    line
}

/// A TLS client is one socket, and its session is served on that socket:
/// no loopback pair made per connection (which any local process could
/// connect to first and be handed the client's logged-in session), and
/// nothing listening but the configured ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_session_is_served_on_the_clients_own_socket() {
    let certs = support::certs::Certs::for_server("IP:127.0.0.1");
    let (gate, _dir) = tls_gate(&certs, &[]);
    let tls = certs.tls_client("client");
    let resp_port = gate.addr.port();
    let redis_ports: std::collections::HashSet<u16> =
        shared_cluster().nodes.iter().map(|n| n.port).collect();
    // Sockets other than the upstream's, and how many.
    let own = |gate: &Stockgate| -> Vec<support::launch::Socket> {
        gate.sockets()
            .into_iter()
            .filter(|s| !redis_ports.contains(&s.remote.port()))
            .collect()
    };
    let before = own(&gate).len();

    let mut first = support::certs::connect_tls(&tls, resp_port).await.unwrap();
    let info = ask(&mut first, "CLIENT INFO").await;
    assert!(
        info.contains(&format!("user={}", support::certs::CLIENT_USER)),
        "logged in by its certificate: {info}"
    );
    let mut clients = vec![first];
    for _ in 0..10 {
        let mut more = support::certs::connect_tls(&tls, resp_port).await.unwrap();
        assert_eq!(ask(&mut more, "PING").await, "+PONG\r\n");
        clients.push(more);
    }
    let sockets = own(&gate);
    let listening: std::collections::BTreeSet<u16> = sockets
        .iter()
        .filter(|s| s.listening)
        .map(|s| s.local.port())
        .collect();
    assert_eq!(
        listening,
        [resp_port, gate.admin.port()].into_iter().collect(),
        "stockgate listens on the configured ports only: {sockets:#?}"
    );
    let locals: std::collections::HashSet<std::net::SocketAddr> =
        sockets.iter().map(|s| s.local).collect();
    for socket in sockets.iter().filter(|s| !s.listening) {
        assert!(
            !locals.contains(&socket.remote),
            "stockgate holds both ends of a loopback connection (a relay another \
             process could reach): {socket:?} in {sockets:#?}"
        );
    }
    for client in &clients {
        let client_end = client.get_ref().0.local_addr().unwrap();
        let served: Vec<_> = sockets.iter().filter(|s| s.remote == client_end).collect();
        assert_eq!(served.len(), 1, "{client_end}: {sockets:#?}");
        assert_eq!(served[0].local.port(), resp_port);
    }
    assert_eq!(
        sockets.len() - before,
        clients.len(),
        "one socket (one descriptor) per TLS connection: {sockets:#?}"
    );
    drop(clients);
    let (status, log) = gate.stop();
    assert!(status.success(), "{log}");
}

/// `--max-clients` counts a TLS connection from its accept, before its
/// handshake: the one too many is told so (over TLS) and closed; a
/// connection that never finishes its handshake is dropped within
/// HANDSHAKE_TIMEOUT; refusals are bounded too, so descriptors stay
/// bounded however many connect; and a client is served again as soon
/// as a place is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_clients_bounds_tls_connections_from_their_accept() {
    const MAX: usize = 8;
    let certs = support::certs::Certs::for_server("IP:127.0.0.1");
    let (gate, _dir) = tls_gate(&certs, &["--max-clients", &MAX.to_string()]);
    let tls = certs.tls_client("client");
    let port = gate.addr.port();
    let served = |gate: &Stockgate| {
        gate.sockets()
            .iter()
            .filter(|s| !s.listening && s.local.port() == port)
            .count()
    };
    let served_now = || async {
        let mut client = support::certs::connect_tls(&tls, port).await.ok()?;
        (ask(&mut client, "PING").await == "+PONG\r\n").then_some(client)
    };
    let told_full = || async {
        let mut client = support::certs::connect_tls(&tls, port).await.unwrap();
        let mut said = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut client, &mut said).await;
        said
    };

    // One place taken by a client that never says a word, the others by
    // TLS clients that logged in and wait.
    let mut silent = TcpStream::connect(gate.addr).unwrap();
    let mut idle = Vec::new();
    for _ in 1..MAX {
        idle.push(served_now().await.expect("a place for each"));
    }
    assert_eq!(
        served(&gate),
        MAX,
        "one socket per connection: {:#?}",
        gate.sockets()
    );
    let full = gate.descriptors();

    // The one too many: its handshake, then the error, then the close.
    assert_eq!(told_full().await, "-ERR max number of clients reached\r\n");

    // A flood of connections past the limit that never handshake: each is
    // refused within its bound, and at most REFUSALS (64) at once.
    let flood: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(gate.addr).unwrap())
        .collect();
    let mut most = 0;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        most = most.max(gate.descriptors());
        std::thread::sleep(Duration::from_millis(20));
    }
    // (+2: the TLS and users files, read every second, may be open.)
    assert!(
        most <= full + 64 + 2,
        "descriptors stay bounded by --max-clients and the refusals in progress: \
         {most} at most, {full} with every place taken"
    );
    for mut stream in flood {
        assert!(
            closed_by_peer(&mut stream),
            "a refused connection is closed"
        );
    }

    // The silent client is dropped once its handshake's time is up
    // (10 s), and its place serves the next client.
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        match silent.read(&mut byte) {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        },
        "a connection that never finishes its handshake is closed"
    );
    let placed = loop_until_async(Duration::from_secs(10), served_now).await;
    assert_eq!(told_full().await, "-ERR max number of clients reached\r\n");
    // And as soon as a TLS client leaves.
    drop(idle.pop());
    let again = loop_until_async(Duration::from_secs(10), served_now).await;
    assert_eq!(served(&gate), MAX);
    drop((placed, again, idle));
    let (status, log) = gate.stop();
    assert!(status.success(), "{log}");
}

/// The HTTP face keeps at most `--http-max-connections` connections,
/// counted from their accept: a flood of idle connections past it waits in
/// the kernel's listen queue, holding nothing of stockgate's, and once
/// they go the face serves again.
#[test]
fn http_connections_are_bounded_from_their_accept() {
    const MAX: usize = 4;
    let http_port = free_port();
    let gate = Launch::serve(&shared_cluster().seeds())
        .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
        .args(["--http-max-connections", &MAX.to_string()])
        .start();
    let accepted = |gate: &Stockgate| {
        gate.sockets()
            .iter()
            .filter(|s| !s.listening && s.local.port() == http_port)
            .count()
    };
    let (status, _) = http_get(http_port, "/no-such-route").unwrap();
    assert_eq!(status, 404);

    let flood: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(("127.0.0.1", http_port)).unwrap())
        .collect();
    let mut most = 0;
    let watched = Instant::now();
    while most < MAX && watched.elapsed() < Duration::from_secs(20) {
        most = most.max(accepted(&gate));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(most, MAX, "every place is taken by the flood");
    for _ in 0..50 {
        most = most.max(accepted(&gate));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        most,
        MAX,
        "no more than --http-max-connections accepted: {:#?}",
        gate.sockets()
    );

    drop(flood);
    let (status, _) = http_get(http_port, "/no-such-route").unwrap();
    assert_eq!(status, 404, "served again once the flood is gone");
}

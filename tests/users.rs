//! Named users from `--users-file`: their rights over RESP and HTTP (a
//! denied command answers NOPERM and changes nothing), a password rotation
//! and a broken reload under load, a user removed, failed logins slowed
//! down, SIGHUP, `stockgate check`, and TLS (client certificates as users,
//! a certificate renewed under load). Every test shares one cluster
//! (`support::shared_cluster`), each on SKUs of its own.

mod support;

use base64::Engine;
use redis::Value;
use sha2::Digest;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use stockgate::config::UsersFile;
use support::*;

/// Writes `text` as the users file at `path` the way a Kubernetes Secret
/// update does: whole, by a rename, so a reader never sees half of it.
fn write_users(path: &Path, text: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

fn sha256_hex(password: &str) -> String {
    sha2::Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Three users, one right each; `checkout` only on `shop-` SKUs, and
/// `viewer`'s password given as its SHA-256.
fn three_users() -> String {
    format!(
        r#"
[users.checkout]
passwords = ["checkout-pw"]
rights = ["caller"]
skus = ["shop-"]

[users.viewer]
passwords = ["sha256:{}"]
rights = ["reader"]

[users.ops]
passwords = ["ops-pw"]
rights = ["operator"]
"#,
        sha256_hex("viewer-pw")
    )
}

/// Each `want` in order among the reply's lines (a reply's other lines
/// between them).
fn assert_in_order(got: &str, want: &[&str]) {
    let lines: Vec<&str> = got.split("\r\n").collect();
    let mut at = 0;
    for w in want {
        while lines.get(at).is_some_and(|l| l != w) {
            at += 1;
        }
        assert!(at < lines.len(), "{w:?} missing (in order) in {got:?}");
        at += 1;
    }
}

fn pipeline(commands: &[&[&str]]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in commands {
        out.extend(encode_request(c));
    }
    out.extend(encode_request(&["PING"]));
    out
}

fn http(port: u16, method: &str, path: &str, auth: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_gets_its_rights_and_a_denied_command_changes_nothing() {
    let cluster = shared_cluster();
    for sku in ["shop-u1", "shop-u2", "other-u1"] {
        set_stock(cluster, sku, 10);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    write_users(&path, &three_users());
    let server = proxy(cluster.seeds(), |c| {
        c.users = Some(UsersFile::read(&path).unwrap());
        c.admin_commands = true;
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;

    // A reader reads and nothing else, in Redis 7.2's words.
    let got = raw_until(
        server.addr,
        &pipeline(&[
            &["AUTH", "viewer", "viewer-pw"],
            &["DEDUCT", "shop-u1", "1", "v1"],
            &["STOCK.GET", "shop-u1"],
            &["STOCK.SET", "shop-u1", "99", "v-op"],
            &["ORDER", "v2", "shop-u1", "1"],
        ]),
        "+PONG\r\n",
    );
    assert_eq!(
        got,
        "+OK\r\n\
         -NOPERM User viewer has no permissions to run the 'deduct' command\r\n\
         :10\r\n\
         -NOPERM User viewer has no permissions to run the 'stock.set' command\r\n\
         -NOPERM User viewer has no permissions to run the 'order' command\r\n\
         +PONG\r\n"
    );
    // A caller on `shop-` SKUs: the order flow there, and nothing outside.
    let got = raw_until(
        server.addr,
        &pipeline(&[
            &["AUTH", "checkout", "checkout-pw"],
            &["DEDUCT", "other-u1", "1", "c1"],
            &["ORDER", "c2", "shop-u1", "1", "other-u1", "1"],
            &["ORDER.STATUS", "c2"],
            &["STOCK.ADD", "shop-u1", "5", "c-op"],
            &["DEDUCT", "shop-u1", "1", "c3"],
            &["STOCK.GET", "shop-u1"],
        ]),
        "+PONG\r\n",
    );
    assert_in_order(
        &got,
        &[
            "+OK",
            "-NOPERM No permissions to access a key",
            "-NOPERM No permissions to access a key",
            "-NOPERM No permissions to access a key",
            "-NOPERM User checkout has no permissions to run the 'stock.add' command",
            "*4",
            ":0",
            ":9",
            ":9",
            "+PONG",
        ],
    );
    // ORDER.CONFIRM by an order's id alone names no SKU to check: refused
    // to a user limited to prefixes, who confirms by naming the lines.
    let got = raw_until(
        server.addr,
        &pipeline(&[
            &["AUTH", "checkout", "checkout-pw"],
            &["ORDER.HOLD", "c4", "600000", "shop-u2", "1"],
            &["ORDER.CONFIRM", "c4"],
            &["ORDER.CONFIRM", "c4", "other-u1", "1"],
            &["ORDER.CONFIRM", "c4", "shop-u2", "1"],
            &["STOCK.GET", "shop-u2"],
        ]),
        "+PONG\r\n",
    );
    assert_in_order(
        &got,
        &[
            "+OK",
            "*5",
            ":0",
            "-NOPERM No permissions to access a key",
            "-NOPERM No permissions to access a key",
            "*5",
            ":0",
            ":9",
            "+PONG",
        ],
    );
    assert_eq!(held(cluster, "shop-u2"), 0, "{got}");
    // An operator corrects stock, and takes no part in the order flow.
    let got = raw_until(
        server.addr,
        &pipeline(&[
            &["AUTH", "ops", "ops-pw"],
            &["DEDUCT", "other-u1", "1", "o1"],
            &["STOCK.ADD", "other-u1", "5", "o-op"],
            &["STOCK.GET", "other-u1"],
        ]),
        "+PONG\r\n",
    );
    assert_in_order(
        &got,
        &[
            "+OK",
            "-NOPERM User ops has no permissions to run the 'deduct' command",
            "*4",
            ":0",
            ":15",
            ":15",
            "+PONG",
        ],
    );

    // Real clients: redis-cli --user, and redis-rs logging in with HELLO 3
    // AUTH (RESP3) and with AUTH (RESP2).
    let cli = redis_cli(
        server.addr.port(),
        &[
            "--user",
            "viewer",
            "--pass",
            "viewer-pw",
            "--no-auth-warning",
            "DEDUCT",
            "shop-u1",
            "1",
            "cli-1",
        ],
    );
    assert!(
        cli.contains("NOPERM User viewer has no permissions to run the 'deduct' command"),
        "{cli}"
    );
    for (resp3, id) in [(true, "rs-3"), (false, "rs-2")] {
        let url = format!(
            "redis://checkout:checkout-pw@{}{}",
            server.addr,
            if resp3 { "/?protocol=resp3" } else { "" }
        );
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let denied = redis::cmd("STOCK.SET")
            .arg("shop-u1")
            .arg(1)
            .arg(id)
            .query_async::<Value>(&mut conn)
            .await
            .unwrap_err();
        assert_eq!(denied.code(), Some("NOPERM"), "{denied}");
        let reply = parse(deduct(&mut conn, "shop-u1", "1", id, None).await.unwrap());
        assert_eq!(reply.code, 0);
    }

    // HTTP: a bearer token per user, or Basic; 403 with the same words.
    let port = server.http_addr.unwrap().port();
    let body = |sku: &str, id: &str| format!(r#"{{"sku":"{sku}","qty":1,"request_id":"{id}"}}"#);
    let response = http(
        port,
        "POST",
        "/v1/deduct",
        "Bearer checkout:checkout-pw",
        &body("other-u1", "h1"),
    );
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.ends_with(r#"{"error":"NOPERM No permissions to access a key"}"#),
        "{response}"
    );
    let basic = base64::engine::general_purpose::STANDARD.encode("viewer:viewer-pw");
    let response = http(
        port,
        "POST",
        "/v1/deduct",
        &format!("Basic {basic}"),
        &body("shop-u1", "h2"),
    );
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(
        response.contains("NOPERM User viewer has no permissions to run the 'deduct' command"),
        "{response}"
    );
    let response = http(port, "GET", "/v1/orders/h3", &format!("Basic {basic}"), "");
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "a reader reads: {response}"
    );
    let response = http(
        port,
        "GET",
        "/v1/orders/h3",
        "Bearer checkout:checkout-pw",
        "",
    );
    assert!(
        response.starts_with("HTTP/1.1 403"),
        "an order by its id alone names no SKU: {response}"
    );
    let response = http(
        port,
        "POST",
        "/v1/deduct",
        "Bearer checkout:wrong",
        &body("shop-u1", "h4"),
    );
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    let response = http(
        port,
        "POST",
        "/v1/deduct",
        "Bearer checkout:checkout-pw",
        &body("shop-u1", "h5"),
    );
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    // Nothing a denied command named changed: the stock moved only by the
    // commands allowed (3 DEDUCTs and the HTTP one on shop-u1; STOCK.ADD
    // on other-u1), and the denied request_ids left no record.
    assert_eq!(get_stock(cluster, "shop-u1"), Some(10 - 1 - 2 - 1));
    assert_eq!(get_stock(cluster, "other-u1"), Some(15));
    let mut conn = cluster.cluster_connection().unwrap();
    for (sku, id) in [
        ("shop-u1", "v1"),
        ("other-u1", "c1"),
        ("other-u1", "o1"),
        ("shop-u1", "cli-1"),
        ("other-u1", "h1"),
        ("shop-u1", "h2"),
    ] {
        assert_eq!(record_state(&mut conn, sku, id), '-', "{sku} {id}");
    }
    for (user, command, count) in [
        ("viewer", "deduct", 3),
        ("viewer", "stock.set", 1),
        ("viewer", "order", 1),
        ("checkout", "deduct", 2),
        ("checkout", "order", 1),
        ("checkout", "order.status", 2),
        ("checkout", "stock.add", 1),
        ("checkout", "stock.set", 2),
        ("ops", "deduct", 1),
    ] {
        assert_eq!(
            metric(
                &server,
                &format!(
                    "stockgate_commands_denied_total{{user=\"{user}\",command=\"{command}\"}}"
                )
            ),
            count,
            "{user} {command}"
        );
    }
    assert_eq!(
        metric(&server, "stockgate_auth_failures_total{user=\"checkout\"}"),
        1
    );
    assert!(server.drain(Duration::from_secs(5)).await);
}

/// Load on one SKU through `tasks` connections, each logging in as `app`
/// with the password `current` holds when it connects, and connecting
/// again every few requests; every reply must be a deduction.
struct Load {
    stop: Arc<AtomicBool>,
    /// Logins with each password, by tasks.
    logins: Arc<[AtomicU64; 2]>,
    deducted: Arc<AtomicU64>,
    current: Arc<std::sync::Mutex<&'static str>>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>,
}

const OLD_PW: &str = "old-password";
const NEW_PW: &str = "new-password";

impl Load {
    fn start(addr: std::net::SocketAddr, sku: &'static str, tasks: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let logins: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let deducted = Arc::new(AtomicU64::new(0));
        let current = Arc::new(std::sync::Mutex::new(OLD_PW));
        let handles = (0..tasks)
            .map(|task| {
                let (stop, logins, deducted, current) = (
                    stop.clone(),
                    logins.clone(),
                    deducted.clone(),
                    current.clone(),
                );
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let password = *current.lock().unwrap();
                        // No response timeout: under CI's load a slow reply
                        // is not a refusal (the test asserts no time).
                        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                        let mut conn =
                            redis::Client::open(format!("redis://app:{password}@{addr}"))
                                .unwrap()
                                .get_multiplexed_async_connection_with_config(&config)
                                .await
                                .map_err(|e| {
                                    format!("task {task}: login with {password} refused: {e}")
                                })?;
                        logins[usize::from(password == NEW_PW)].fetch_add(1, Ordering::Relaxed);
                        for _ in 0..20 {
                            n += 1;
                            let reply = deduct(&mut conn, sku, "1", &format!("t{task}-{n}"), None)
                                .await
                                .map_err(|e| format!("task {task}: request {n} refused: {e}"))?;
                            let code = parse(reply).code;
                            if code != 0 {
                                return Err(format!("task {task}: request {n} answered {code}"));
                            }
                            deducted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        Load {
            stop,
            logins,
            deducted,
            current,
            tasks: handles,
        }
    }

    /// Waits until each task could have logged in `more` more times with
    /// `password` (counted over all tasks).
    async fn logins_with(&self, password: &str, more: u64) {
        let i = usize::from(password == NEW_PW);
        let from = self.logins[i].load(Ordering::Relaxed);
        loop_until_async(Duration::from_secs(20), || async {
            (self.logins[i].load(Ordering::Relaxed) >= from + more).then_some(())
        })
        .await;
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap().unwrap();
        }
        self.deducted.load(Ordering::Relaxed)
    }
}

fn app_with(passwords: &[&str]) -> String {
    let list: Vec<String> = passwords.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        "[users.app]\npasswords = [{}]\nrights = [\"caller\"]\n\n[users.other]\npasswords = [\"other-pw\"]\nrights = [\"reader\"]\n",
        list.join(", ")
    )
}

async fn reloads(server: &stockgate::server::Server, result: &str, count: u64) {
    let series = format!("stockgate_users_reloads_total{{result=\"{result}\"}}");
    loop_until_async(Duration::from_secs(10), || async {
        (metric(server, &series) >= count).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_rotates_and_a_broken_file_reloads_under_load_without_a_refusal() {
    let cluster = shared_cluster();
    const STOCK: i64 = 1_000_000;
    set_stock(cluster, "rotate-u2", STOCK);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    write_users(&path, &app_with(&[OLD_PW]));
    let server = proxy(cluster.seeds(), |c| {
        c.users = Some(UsersFile::read(&path).unwrap());
    })
    .await;
    let load = Load::start(server.addr, "rotate-u2", 4);
    load.logins_with(OLD_PW, 4).await;

    // The new password beside the old; the clients move to it.
    write_users(&path, &app_with(&[OLD_PW, NEW_PW]));
    reloads(&server, "applied", 1).await;
    *load.current.lock().unwrap() = NEW_PW;
    load.logins_with(NEW_PW, 4).await;
    // The old one removed: the connections logged in with it go on, new
    // logins use the new one.
    write_users(&path, &app_with(&[NEW_PW]));
    reloads(&server, "applied", 2).await;
    load.logins_with(NEW_PW, 4).await;
    // A broken file under load: refused, the users before it stay.
    write_users(
        &path,
        "[users.app]\npasswords = [\"x\"]\nrights = [\"caler\"]\n",
    );
    reloads(&server, "refused", 1).await;
    load.logins_with(NEW_PW, 4).await;
    let deducted = load.finish().await;
    assert!(deducted > 0);
    assert_eq!(
        get_stock(cluster, "rotate-u2"),
        Some(STOCK - deducted as i64),
        "every acknowledged deduction, and nothing else"
    );
    assert_eq!(
        metric(&server, "stockgate_users_reloads_total{result=\"applied\"}"),
        2
    );
    let old = redis::Client::open(format!("redis://app:{OLD_PW}@{}", server.addr))
        .unwrap()
        .get_multiplexed_async_connection()
        .await;
    assert!(old.is_err(), "the old password is gone");

    // Failed logins from one peer: the first few answered at once, then
    // later and later (counted; how long is the throttle's unit test's).
    let mut wrong = Vec::new();
    for _ in 0..6 {
        wrong.extend(encode_request(&["AUTH", "app", "guess"]));
    }
    wrong.extend(encode_request(&["AUTH", "app", NEW_PW]));
    let got = raw_until(server.addr, &wrong, "+OK\r\n");
    assert_eq!(got.matches("-WRONGPASS").count(), 6, "{got}");
    // 7 failures in a row from 127.0.0.1 (the old password's included):
    // the 5th, 6th and 7th waited.
    assert_eq!(metric(&server, "stockgate_auth_delayed_total"), 3);
    assert_eq!(
        metric(&server, "stockgate_auth_failures_total{user=\"app\"}"),
        7
    );

    // A user removed: its open connections close once answered.
    let mut open = TcpStream::connect(server.addr).unwrap();
    open.write_all(&encode_request(&["AUTH", "app", NEW_PW]))
        .unwrap();
    let mut ok = [0u8; 5];
    open.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    let mut other = TcpStream::connect(server.addr).unwrap();
    other
        .write_all(&encode_request(&["AUTH", "other", "other-pw"]))
        .unwrap();
    other.read_exact(&mut ok).unwrap();
    write_users(
        &path,
        "[users.other]\npasswords = [\"other-pw\"]\nrights = [\"reader\"]\n",
    );
    reloads(&server, "applied", 3).await;
    assert!(closed_by_peer(&mut open), "app's connection was closed");
    other.write_all(&encode_request(&["PING"])).unwrap();
    let mut pong = [0u8; 7];
    other.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"+PONG\r\n", "the other user's stays open");
    assert!(server.drain(Duration::from_secs(5)).await);
}

#[test]
fn a_broken_file_is_refused_at_start_sighup_reloads_and_no_password_is_ever_shown() {
    const SECRET: &str = "Secret-users-7741";
    let redis = standalone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");

    // At start, a mistake stops stockgate, naming the line, not its text.
    write_users(
        &path,
        &format!("[users.app]\npasswords = [\"{SECRET}\"]\nrights = [\"caller\", \"admin\"]\n"),
    );
    let out = Command::new(stockgate_bin())
        .arg("serve")
        .arg("--users-file")
        .arg(&path)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin-listen", &format!("127.0.0.1:{}", free_port())])
        .env("STOCKGATE_UPSTREAM", redis.url())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3: user `app`: unknown right `admin`"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");

    // `stockgate check` shows the users, never their passwords.
    write_users(
        &path,
        &format!(
            "[users.app]\npasswords = [\"{SECRET}\", \"sha256:{}\"]\nrights = [\"caller\"]\nskus = [\"shop-\"]\n\n[users.retired]\nrights = [\"reader\"]\n",
            sha256_hex(SECRET)
        ),
    );
    let check = Command::new(stockgate_bin())
        .args(["check", "--users-file", &path.display().to_string()])
        .env("STOCKGATE_UPSTREAM", redis.url())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(
        shown.contains("PASS  users            app (line 1): caller; SKUs shop-*; 2 passwords"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "WARN  users            retired (line 6): reader; every SKU; no password: cannot log in"
        ),
        "{shown}"
    );
    assert!(
        !shown.contains(SECRET) && !shown.contains(&sha256_hex(SECRET)),
        "{shown}"
    );

    let gate = Launch::new("serve")
        .arg("--users-file")
        .arg(&path)
        .env("STOCKGATE_UPSTREAM", redis.url())
        .env("STOCKGATE_LOG", "debug")
        .env("STOCKGATE_ACCESS_LOG", "all")
        .start();
    let (port, admin) = (gate.addr.port(), gate.admin.port());
    let login = |password: &str| {
        let port = port.to_string();
        let out = run(
            "redis-cli",
            &[
                "-p",
                &port,
                "--user",
                "app",
                "--pass",
                password,
                "--no-auth-warning",
                "PING",
            ],
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    assert_eq!(login(SECRET).trim(), "PONG");
    // The access log names the user.
    let port_text = port.to_string();
    run(
        "redis-cli",
        &[
            "-p",
            &port_text,
            "--user",
            "app",
            "--pass",
            SECRET,
            "--no-auth-warning",
            "DEDUCT",
            "shop-al",
            "1",
            "al-1",
        ],
    );
    // A broken file, then SIGHUP: refused, logged, counted; app stays.
    write_users(
        &path,
        &format!("[users.app]\npasswords = \"{SECRET}\"\nrights = [\"caller\"]\n"),
    );
    gate.signal(libc::SIGHUP);
    let refused = "stockgate_users_reloads_total{result=\"refused\"} ";
    let mut text = String::new();
    for _ in 0..200 {
        text = http_get(admin, "/metrics").unwrap().1;
        if text
            .lines()
            .any(|l| l.starts_with(refused) && !l.ends_with(" 0"))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with(refused) && !l.ends_with(" 0")),
        "{text}"
    );
    assert_eq!(login(SECRET).trim(), "PONG", "the users before it stay");
    // SIGHUP with the same, fixed file applies it.
    write_users(
        &path,
        "[users.app]\npasswords = [\"rotated-pw\"]\nrights = [\"caller\"]\n",
    );
    gate.signal(libc::SIGHUP);
    let mut rotated = String::new();
    for _ in 0..200 {
        rotated = login("rotated-pw");
        if rotated.trim() == "PONG" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rotated.trim(), "PONG");
    assert!(login(SECRET).contains("WRONGPASS"));
    // /metrics, read while stockgate still serves it.
    let (scraped, text) = http_get(admin, "/metrics").expect("stockgate serves /metrics");
    assert_eq!(scraped, 200, "{text}");
    assert!(text.contains("stockgate_users_reloads_total"), "{text}");
    let (status, log) = gate.stop();
    assert!(status.success());
    assert!(log.contains("users file refused"), "{log}");
    assert!(log.contains("line 2"), "the refusal names the line: {log}");
    assert!(log.contains("users file reloaded"), "{log}");
    assert!(
        log.lines().any(|l| l.contains("stockgate::access")
            && l.contains("request_id=\"al-1\"")
            && l.contains("user=\"app\"")),
        "the access log names the user: {log}"
    );
    for (what, shown) in [("log", &log), ("metrics", &text)] {
        for secret in [SECRET, "rotated-pw"] {
            assert!(
                !shown.contains(secret),
                "{secret} leaked into the {what}:\n{shown}"
            );
        }
    }
}

/// docs/operations.md's table of rights lists, for each right, exactly the
/// commands whose own description names it.
#[test]
fn the_documented_rights_are_the_commands_own() {
    use stockgate::auth::Right;
    use stockgate::stock::StockCommand;
    let page = std::fs::read_to_string(in_repo("docs/operations.md")).unwrap();
    for right in Right::ALL {
        let row = format!("| `{}` | ", right.name());
        let line = page
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("no row for {right:?}"));
        let cell = line[row.len()..].trim_end_matches(" |");
        let own = cell.trim_end_matches(", and every `reader` command");
        assert_eq!(
            own != cell,
            right != Right::Reader,
            "{right:?}: whether it says it includes the reads"
        );
        let mut documented: Vec<String> = own.split(", ").map(|c| c.to_ascii_lowercase()).collect();
        let mut described: Vec<String> = StockCommand::ALL
            .iter()
            .filter(|c| c.describe().right == right)
            .map(|c| c.name().to_owned())
            .collect();
        documented.sort();
        described.sort();
        assert_eq!(documented, described, "{right:?}");
    }
}

/// `redis-cli --tls` with `args`, its stdout and stderr.
fn redis_cli_tls(port: u16, tls: &[String], args: &[&str]) -> String {
    let port = port.to_string();
    let mut all: Vec<&str> = vec!["--tls", "-h", "127.0.0.1", "-p", &port];
    all.extend(tls.iter().map(String::as_str));
    all.extend_from_slice(args);
    let out = run("redis-cli", &all);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// DEDUCTs of one on a SKU, each task through one connection opened
/// before the load starts and kept to its end; a reply that is not a
/// deduction ends its task and is kept as the reason.
struct OpenLoad {
    stop: Arc<AtomicBool>,
    /// Deductions acknowledged, by task.
    deducted: Arc<Vec<AtomicU64>>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl OpenLoad {
    async fn start(client: &redis::Client, sku: &'static str, tasks: usize) -> OpenLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let deducted: Arc<Vec<AtomicU64>> =
            Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        // No response timeout: a slow reply on a busy machine is not a
        // failure; only an error is.
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut handles = Vec::new();
        for task in 0..tasks {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap();
            let (stop, deducted, failures) = (stop.clone(), deducted.clone(), failures.clone());
            handles.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let failure =
                        match deduct(&mut conn, sku, "1", &format!("open{task}-{n}"), None).await {
                            Ok(reply) if parse(reply.clone()).code == 0 => {
                                deducted[task].fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            Ok(reply) => format!("task {task}: request {n} answered {reply:?}"),
                            Err(e) => format!("task {task}: request {n} failed: {e}"),
                        };
                    failures.lock().unwrap().push(failure);
                    return;
                }
            }));
        }
        OpenLoad {
            stop,
            deducted,
            failures,
            tasks: handles,
        }
    }

    /// Waits until every task has had `more` more deductions acknowledged;
    /// fails at once with the reason if one of them ended.
    async fn progress(&self, more: u64) {
        let from: Vec<u64> = self
            .deducted
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect();
        loop_until_async(Duration::from_secs(30), || async {
            let failures = self.failures.lock().unwrap().clone();
            assert!(failures.is_empty(), "{failures:?}");
            self.deducted
                .iter()
                .zip(&from)
                .all(|(d, from)| d.load(Ordering::Relaxed) >= from + more)
                .then_some(())
        })
        .await;
    }

    /// Stops the load; the deductions acknowledged, after checking that
    /// every request was.
    async fn finish(self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        assert!(failures.is_empty(), "{failures:?}");
        self.deducted
            .iter()
            .map(|d| d.load(Ordering::Relaxed) as i64)
            .sum()
    }
}

/// The first certificate of a PEM file, DER.
fn pem_certificate(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(path)
        .unwrap()
        .to_vec()
}

/// A certificate's SHA-256 fingerprint, as `openssl x509 -fingerprint`
/// gives it (without the colons).
fn fingerprint(der: &[u8]) -> String {
    sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect()
}

/// The certificate a new TLS connection to `port` is served (DER): the
/// server's chain checked against any of `cas`' CA, `client`'s client
/// certificate presented.
async fn served_certificate(
    port: u16,
    cas: &[&support::certs::Certs],
    client: &support::certs::Certs,
) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from(pem_certificate(&ca.path("ca.crt"))))
            .unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![CertificateDer::from(pem_certificate(
            &client.path("client.crt"),
        ))],
        PrivateKeyDer::from_pem_file(client.path("client.key")).unwrap(),
    )
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
            tcp,
        )
        .await
        .expect("a TLS handshake with a certificate of one of the CAs");
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listeners_take_client_certificates_as_users_and_a_new_certificate_without_a_restart() {
    use support::certs::{CLIENT_USER, Certs};
    let cluster = shared_cluster();
    const STOCK: i64 = 1_000_000;
    set_stock(cluster, "tls-u5", STOCK);
    let first = Certs::for_server("IP:127.0.0.1");
    let second = Certs::for_server("IP:127.0.0.1");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let install = |certs: &Certs| {
        // As cert-manager renews: each file replaced whole.
        for (from, to) in [("server.crt", &cert), ("server.key", &key)] {
            write_users(to, &std::fs::read_to_string(certs.path(from)).unwrap());
        }
    };
    install(&first);
    let users = dir.path().join("users.toml");
    write_users(
        &users,
        &format!(
            "[users.{CLIENT_USER}]\npasswords = [\"cert-pw\"]\nrights = [\"caller\"]\n\n\
             [users.viewer]\npasswords = [\"viewer-pw\"]\nrights = [\"reader\"]\n"
        ),
    );
    let server = proxy(cluster.seeds(), |c| {
        c.users = Some(UsersFile::read(&users).unwrap());
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.tls = Some(stockgate::config::ListenerTls {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: Some(first.path("ca.crt")),
        });
    })
    .await;
    let port = server.addr.port();
    let with_ca = |ca: &Certs| {
        vec![
            "--cacert".to_owned(),
            ca.param("ca.crt"),
            "--cert".to_owned(),
            first.param("client.crt"),
            "--key".to_owned(),
            first.param("client.key"),
        ]
    };
    // The client certificate's name is a user: logged in as it, no AUTH.
    let got = redis_cli_tls(port, &with_ca(&first), &["DEDUCT", "tls-u5", "1", "tls-1"]);
    assert!(got.starts_with(&format!("0\n{}\n", STOCK - 1)), "{got}");
    let got = redis_cli_tls(
        port,
        &with_ca(&first),
        &["STOCK.SET", "tls-u5", "5", "tls-op"],
    );
    assert!(
        got.contains("NOPERM User certuser has no permissions to run the 'stock.set' command"),
        "{got}"
    );
    // Another user logs in with its password over the same TLS.
    let got = redis_cli_tls(
        port,
        &with_ca(&first),
        &[
            "--user",
            "viewer",
            "--pass",
            "viewer-pw",
            "--no-auth-warning",
            "STOCK.GET",
            "tls-u5",
        ],
    );
    assert_eq!(got.trim(), (STOCK - 1).to_string());
    // No client certificate: no connection (mTLS).
    let got = redis_cli_tls(
        port,
        &["--cacert".to_owned(), first.param("ca.crt")],
        &["PING"],
    );
    assert!(!got.contains("PONG"), "{got}");
    // HTTP over the same TLS, the certificate's user again.
    let http = server.http_addr.unwrap();
    let curl = |ca: &Certs, id: &str| {
        let out = run(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
                &ca.param("ca.crt"),
                "--cert",
                &first.param("client.crt"),
                "--key",
                &first.param("client.key"),
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "-d",
                &format!(r#"{{"sku":"tls-u5","qty":1,"request_id":"{id}"}}"#),
                &format!("https://127.0.0.1:{}/v1/deduct", http.port()),
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(&first, "tls-h1"), "200");

    // Connections open before the certificate changes, under load.
    let client = redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}"),
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(first.path("client.crt")).unwrap(),
                client_key: std::fs::read(first.path("client.key")).unwrap(),
            }),
            root_cert: Some(std::fs::read(first.path("ca.crt")).unwrap()),
        },
    )
    .unwrap();
    let load = OpenLoad::start(&client, "tls-u5", 3).await;
    load.progress(20).await;
    assert_eq!(
        fingerprint(&served_certificate(port, &[&first, &second], &first).await),
        fingerprint(&pem_certificate(&first.path("server.crt"))),
        "the first certificate, before the renewal"
    );

    // The certificate renewed (another CA, as a rotation to a new issuer
    // shows): new connections get it, the open ones go on.
    let applied = "stockgate_tls_reloads_total{result=\"applied\"}";
    let applied_before = metric(&server, applied);
    install(&second);
    loop_until_async(Duration::from_secs(10), || async {
        (metric(&server, applied) > applied_before).then_some(())
    })
    .await;
    assert_eq!(
        fingerprint(&served_certificate(port, &[&first, &second], &first).await),
        fingerprint(&pem_certificate(&second.path("server.crt"))),
        "a new connection after the renewal"
    );
    let got = redis_cli_tls(port, &with_ca(&second), &["DEDUCT", "tls-u5", "1", "tls-3"]);
    assert!(got.starts_with("0\n"), "the new certificate: {got}");
    let got = redis_cli_tls(port, &with_ca(&first), &["PING"]);
    assert!(!got.contains("PONG"), "the old certificate is gone: {got}");
    assert_eq!(curl(&second, "tls-h2"), "200");
    load.progress(20).await;
    // A broken pair (a key that is not the certificate's): refused, the
    // certificate before it stays.
    let refused = "stockgate_tls_reloads_total{result=\"refused\"}";
    let refused_before = metric(&server, refused);
    write_users(
        &key,
        &std::fs::read_to_string(first.path("server.key")).unwrap(),
    );
    loop_until_async(Duration::from_secs(10), || async {
        (metric(&server, refused) > refused_before).then_some(())
    })
    .await;
    let got = redis_cli_tls(port, &with_ca(&second), &["PING"]);
    assert_eq!(got.trim(), "PONG");
    load.progress(20).await;
    let deducted = load.finish().await;
    assert_eq!(get_stock(cluster, "tls-u5"), Some(STOCK - 4 - deducted));
    assert!(server.drain(Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_s_dns_name_is_its_user_before_its_common_name() {
    use support::certs::{CLIENT_USER, Certs};
    let cluster = shared_cluster();
    set_stock(cluster, "tls-u6", 10);
    let certs = Certs::for_server("IP:127.0.0.1");
    // Its common name is a caller, its DNS name a reader: the DNS name
    // decides.
    certs.client("san-client", CLIENT_USER, "viewer");
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.toml");
    write_users(
        &users,
        &format!(
            "[users.{CLIENT_USER}]\npasswords = [\"cert-pw\"]\nrights = [\"caller\"]\n\n\
             [users.viewer]\npasswords = [\"viewer-pw\"]\nrights = [\"reader\"]\n"
        ),
    );
    let server = proxy(cluster.seeds(), |c| {
        c.users = Some(UsersFile::read(&users).unwrap());
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.tls = Some(stockgate::config::ListenerTls {
            cert: certs.path("server.crt"),
            key: certs.path("server.key"),
            client_ca: Some(certs.path("ca.crt")),
        });
    })
    .await;
    let tls = [
        "--cacert".to_owned(),
        certs.param("ca.crt"),
        "--cert".to_owned(),
        certs.param("san-client.crt"),
        "--key".to_owned(),
        certs.param("san-client.key"),
    ];
    let port = server.addr.port();
    let got = redis_cli_tls(port, &tls, &["STOCK.GET", "tls-u6"]);
    assert_eq!(got.trim(), "10", "logged in as a reader, without AUTH");
    let got = redis_cli_tls(port, &tls, &["DEDUCT", "tls-u6", "1", "san-1"]);
    assert!(
        got.contains("NOPERM User viewer has no permissions to run the 'deduct' command"),
        "{got}"
    );
    // Over HTTP, the same certificate is the same user.
    let http = server.http_addr.unwrap();
    let out = run(
        "curl",
        &[
            "-s",
            "-w",
            "\n%{http_code}",
            "--cacert",
            &certs.param("ca.crt"),
            "--cert",
            &certs.param("san-client.crt"),
            "--key",
            &certs.param("san-client.key"),
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-d",
            r#"{"sku":"tls-u6","qty":1,"request_id":"san-h1"}"#,
            &format!("https://127.0.0.1:{}/v1/deduct", http.port()),
        ],
    );
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(
        got.ends_with("\n403") && got.contains("NOPERM User viewer"),
        "{got}"
    );
    assert_eq!(get_stock(cluster, "tls-u6"), Some(10));
    assert_eq!(
        metric(
            &server,
            "stockgate_commands_denied_total{user=\"viewer\",command=\"deduct\"}"
        ),
        2
    );
    assert!(server.drain(Duration::from_secs(5)).await);
}

/// One login attempt through a face: whether it logged in.
type Attempt<'a> = dyn Fn(&str, &str) -> bool + 'a;

/// Guesses at `ops`'s password from one address, with another user's
/// right password in between, through `attempt`: every guess waits at
/// least what the throttle documents for its place in the count of
/// failures at `ops`, whatever other logins succeed in between; only
/// `ops`'s own login starts that count over.
fn guesses_stay_slowed(server: &stockgate::server::Server, attempt: &Attempt<'_>) {
    use stockgate::auth::throttle::delay_after;
    let delayed = || metric(server, "stockgate_auth_delayed_total");
    let mut failures = 0;
    let mut guess = |n: u32| {
        let started = std::time::Instant::now();
        assert!(!attempt("ops", &format!("guess{n}")), "a wrong password");
        failures += 1;
        let waited = started.elapsed();
        assert!(
            waited >= delay_after(failures),
            "guess {n}, failure {failures} in a row at ops, waited {waited:?} \
             (documented: {:?})",
            delay_after(failures)
        );
    };
    for n in 1..=7 {
        guess(n);
    }
    assert_eq!(delayed(), 3, "the 5th, 6th and 7th waited");
    for n in 8..=9 {
        assert!(attempt("dash", "dash-pw"), "another user logs in at once");
        guess(n);
    }
    assert_eq!(delayed(), 5, "a reader's login reset nothing of ops's");
    assert!(attempt("ops", "ops-pw"), "the right password still logs in");
    assert!(!attempt("ops", "guess10"));
    assert_eq!(delayed(), 5, "ops's own login started its count over");
}

async fn throttled_server() -> (stockgate::server::Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    write_users(
        &path,
        "[users.ops]\npasswords = [\"ops-pw\"]\nrights = [\"operator\"]\n\n\
         [users.dash]\npasswords = [\"dash-pw\"]\nrights = [\"reader\"]\n",
    );
    let server = proxy(shared_cluster().seeds(), |c| {
        c.users = Some(UsersFile::read(&path).unwrap());
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    (server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_login_does_not_reset_the_guesses_at_a_user_over_resp() {
    let (server, _dir) = throttled_server().await;
    let addr = server.addr;
    let server = tokio::task::spawn_blocking(move || {
        let mut conn = TcpStream::connect(addr).unwrap();
        let attempt = |user: &str, password: &str| {
            let mut conn = &conn;
            conn.write_all(&encode_request(&["AUTH", user, password]))
                .unwrap();
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while !line.ends_with(b"\r\n") {
                conn.read_exact(&mut byte).unwrap();
                line.push(byte[0]);
            }
            match &line[..] {
                b"+OK\r\n" => true,
                other if other.starts_with(b"-WRONGPASS") => false,
                other => panic!("{}", String::from_utf8_lossy(other)),
            }
        };
        guesses_stay_slowed(&server, &attempt);
        conn.flush().unwrap();
        server
    })
    .await
    .unwrap();
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_login_does_not_reset_the_guesses_at_a_user_over_http() {
    let (server, _dir) = throttled_server().await;
    let http = server.http_addr.unwrap();
    let server = tokio::task::spawn_blocking(move || {
        let attempt = |user: &str, password: &str| {
            let mut conn = TcpStream::connect(http).unwrap();
            write!(
                conn,
                "GET /v1/stock/throttled/locations HTTP/1.1\r\nHost: x\r\n\
                 Authorization: Bearer {user}:{password}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut response = String::new();
            conn.read_to_string(&mut response).unwrap();
            !response.starts_with("HTTP/1.1 401")
        };
        guesses_stay_slowed(&server, &attempt);
        server
    })
    .await
    .unwrap();
    drop(server);
}

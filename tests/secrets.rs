//! A password in an upstream or database URL is never printed, whatever it
//! holds: not by `serve` (its log at debug level, INFO, `/metrics`,
//! `/readyz`), `check`, `stock import`, `journal sink`, `reconcile`, nor
//! `--help` beside the variable that holds it; written percent-encoded (as
//! the drivers read it right) or raw (as an operator may paste it).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::dev::{LocalRedis, RedisOptions};
use support::*;

/// Each holds one character that ends or splits a part of a URL, or that a
/// parser encodes or decodes. Raw, `/`, `?` and `#` end the authority
/// early (with digits before them, a parser reads a port: `9Zq?xW4k` is
/// host `default`, port 9); `@` and `:` split the user part; `%41` reads
/// as `A`; `,` splits the `--upstream` list.
const PASSWORDS: &[&str] = &[
    "S3cr/tPW",
    "9Zq?xW4k",
    "Hx9#wL4p",
    "Mb2@zR8t",
    "Jd5:nF3q",
    "Wc8%zT6y",
    "Kp4%41Lr",
    "Ñu6é密Zs9",
    "Tq3 &=+,!Gv",
    "Vx3\"\\'Lm8",
];

/// Every run's output, for each password and each way of writing it; each
/// searched for the password.
#[test]
fn no_password_in_a_url_is_printed() {
    let outputs: Vec<(String, String)> = std::thread::scope(|scope| {
        let runs: Vec<_> = PASSWORDS
            .iter()
            .map(|password| scope.spawn(move || runs_with(password)))
            .collect();
        runs.into_iter()
            .flat_map(|run| run.join().expect("a run panicked"))
            .collect()
    });
    for (what, text) in &outputs {
        for password in PASSWORDS {
            if let Some(piece) = leaked(text, password) {
                panic!("{piece:?} of {password:?} printed by {what}:\n{text}");
            }
        }
    }
}

/// `text` with every byte but the unreserved ones as `%XX`.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What of `password` is in `text`: the password, as a `Debug` field
/// escapes it, percent-encoded, or any 4 characters of it in a row.
fn leaked(text: &str, password: &str) -> Option<String> {
    let debug = format!("{password:?}");
    let chars: Vec<char> = password.chars().collect();
    chars
        .windows(4)
        .map(|run| run.iter().collect::<String>())
        .chain([
            password.to_owned(),
            debug.trim_matches('"').to_owned(),
            percent_encoded(password),
        ])
        .find(|piece| text.contains(piece.as_str()))
}

/// Runs every command with `password`, percent-encoded and raw, against a
/// Redis that asks for it; returns what each printed, named.
fn runs_with(password: &str) -> Vec<(String, String)> {
    let redis = LocalRedis::start(&RedisOptions {
        password: Some(password.into()),
        ..RedisOptions::default()
    })
    .expect("redis-server starts (apt-get install redis-server)");
    let port = redis.node.port;
    let encoded = percent_encoded(password);
    // Reaches Redis, so that the database is what fails.
    let upstream_read_right = format!("redis://default:{encoded}@127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("stock.csv");
    std::fs::write(&csv, "sku,qty\nsecrets-1,5\n").unwrap();
    let csv = csv.to_str().unwrap();
    let nothing_there = free_port();
    let mut outputs = Vec::new();
    for (form, written) in [("percent-encoded", encoded.as_str()), ("raw", password)] {
        let upstream = format!("redis://default:{written}@127.0.0.1:{port}");
        // Raw, these leave a `@` after the host, and are refused.
        let refused = form == "raw" && password.contains(['/', '?', '#']);
        let mut record = |what: &str, text: String| {
            outputs.push((format!("{what} with {password:?} {form}"), text));
        };

        let serve = serve(&upstream);
        if form == "percent-encoded" {
            assert!(
                serve.ready,
                "stockgate logged in to Redis with {password:?} percent-encoded:\n{}",
                serve.log
            );
            assert!(
                serve.info.contains(&format!(
                    "upstream_seeds:redis://default:***@127.0.0.1:{port}"
                )),
                "{}",
                serve.info
            );
            assert!(serve.log.contains("client connected"), "{}", serve.log);
        }
        record("serve's log", serve.log);
        record("serve's INFO", serve.info);
        record("serve's /metrics", serve.metrics);
        record("serve's /readyz", serve.readyz);

        let check = run(Command::new(stockgate_bin()).args(["check", "--upstream", &upstream]));
        if form == "percent-encoded" {
            assert!(
                check.contains(&format!(
                    "stockgate check: redis://default:***@127.0.0.1:{port}"
                )),
                "{check}"
            );
        }
        if refused {
            assert!(check.contains("percent-encode"), "{check}");
        }
        record("check", check);

        let import = run(Command::new(stockgate_bin()).args([
            "stock",
            "import",
            "--upstream",
            &upstream,
            csv,
        ]));
        if form == "percent-encoded" {
            assert!(import.contains("1 rows read, 1 written"), "{import}");
        }
        record("stock import", import);

        // The password in the user part, and as libpq's `password`
        // parameter (raw, its `&`, `#` or `@` would end it early).
        for (database, shown) in [
            (
                format!(
                    "postgres://books:{written}@127.0.0.1:{nothing_there}/books?sslmode=disable"
                ),
                format!("postgres://books:***@127.0.0.1:{nothing_there}/books"),
            ),
            (
                format!(
                    "mysql://books:{written}@127.0.0.1:{nothing_there}/books?ssl-mode=DISABLED"
                ),
                format!("mysql://books:***@127.0.0.1:{nothing_there}/books"),
            ),
            (
                format!(
                    "postgres://books@127.0.0.1:{nothing_there}/books?sslmode=disable&password={written}"
                ),
                format!(
                    "postgres://books@127.0.0.1:{nothing_there}/books?sslmode=disable&password=***"
                ),
            ),
        ] {
            let engine = &database[..database.find(':').unwrap()];
            for tool in [&["journal", "sink"][..], &["reconcile"]] {
                let out = run(Command::new(stockgate_bin()).args(tool).args([
                    "--upstream",
                    &upstream_read_right,
                    "--database",
                    &database,
                ]));
                if form == "percent-encoded" {
                    assert!(out.contains(&format!("cannot connect to {shown}")), "{out}");
                }
                // Refused at start: a `@` after the host, which a raw `/`,
                // `?` or `#` in the user part makes, a raw `@` in the
                // parameter, or a raw `@` in a PostgreSQL URL's user part
                // (its driver reads the rest of the password as the host).
                let in_query = database.contains("&password=");
                let raw_at = form == "raw" && password.contains('@');
                let postgres_user_part = engine == "postgres" && !in_query;
                if (refused && !in_query) || (raw_at && (in_query || postgres_user_part)) {
                    assert!(out.contains("percent-encode"), "{out}");
                }
                record(&format!("{} to {engine}", tool.join(" ")), out);
            }
            record(
                "journal sink --help",
                run(Command::new(stockgate_bin())
                    .args(["journal", "sink", "--help"])
                    .env("STOCKGATE_DATABASE", &database)),
            );
        }
        record(
            "serve --help",
            run(Command::new(stockgate_bin())
                .args(["serve", "--help"])
                .env("STOCKGATE_UPSTREAM", &upstream)),
        );
    }
    outputs
}

/// What a `serve` printed and answered.
struct Served {
    ready: bool,
    /// Its stdout and stderr, logged at debug level.
    log: String,
    info: String,
    metrics: String,
    readyz: String,
}

/// Runs `serve` in front of `upstream` until it is ready, or says why it
/// is not, or exits; reads INFO, `/metrics` and `/readyz`; stops it.
fn serve(upstream: &str) -> Served {
    let (port, admin) = (free_port(), free_port());
    let child = Command::new(stockgate_bin())
        .arg("serve")
        .env("STOCKGATE_UPSTREAM", upstream)
        .env("STOCKGATE_LOG", "debug")
        .env("STOCKGATE_ACCESS_LOG", "all")
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            &format!("127.0.0.1:{admin}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let readers = [
        read_all(child.0.stdout.take().unwrap()),
        read_all(child.0.stderr.take().unwrap()),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut readyz = String::new();
    let exited = loop {
        if child.0.try_wait().unwrap().is_some() {
            break true;
        }
        if let Some(answer) = http_get(admin, "/readyz") {
            readyz = answer;
            // Ready, or the first connection failed and says why.
            if readyz.starts_with("HTTP/1.1 200") || !readyz.contains("connecting to redis") {
                break false;
            }
        }
        assert!(
            Instant::now() < deadline,
            "serve neither ready nor failing in 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut info, mut metrics) = (String::new(), String::new());
    if !exited {
        info = redis_cli(port, &["INFO"]);
        // A request through it, for the access log and the metrics.
        redis_cli(port, &["DEDUCT", "secrets-1", "1", "r-1"]);
        metrics = http_get(admin, "/metrics").unwrap_or_default();
        readyz = http_get(admin, "/readyz").unwrap_or_default();
        unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
        let stopped = Instant::now() + Duration::from_secs(30);
        while child.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < stopped, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let log = readers.map(|reader| reader.join().unwrap()).concat();
    Served {
        ready: readyz.starts_with("HTTP/1.1 200"),
        log,
        info,
        metrics,
        readyz,
    }
}

/// Runs a one-shot command at debug level; its stdout and stderr. It must
/// end within 30 s.
fn run(command: &mut Command) -> String {
    let child = command
        .env("STOCKGATE_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let readers = [
        read_all(child.0.stdout.take().unwrap()),
        read_all(child.0.stderr.take().unwrap()),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "{command:?} still running after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    readers.map(|reader| reader.join().unwrap()).concat()
}

fn read_all(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = from.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// `GET path` on a loopback port: the whole response, if it answers.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    Some(response)
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

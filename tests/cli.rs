//! The real `stockgate` binary, configured the way operators do, driven by
//! redis-cli.

mod support;

use std::process::Command;
use support::*;

#[test]
fn serve_takes_its_config_from_the_environment_and_stops_on_sigterm() {
    let cluster = cluster();
    set_stock(&cluster, "cli-sku", 10);
    let gate = Launch::new("serve")
        .env("STOCKGATE_UPSTREAM", cluster.seeds().join(","))
        .ports_in_env()
        .env("STOCKGATE_RETRY_WINDOW", "2h")
        .env("STOCKGATE_LOG_FORMAT", "json")
        .start();
    let port = gate.addr.port();

    let first = redis_cli(port, &["DEDUCT", "cli-sku", "3", "cli-1", "ORD-CLI"]);
    let v = stockgate::outcome::SCRIPT_VERSION;
    assert_eq!(first, format!("0\n7\nORD-CLI\n{v}\n"));
    let again = redis_cli(port, &["-3", "DEDUCT", "cli-sku", "3", "cli-1", "ORD-CLI"]);
    assert_eq!(again, format!("1\n7\nORD-CLI\n{v}\n"));
    let short = redis_cli(port, &["DEDUCT", "cli-sku", "8", "cli-3"]);
    assert_eq!(short, format!("2\n7\n\n{v}\n"));
    let invalid = redis_cli(port, &["DEDUCT", "cli-sku", "x", "cli-2"]);
    assert_eq!(
        invalid,
        format!("3\n-1\n\n{v}\nqty must be an integer from 1 to 1000000\n")
    );

    // The 2h window from the environment reached the record.
    let mut redis = cluster.cluster_connection().unwrap();
    let ttl: i64 = redis::cmd("TTL")
        .arg(record_key("cli-sku", "cli-1"))
        .query(&mut redis)
        .unwrap();
    assert!((7000..=7200).contains(&ttl), "TTL {ttl}");

    let (status, log) = gate.stop();
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
    let first_line = log.lines().next().unwrap_or_default();
    assert!(
        first_line.starts_with('{'),
        "--log-format json: {first_line}"
    );
    assert!(log.contains("drain"), "{log}");
}

#[test]
fn a_retry_window_under_a_minute_is_refused_at_startup() {
    let out = Command::new(stockgate_bin())
        .args([
            "serve",
            "--upstream",
            "redis://127.0.0.1:1",
            "--retry-window",
            "30s",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--retry-window 30s is shorter than 1 minute"),
        "{err}"
    );
    assert!(
        err.contains("deducted again"),
        "the message says why: {err}"
    );
}

#[test]
fn bad_flags_are_refused_before_anything_binds() {
    let port = free_port();
    let out = Command::new(stockgate_bin())
        .args([
            "serve",
            "--upstream",
            "redis://127.0.0.1:1",
            "--key-prefix",
            "a{b}",
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--key-prefix"));
    // Nothing was left listening.
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
}

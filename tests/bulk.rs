//! `stockgate stock import` and `export`, through the real binary.

mod support;

use std::process::Command;
use support::*;

fn stockgate(args: &[&str], seeds: &[String]) -> (bool, String, String) {
    let out = Command::new(stockgate_bin())
        .args(args)
        .arg("--upstream")
        .arg(seeds.join(","))
        .output()
        .expect("runs stockgate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_rows_are_reported_by_line_and_skipped_and_the_rest_is_loaded() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("stock.csv");
    std::fs::write(
        &csv,
        "sku,qty\n\
         apple,10\n\
         pear, 7\n\
         bad sku,3\n\
         plum,-1\n\
         fig,1.5\n\
         kiwi\n\
         lime,4,extra\n\
         \"quoted,sku\",2\n\
         apple,12\n\
         melon,0\n",
    )
    .unwrap();

    // A dry run checks everything and writes nothing.
    let (ok, _, err) = stockgate(
        &["stock", "import", csv.to_str().unwrap(), "--dry-run"],
        &cluster.seeds(),
    );
    assert!(!ok, "bad rows make the exit status non-zero: {err}");
    assert!(
        err.contains("11 rows read") || err.contains("10 rows read"),
        "{err}"
    );
    assert_eq!(get_stock(&cluster, "apple"), None, "dry run wrote nothing");

    let (ok, _, err) = stockgate(
        &["stock", "import", csv.to_str().unwrap()],
        &cluster.seeds(),
    );
    assert!(!ok);
    for (line, why) in [
        (4, "sku must be"),
        (5, "stock must be an integer"),
        (6, "stock must be an integer"),
        (7, "expected 2 fields"),
        (8, "expected 2 fields"),
    ] {
        let needle = format!("line {line}: skipped: {why}");
        assert!(err.contains(&needle), "missing {needle:?} in:\n{err}");
    }
    assert!(
        err.contains("10 rows read, 5 written, 5 skipped as invalid, 0 failed"),
        "{err}"
    );
    assert!(
        !err.contains("line 9"),
        "a quoted field may hold a comma: {err}"
    );
    assert_eq!(get_stock(&cluster, "quoted,sku"), Some(2));
    assert_eq!(
        get_stock(&cluster, "apple"),
        Some(12),
        "a sku listed twice ends with its last value"
    );
    assert_eq!(get_stock(&cluster, "pear"), Some(7), "fields are trimmed");
    assert_eq!(get_stock(&cluster, "melon"), Some(0));
    assert_eq!(get_stock(&cluster, "plum"), None);
}

#[test]
fn thousands_of_rows_round_trip_through_export() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("stock.csv");
    let mut text = String::from("sku,qty\n");
    for i in 0..20_000 {
        text.push_str(&format!("sku-{i},{}\n", i % 997));
    }
    std::fs::write(&csv, &text).unwrap();
    let (ok, _, err) = stockgate(
        &["stock", "import", csv.to_str().unwrap()],
        &cluster.seeds(),
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("20000 rows read, 20000 written, 0 skipped"),
        "{err}"
    );
    // Progress goes to stderr as plain lines when stderr is not a terminal,
    // and ends with the summary.
    assert!(
        err.trim_end().lines().last().unwrap().contains("rows/s"),
        "{err}"
    );

    // Records written by DEDUCT live under the same prefix; export skips them.
    let mut redis = cluster.cluster_connection().unwrap();
    redis::cmd("SET")
        .arg(record_key("sku-1", "some-request"))
        .arg("D:1:")
        .query::<()>(&mut redis)
        .unwrap();

    let (ok, exported, err) = stockgate(&["stock", "export"], &cluster.seeds());
    assert!(ok, "{err}");
    let mut got: Vec<&str> = exported.lines().collect();
    assert_eq!(got.remove(0), "sku,qty");
    got.sort_unstable();
    let mut want: Vec<&str> = text.lines().skip(1).collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

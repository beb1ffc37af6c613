//! `stockgate stock import` and `export`, through the real binary.

mod support;

use std::process::Command;
use support::*;

fn stockgate(args: &[&str], seeds: &[String]) -> (bool, String, String) {
    let out = Command::new(stockgate_bin())
        .args(args)
        .arg("--upstream")
        .arg(seeds.join(","))
        // The import follows the sidecars' STOCKGATE_JOURNAL: a test says
        // which it wants with the flag.
        .env_remove("STOCKGATE_JOURNAL")
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

/// A SKU's journal, read back.
fn journal(cluster: &stockgate::dev::LocalCluster, sku: &str) -> Vec<stockgate::journal::Entry> {
    let key = layout().journal_key(&stockgate::params::Sku::parse(sku.to_owned().into()).unwrap());
    let raw: redis::Value = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(&mut cluster.cluster_connection().unwrap())
        .unwrap();
    stockgate::journal::stream::entries(raw).unwrap()
}

#[test]
fn a_journaled_import_starts_each_account_with_a_baseline_in_file_order() {
    use stockgate::journal::Event;
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.csv");
    std::fs::write(&plain, "sku,qty\npear,5\nkiwi,1\n").unwrap();
    let (ok, _, err) = stockgate(
        &[
            "stock",
            "import",
            plain.to_str().unwrap(),
            "--journal",
            "false",
        ],
        &cluster.seeds(),
    );
    assert!(ok, "{err}");
    assert!(
        journal(&cluster, "kiwi").is_empty(),
        "a plain import journals nothing"
    );

    let csv = dir.path().join("stock.csv");
    std::fs::write(&csv, "sku,qty\napple,10\npear,7\nbad sku,3\napple,12\n").unwrap();
    let (ok, _, err) = stockgate(
        &[
            "stock",
            "import",
            csv.to_str().unwrap(),
            "--journal",
            "true",
        ],
        &cluster.seeds(),
    );
    assert!(!ok, "a bad row makes the exit status non-zero: {err}");
    assert!(err.contains("line 4: skipped: sku must be"), "{err}");
    assert!(
        err.contains("4 rows read, 3 written, 1 skipped as invalid, 0 failed"),
        "{err}"
    );
    assert_eq!(get_stock(&cluster, "apple"), Some(12), "file order holds");
    assert_eq!(get_stock(&cluster, "pear"), Some(7));

    let apple = journal(&cluster, "apple");
    let seen: Vec<(Event, i64, i64)> = apple
        .iter()
        .map(|e| (e.event, e.stock_change, e.stock))
        .collect();
    assert_eq!(
        seen,
        [(Event::Set, 10, 10), (Event::Set, 2, 12)],
        "one baseline per row, in file order: {apple:?}"
    );
    let run = apple[0]
        .id
        .strip_suffix("-2")
        .expect("the op_id ends with the row's line");
    assert!(run.starts_with("import-"), "{}", apple[0].id);
    assert_eq!(apple[1].id, format!("{run}-5"));
    let pear = journal(&cluster, "pear");
    assert_eq!(pear.len(), 1, "{pear:?}");
    assert_eq!(
        (pear[0].event, pear[0].stock_change, pear[0].stock),
        (Event::Set, 2, 7),
        "the baseline says what the import changed"
    );

    // The sink finds every journal through the shards' sets.
    let mut conn = cluster.cluster_connection().unwrap();
    let mut listed: Vec<String> = layout()
        .sweep_shards()
        .iter()
        .flat_map(|shard| {
            redis::cmd("SMEMBERS")
                .arg(&shard.journals)
                .query::<Vec<String>>(&mut conn)
                .unwrap()
        })
        .collect();
    listed.sort();
    assert_eq!(listed, ["apple", "pear"]);
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

    // A SKU kept by location (docs/locations.md) is no `sku,qty` row.
    redis::cmd("SET")
        .arg(stock_key("by-location"))
        .arg("loc")
        .query::<()>(&mut redis)
        .unwrap();

    let (ok, exported, err) = stockgate(&["stock", "export"], &cluster.seeds());
    assert!(ok, "{err}");
    assert!(
        err.contains("not exported: 1 skus kept by location"),
        "{err}"
    );
    let mut got: Vec<&str> = exported.lines().collect();
    assert_eq!(got.remove(0), "sku,qty");
    got.sort_unstable();
    let mut want: Vec<&str> = text.lines().skip(1).collect();
    want.sort_unstable();
    assert_eq!(got, want);
}

/// Bad rows are reported on the line they are on, whatever ends the lines
/// (spreadsheets on Windows write CRLF) and however many blank lines sit
/// between rows. csv's own reader put them one line early per CRLF and per
/// blank line.
#[test]
fn bad_rows_are_reported_on_their_own_line_in_crlf_files_and_around_blank_lines() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    for (name, text, bad_lines, good) in [
        (
            "crlf.csv",
            "sku,qty\r\nok-3,1\r\nbad-3,x\r\nok-4,2\r\nbad-4,y\r\n",
            &[3, 5][..],
            &[("ok-3", 1), ("ok-4", 2)][..],
        ),
        (
            "blank-lines.csv",
            "sku,qty\nok-1,1\nbad-1,x\n\nok-2,2\n\nbad-2,y\n",
            &[3, 7][..],
            &[("ok-1", 1), ("ok-2", 2)][..],
        ),
        (
            // Both, a UTF-8 byte-order mark before the header (Excel's
            // "CSV UTF-8"), a lone CR (old Mac files), and no final newline.
            "mixed.csv",
            "\u{feff}sku,qty\r\n\r\nok-5,5\rbad-5,z\r\n\nok-6,6\nbad-6,-",
            &[4, 7][..],
            &[("ok-5", 5), ("ok-6", 6)][..],
        ),
    ] {
        let csv = dir.path().join(name);
        std::fs::write(&csv, text).unwrap();
        let (ok, _, err) = stockgate(
            &["stock", "import", csv.to_str().unwrap()],
            &cluster.seeds(),
        );
        assert!(!ok, "{name}: {err}");
        let reported: Vec<&str> = err
            .lines()
            .filter(|l| l.contains(": skipped: "))
            .map(|l| l.split(':').next().unwrap())
            .collect();
        let expected: Vec<String> = bad_lines.iter().map(|n| format!("line {n}")).collect();
        assert_eq!(reported, expected, "{name}:\n{err}");
        assert!(
            err.contains("4 rows read, 2 written, 2 skipped as invalid"),
            "{name}: the header is not a row:\n{err}"
        );
        for (sku, qty) in good {
            assert_eq!(get_stock(&cluster, sku), Some(*qty), "{name}: {sku}");
        }
    }
}

#[test]
fn a_dry_run_says_what_a_real_run_would_do() {
    let cluster = cluster();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("stock.csv");
    std::fs::write(&csv, "dry-1,1\ndry-2,x\n").unwrap();
    let (ok, _, err) = stockgate(
        &["stock", "import", csv.to_str().unwrap(), "--dry-run"],
        &cluster.seeds(),
    );
    assert!(!ok, "a bad row fails a dry run too: {err}");
    assert!(err.contains("line 2: skipped"), "{err}");
    assert!(
        err.contains("1 would be written (dry run)"),
        "the summary says what would happen: {err}"
    );
    assert!(
        err.trim_end()
            .ends_with("some rows would not be imported; see the lines above"),
        "nothing is imported in a dry run, so don't say some rows were not: {err}"
    );
    assert_eq!(
        get_stock(&cluster, "dry-1"),
        None,
        "a dry run writes nothing"
    );
}

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
         lime,4,north,1,extra\n\
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
        (7, "expected 2 to 4 fields"),
        (8, "expected 2 to 4 fields"),
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

    // A SKU kept by location (docs/locations.md): a row per location.
    redis::cmd("SET")
        .arg(stock_key("by-location"))
        .arg("loc")
        .query::<()>(&mut redis)
        .unwrap();
    redis::cmd("HSET")
        .arg([stock_key("by-location"), b":loc".to_vec()].concat())
        .arg("w1")
        .arg("3")
        .query::<()>(&mut redis)
        .unwrap();

    let (ok, exported, err) = stockgate(&["stock", "export"], &cluster.seeds());
    assert!(ok, "{err}");
    assert!(
        err.contains("exported 20001 skus (1 kept by location, in 1 rows)"),
        "{err}"
    );
    let mut got: Vec<&str> = exported.lines().collect();
    assert_eq!(got.remove(0), "sku,qty");
    got.sort_unstable();
    let mut want: Vec<&str> = text.lines().skip(1).chain(["by-location,3,w1"]).collect();
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

/// Sends one command to stockgate, failing the test on an error.
async fn must(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn code(value: &redis::Value) -> i64 {
    match value {
        redis::Value::Array(items) => match items[0] {
            redis::Value::Int(code) => code,
            ref other => panic!("not a code: {other:?}"),
        },
        other => panic!("not a stock reply: {other:?}"),
    }
}

/// The binary, off the runtime's threads (it waits for the process, and
/// the stockgate under test serves on this runtime).
async fn stockgate_off_runtime(args: Vec<String>, seeds: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        stockgate(&args, &seeds)
    })
    .await
    .unwrap()
}

/// issue 44: a plain `sku,qty` row for a SKU kept by location turned its
/// stock key from `loc` into a number, and the scripts of a SKU that keeps
/// one number then gave its deduction and its hold by location back to
/// that number. The row is refused now, with or without the journal: the
/// import says why and exits non-zero, and the SKU's stock, records,
/// holds and locations are as they were; its other rows are written, and
/// the SKU goes on by location.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_refuses_a_plain_row_for_a_sku_kept_by_location_and_changes_nothing() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
    let mut conn = client(&server, false).await;
    let set = must(&mut conn, &["STOCK.SET", "imp", "6", "r", "AT", "north"]).await;
    assert_eq!(code(&set), 0);
    let deducted = must(
        &mut conn,
        &["DEDUCT.AT", "imp", "5", "d1", "SPLIT", "north"],
    )
    .await;
    assert_eq!(code(&deducted), 0);
    let held = must(
        &mut conn,
        &["HOLD.AT", "imp", "1", "h1", "900000", "SPLIT", "north"],
    )
    .await;
    assert_eq!(code(&held), 0);
    let mut direct = cluster.cluster_connection().unwrap();
    let before = sku_dump(&mut direct, "imp", &["d1", "h1"]);

    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("stock.csv");
    std::fs::write(&csv, "sku,qty\nimp,10\nplain,3\n").unwrap();
    for journal in ["false", "true"] {
        let args = [
            "stock",
            "import",
            csv.to_str().unwrap(),
            "--journal",
            journal,
        ];
        let (ok, _, err) = stockgate_off_runtime(
            args.iter().map(|a| a.to_string()).collect(),
            cluster.seeds(),
        )
        .await;
        assert!(
            !ok,
            "--journal {journal}: a refused row fails the import: {err}"
        );
        assert!(
            err.contains("line 2: not written: code 3: the sku keeps its stock by location"),
            "--journal {journal}: {err}"
        );
        assert!(
            err.contains("2 rows read, 1 written, 0 skipped as invalid, 1 failed to write"),
            "--journal {journal}: {err}"
        );
        assert_eq!(
            sku_dump(&mut direct, "imp", &["d1", "h1"]),
            before,
            "--journal {journal}: the sku is untouched"
        );
        assert_eq!(get_stock(&cluster, "plain"), Some(3));
    }

    // Still a SKU kept by location: its deduction goes back to north.
    let reverted = must(&mut conn, &["REVERT", "imp", "d1"]).await;
    let redis::Value::Array(items) = &reverted else {
        panic!("{reverted:?}")
    };
    assert_eq!(
        (&items[0], &items[1]),
        (&redis::Value::Int(0), &redis::Value::Int(5)),
        "{reverted:?}"
    );
    let found = must(&mut conn, &["STOCK.LOCATIONS", "imp"]).await;
    assert_eq!(
        found,
        redis::Value::Array(vec![
            redis::Value::Int(5),
            redis::Value::Array(vec![
                redis::Value::BulkString(b"north".to_vec()),
                redis::Value::Int(5),
                redis::Value::Int(1),
                redis::Value::Int(0),
            ]),
        ])
    );
    drop(server);
}

/// What a SKU holds as stockgate answers it: STOCK.LOCATIONS, which
/// answers `[stock]` for a SKU that keeps one number.
async fn holdings(conn: &mut redis::aio::MultiplexedConnection, sku: &str) -> redis::Value {
    must(conn, &["STOCK.LOCATIONS", sku]).await
}

/// An export's rows, the header first, then the others sorted.
fn sorted_rows(exported: &str) -> Vec<&str> {
    let mut rows: Vec<&str> = exported.lines().collect();
    rows[1..].sort_unstable();
    rows
}

/// A fleet of both kinds of SKU, exported and imported into a fresh
/// cluster, plainly and journaled, holds the same units in the same
/// places with the same floors. A SKU that keeps one number is the `sku,qty`
/// row it always was; a SKU kept by location is a row per location, its
/// location and floor (when it has one) after its units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_kinds_of_sku_round_trip_through_export_into_a_fresh_cluster() {
    let from = cluster();
    let server = proxy(from.seeds(), |c| c.admin_commands = true).await;
    let mut conn = client(&server, false).await;
    for args in [
        &["STOCK.SET", "mug", "12", "m1"][..],
        &["STOCK.SET", "pen", "0", "p1"],
        &["STOCK.SET", "boot", "6", "b1", "AT", "north", "FLOOR", "2"],
        &["STOCK.SET", "boot", "4", "b2", "AT", "south"],
        &["STOCK.SET", "tee", "10", "t1", "AT", "w1", "FLOOR", "3"],
        &["STOCK.SET", "tee", "0", "t2", "AT", "w2", "FLOOR", "0"],
        &["STOCK.SET", "tee", "7", "t3", "AT", "w3"],
        &["STOCK.SET", "cap", "5", "c1", "AT", "x", "FLOOR", "5"],
        &["DEDUCT.AT", "boot", "3", "o1", "SPLIT", "north", "south"],
        &["DEDUCT", "mug", "2", "o2"],
    ] {
        assert_eq!(code(&must(&mut conn, args).await), 0, "{args:?}");
    }
    let skus = ["mug", "pen", "boot", "tee", "cap"];
    let mut held = Vec::new();
    for sku in skus {
        held.push(holdings(&mut conn, sku).await);
    }

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleet.csv");
    let (ok, exported, err) =
        stockgate_off_runtime(vec!["stock".into(), "export".into()], from.seeds()).await;
    assert!(ok, "{err}");
    assert!(
        err.contains("exported 5 skus (3 kept by location, in 6 rows)"),
        "{err}"
    );
    assert_eq!(
        sorted_rows(&exported),
        [
            "sku,qty",
            "boot,3,north,2",
            "boot,4,south",
            "cap,5,x,5",
            "mug,10",
            "pen,0",
            "tee,0,w2",
            "tee,10,w1,3",
            "tee,7,w3",
        ]
    );
    std::fs::write(&file, &exported).unwrap();
    drop(server);

    let to = cluster();
    let path = file.to_str().unwrap().to_owned();
    for (prefix, journal) in [("stock", "false"), ("jstock", "true")] {
        let (ok, _, err) = stockgate_off_runtime(
            [
                "stock",
                "import",
                &path,
                "--key-prefix",
                prefix,
                "--journal",
                journal,
            ]
            .map(str::to_owned)
            .to_vec(),
            to.seeds(),
        )
        .await;
        assert!(ok, "{prefix}: {err}");
        assert!(
            err.contains("8 rows read, 8 written, 0 skipped"),
            "{prefix}: {err}"
        );

        let layout = stockgate::keys::KeyLayout::new(prefix).unwrap();
        let server = proxy(to.seeds(), |c| c.keys = layout).await;
        let mut conn = client(&server, false).await;
        for (sku, was) in skus.iter().zip(&held) {
            assert_eq!(&holdings(&mut conn, sku).await, was, "{prefix}: {sku}");
        }
        drop(server);
        let (ok, again, err) = stockgate_off_runtime(
            ["stock", "export", "--key-prefix", prefix]
                .map(str::to_owned)
                .to_vec(),
            to.seeds(),
        )
        .await;
        assert!(ok, "{prefix}: {err}");
        assert_eq!(sorted_rows(&again), sorted_rows(&exported), "{prefix}");
    }
    // The journaled import starts each location's account with a baseline.
    let mut direct = to.cluster_connection().unwrap();
    let entries: usize = redis::cmd("XLEN")
        .arg("jstock:{tee}:journal")
        .query(&mut direct)
        .unwrap();
    assert_eq!(entries, 3);
}

/// A row that names a location is STOCK.SET ... AT, checked as it checks:
/// its form before anything is written (skipped as invalid), the SKU's
/// kind and the floor by the script (not written, with the script's
/// reason). A SKU that keeps one number above 0 is not moved to locations
/// by a row; an empty one is, as STOCK.SET ... AT moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_name_a_location_are_checked_as_stock_set_at_checks_them() {
    let cluster = cluster();
    set_stock(&cluster, "full", 12);
    set_stock(&cluster, "empty", 0);
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("stock.csv");
    std::fs::write(
        &csv,
        "sku,qty,location,floor\n\
         full,5,north\n\
         empty,4,north\n\
         far,1,no place\n\
         far,1,north,x\n\
         far,2,north,3\n\
         far,1,north,0,extra\n\
         far,2,north,1\n",
    )
    .unwrap();
    let (ok, _, err) = stockgate_off_runtime(
        vec![
            "stock".into(),
            "import".into(),
            csv.to_str().unwrap().into(),
        ],
        cluster.seeds(),
    )
    .await;
    assert!(!ok, "{err}");
    for needle in [
        "line 2: not written: code 3: the sku keeps one number",
        "line 4: skipped: a location is",
        "line 5: skipped: floor must be an integer",
        "line 6: not written: code 3: floor 3 is above",
        "line 7: skipped: expected 2 to 4 fields",
        "7 rows read, 2 written, 3 skipped as invalid, 2 failed to write",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    assert_eq!(get_stock(&cluster, "full"), Some(12), "refused: untouched");
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let place = |n: i64, floor: i64| {
        redis::Value::Array(vec![
            redis::Value::Int(n),
            redis::Value::Array(vec![
                redis::Value::BulkString(b"north".to_vec()),
                redis::Value::Int(n),
                redis::Value::Int(0),
                redis::Value::Int(floor),
            ]),
        ])
    };
    assert_eq!(holdings(&mut conn, "empty").await, place(4, 0));
    assert_eq!(holdings(&mut conn, "far").await, place(2, 1));
    drop(server);
}

//! Rolling upgrades: sidecars of the previous release (script version 2,
//! in `tests/compat/v2/`) serve beside new ones for minutes, each running
//! its own scripts on the same keys. A record an old script can't read
//! must make it answer an error (BADRECORD), never a business code; and
//! the new scripts must read every record the old ones wrote.

mod support;

use redis::Value;
use support::*;

/// An old script, with its own common helpers spliced in as it shipped.
fn old_script(name: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/compat/v2/");
    let common = std::fs::read_to_string(format!("{dir}common.lua")).unwrap();
    let body = std::fs::read_to_string(format!("{dir}{name}.lua")).unwrap();
    assert!(body.contains("--@common\n"));
    body.replacen("--@common\n", &common, 1)
}

fn eval(
    conn: &mut redis::Connection,
    body: &str,
    keys: [&[u8]; 2],
    args: &[&str],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(body).arg(2).arg(keys[0]).arg(keys[1]);
    for a in args {
        cmd.arg(*a);
    }
    cmd.query(conn)
}

#[tokio::test]
async fn old_scripts_refuse_new_records_with_an_error_and_new_scripts_read_old_ones() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    for sku in ["up-new", "up-old"] {
        redis::cmd("SET")
            .arg(stock_key(sku))
            .arg(10)
            .query::<()>(&mut direct)
            .unwrap();
    }
    let server = proxy(vec![redis.url()], |_| {}).await;
    let mut conn = client(&server, false).await;

    // A new sidecar deducts; an old one gets the retry.
    let first = parse(
        deduct(&mut conn, "up-new", "2", "r1", Some("ORD-1"))
            .await
            .unwrap(),
    );
    assert_eq!((first.code, first.version), (0, 3));
    let keys = (stock_key("up-new"), record_key("up-new", "r1"));
    let keys = [&keys.0[..], &keys.1[..]];
    for (script, args) in [
        (
            "deduct",
            &["2", "ORD-1", "86400000", "1000000", "error"][..],
        ),
        ("revert", &["86400000", "error"][..]),
        ("status", &[][..]),
    ] {
        let err = eval(&mut direct, &old_script(script), keys, args).unwrap_err();
        assert_eq!(err.code(), Some("BADRECORD"), "old {script}: {err:?}");
    }
    let stock: i64 = redis::cmd("GET")
        .arg(stock_key("up-new"))
        .query(&mut direct)
        .unwrap();
    assert_eq!(stock, 8, "the old scripts changed nothing");

    // An old sidecar deducts (and writes the old record); new ones read it.
    let keys = (stock_key("up-old"), record_key("up-old", "r2"));
    let old_keys = [&keys.0[..], &keys.1[..]];
    let old = parse(
        eval(
            &mut direct,
            &old_script("deduct"),
            old_keys,
            &["3", "ORD-2", "86400000", "1000000", "error"],
        )
        .unwrap(),
    );
    assert_eq!((old.code, old.remain, old.version), (0, 7, 2));
    let stored: String = redis::cmd("GET").arg(&keys.1).query(&mut direct).unwrap();
    assert_eq!(stored, "D:3:ORD-2", "the old record format");
    let retry = parse(
        deduct(&mut conn, "up-old", "3", "r2", Some("ORD-2"))
            .await
            .unwrap(),
    );
    assert_eq!(
        (retry.code, retry.remain, retry.order_no.as_str()),
        (1, 7, "ORD-2")
    );
    let status: Value = redis::cmd("STOCK.STATUS")
        .arg("up-old")
        .arg("r2")
        .query_async(&mut conn)
        .await
        .unwrap();
    let Value::Array(fields) = status else {
        panic!("STOCK.STATUS is a map (flat in RESP2): {status:?}")
    };
    assert_eq!(fields[1], Value::BulkString(b"DEDUCTED".to_vec()));
    let back = parse(revert(&mut conn, "up-old", "r2").await.unwrap());
    assert_eq!(
        (back.code, back.remain, back.order_no.as_str()),
        (0, 10, "ORD-2")
    );
    let stored: String = redis::cmd("GET").arg(&keys.1).query(&mut direct).unwrap();
    assert_eq!(summary(&stored), "R:3:ORD-2");
    // The old script, in turn, refuses what the new one wrote over its record.
    let err = eval(
        &mut direct,
        &old_script("revert"),
        old_keys,
        &["86400000", "error"],
    )
    .unwrap_err();
    assert_eq!(err.code(), Some("BADRECORD"));
}

//! Rolling upgrades: sidecars of earlier releases (script versions 2 and
//! 3, in `tests/compat/`; version 4 before its scripts became a library
//! shaped for FCALL, in `benches/side_by_side/before/`) serve beside new
//! ones for minutes, each running its own scripts on the same keys. A record an old script can't read
//! must make it answer an error (BADRECORD), never a business code; and
//! the new scripts must read every record the old ones wrote.

mod support;

use redis::Value;
use support::*;

/// A version-2 script, with its own common helpers spliced in as it shipped.
fn old_script(name: &str) -> String {
    script_of("v2", name)
}

/// An earlier release's script, as it shipped.
fn script_of(version: &str, name: &str) -> String {
    let dir = format!("{}/tests/compat/{version}/", env!("CARGO_MANIFEST_DIR"));
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
    assert_eq!(
        (first.code, first.version),
        (0, stockgate::outcome::SCRIPT_VERSION)
    );
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

/// The release before holds (script version 3) beside this one: its
/// scripts answer BADRECORD, never a code, for a request in any hold state
/// (HELD, CONFIRMED, EXPIRED), and change nothing; they still serve other
/// requests on a SKU with holds, and the units they see are the ones not
/// held. This release reads what version 3 wrote.
#[tokio::test]
async fn version_3_scripts_refuse_hold_records_with_an_error() {
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("up-hold"))
        .arg(20)
        .query::<()>(&mut direct)
        .unwrap();
    let server = proxy(vec![redis.url()], |c| c.sweeper = false).await;
    let mut conn = client(&server, false).await;
    let placed = |reply: Value| parse_hold(reply).code;
    assert_eq!(
        placed(
            hold(&mut conn, "up-hold", "2", "held", "600000", None)
                .await
                .unwrap()
        ),
        0
    );
    assert_eq!(
        placed(
            hold(&mut conn, "up-hold", "3", "done", "600000", None)
                .await
                .unwrap()
        ),
        0
    );
    assert_eq!(
        placed(confirm(&mut conn, "up-hold", "done").await.unwrap()),
        0
    );
    let short = parse_hold(
        hold(&mut conn, "up-hold", "4", "gone", "1000", None)
            .await
            .unwrap(),
    );
    loop {
        let now: Vec<String> = redis::cmd("TIME").query(&mut direct).unwrap();
        if now[0].parse::<i64>().unwrap() * 1000 > short.expires_at + 1000 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Anything on the sku releases the expired hold: EXPIRED.
    let _: Value = redis::cmd("STOCK.GET")
        .arg("up-hold")
        .query_async(&mut conn)
        .await
        .unwrap();
    let stock = |direct: &mut redis::Connection| -> i64 {
        redis::cmd("GET")
            .arg(stock_key("up-hold"))
            .query(direct)
            .unwrap()
    };
    assert_eq!(stock(&mut direct), 15, "20 less 2 held and 3 confirmed");
    for (id, state) in [("held", "H:2:"), ("done", "C:3:"), ("gone", "X:4:")] {
        let raw: String = redis::cmd("GET")
            .arg(record_key("up-hold", id))
            .query(&mut direct)
            .unwrap();
        assert_eq!(summary(&raw), state);
        let keys = (stock_key("up-hold"), record_key("up-hold", id));
        let keys = [&keys.0[..], &keys.1[..]];
        for (script, args) in [
            (
                "deduct",
                &["2", "", "86400000", "1000000", "error", "ab12", "0"][..],
            ),
            ("revert", &["86400000", "error", "ab12", "0"][..]),
            ("status", &[][..]),
        ] {
            let err = eval(&mut direct, &script_of("v3", script), keys, args).unwrap_err();
            assert_eq!(
                err.code(),
                Some("BADRECORD"),
                "v3 {script} on {id}: {err:?}"
            );
        }
    }
    assert_eq!(stock(&mut direct), 15, "the old scripts changed nothing");

    // A version-3 DEDUCT of another id on the same sku works, on the
    // units not held, and leaves the holds alone.
    let keys = (stock_key("up-hold"), record_key("up-hold", "v3-new"));
    let old = parse(
        eval(
            &mut direct,
            &script_of("v3", "deduct"),
            [&keys.0[..], &keys.1[..]],
            &["5", "", "86400000", "1000000", "error", "cd34", "0"],
        )
        .unwrap(),
    );
    assert_eq!((old.code, old.remain, old.version), (0, 10, 3));
    let status = parse_hold(confirm(&mut conn, "up-hold", "held").await.unwrap());
    assert_eq!((status.code, status.remain), (0, 10));
    // And this release reads the version-3 record.
    let retry = parse(
        deduct(&mut conn, "up-hold", "5", "v3-new", None)
            .await
            .unwrap(),
    );
    assert_eq!((retry.code, retry.remain), (1, 10));
    let back = parse(revert(&mut conn, "up-hold", "v3-new").await.unwrap());
    assert_eq!((back.code, back.remain), (0, 15));
}

/// The scripts before the library was shaped for FCALL (issue 35; the
/// benchmark keeps them, `benches/side_by_side/before/`) beside these, on
/// the same keys: the record's shape did not change, so each reads what
/// the other wrote, and a request is applied once whichever serves it.
#[test]
fn the_scripts_before_the_function_library_and_these_read_each_others_records() {
    let redis = standalone();
    let direct = std::cell::RefCell::new(redis.node.connection().unwrap());
    let sku = "up-35";
    let stock = stock_key(sku);
    redis::cmd("SET")
        .arg(&stock)
        .arg(10)
        .query::<()>(&mut *direct.borrow_mut())
        .unwrap();
    let dir = format!(
        "{}/benches/side_by_side/before/",
        env!("CARGO_MANIFEST_DIR")
    );
    let read = |name: &str| std::fs::read_to_string(format!("{dir}{name}.lua")).unwrap();
    let common = read("common");
    let old = |name: &str| stockgate::script::body_of(&common, &read(name));
    let new = stockgate::script::Scripts::new();
    let holds = [stock.as_slice(), b":holds"].concat();
    let held = [stock.as_slice(), b":held"].concat();
    let nonces = std::cell::Cell::new(0u32);
    // A call of `body` on request `id`: the scripts before took four keys
    // and their settings one by one, these six keys (seven: REVERT and
    // CONFIRM) and one settings text.
    let call = |body: &str, before: bool, id: &str, caller: &[&str], settings: &[&str]| {
        nonces.set(nonces.get() + 1);
        let nonce = format!("{:x}", nonces.get());
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(body);
        if before {
            cmd.arg(4)
                .arg(&stock)
                .arg(record_key(sku, id))
                .arg(&holds)
                .arg(&held);
            cmd.arg(caller).arg(settings).arg(&nonce).arg("0").arg("0");
        } else {
            // REVERT and CONFIRM declare the SKU's locations hash too (a
            // SKU of either kind is theirs).
            let located = body == new.revert.body || body == new.confirm.body;
            cmd.arg(if located { 7 } else { 6 })
                .arg(&stock)
                .arg(record_key(sku, id))
                .arg(&holds)
                .arg(&held)
                .arg([stock.as_slice(), b":journal:on"].concat())
                .arg([stock.as_slice(), b":journal"].concat());
            if located {
                cmd.arg([stock.as_slice(), b":loc"].concat());
            }
            cmd.arg(caller)
                .arg(format!("{} 00", settings.join(" ")))
                .arg(&nonce);
        }
        let reply = parse(cmd.query::<Value>(&mut *direct.borrow_mut()).unwrap());
        (reply.code, reply.remain)
    };
    let deduct = ["86400000", "1000000", "error"];
    let end = ["86400000", "error"];
    let hold = ["600000", "86400000", "1000000", "error"];
    let (old_deduct, old_hold, old_revert) = (old("deduct"), old("hold"), old("revert"));
    // Deducted by one, retried through the other: a duplicate.
    assert_eq!(
        call(&new.deduct.body, false, "r1", &["2", ""], &deduct),
        (0, 8)
    );
    assert_eq!(call(&old_deduct, true, "r1", &["2", ""], &deduct), (1, 8));
    assert_eq!(call(&old_deduct, true, "r2", &["3", ""], &deduct), (0, 5));
    assert_eq!(
        call(&new.deduct.body, false, "r2", &["3", ""], &deduct),
        (1, 5)
    );
    // A hold placed by one, confirmed by the other; deductions given back
    // across too, and a second REVERT a duplicate.
    assert_eq!(
        call(&old_hold, true, "h1", &["1", "", "60000"], &hold),
        (0, 4)
    );
    assert_eq!(call(&new.confirm.body, false, "h1", &[], &end), (0, 4));
    assert_eq!(call(&old_revert, true, "r1", &[], &end), (0, 6));
    assert_eq!(call(&new.revert.body, false, "r2", &[], &end), (0, 9));
    assert_eq!(call(&old_revert, true, "r2", &[], &end), (1, 9));
    let left: i64 = redis::cmd("GET")
        .arg(&stock)
        .query(&mut *direct.borrow_mut())
        .unwrap();
    assert_eq!(left, 9, "10, less the hold confirmed");
}

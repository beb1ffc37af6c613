//! The DEDUCT contract, over the wire, against a real Redis Cluster and a
//! real Valkey one (every test runs against both: `support::matrix!`).

mod support;

use redis::Value;
use std::time::Duration;
use stockgate::config::MissingStock;
use stockgate::outcome::SCRIPT_VERSION;
use support::*;

matrix! { #[tokio::test] async fn every_code_over_the_wire_in_resp2_and_resp3 }
async fn every_code_over_the_wire_in_resp2_and_resp3(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let server = proxy(cluster.seeds(), |_| {}).await;
    for resp3 in [false, true] {
        let sku = if resp3 { "sku-resp3" } else { "sku-resp2" };
        set_stock(&cluster, sku, 5);
        let mut conn = client(&server, resp3).await;

        let ok = parse(
            deduct(&mut conn, sku, "2", "req-1", Some("ORD-1"))
                .await
                .unwrap(),
        );
        assert_eq!(
            ok,
            Reply {
                code: 0,
                remain: 3,
                order_no: "ORD-1".into(),
                version: SCRIPT_VERSION,
                reason: None
            }
        );

        // The same request again: duplicate, with the first call's order_no,
        // even when this retry carries another one.
        let dup = parse(
            deduct(&mut conn, sku, "2", "req-1", Some("ORD-other"))
                .await
                .unwrap(),
        );
        assert_eq!(
            dup,
            Reply {
                code: 1,
                remain: 3,
                order_no: "ORD-1".into(),
                version: SCRIPT_VERSION,
                reason: None
            }
        );

        let short = parse(
            deduct(&mut conn, sku, "4", "req-2", Some("ORD-2"))
                .await
                .unwrap(),
        );
        assert_eq!(
            short,
            Reply {
                code: 2,
                remain: 3,
                order_no: "".into(),
                version: SCRIPT_VERSION,
                reason: None
            }
        );

        let invalid = parse(deduct(&mut conn, sku, "0", "req-3", None).await.unwrap());
        assert_eq!(invalid.code, 3);
        assert_eq!(invalid.remain, -1);
        assert_eq!(invalid.order_no, "");
        assert_eq!(invalid.version, SCRIPT_VERSION);
        assert_eq!(
            invalid.reason.as_deref(),
            Some("qty must be an integer from 1 to 1000000")
        );

        // A duplicate answers 1 even once the stock is too low for it: the
        // retry of an applied request is never "insufficient".
        let drain = parse(deduct(&mut conn, sku, "3", "req-4", None).await.unwrap());
        assert_eq!(
            (drain.code, drain.remain, drain.order_no.as_str()),
            (0, 0, "")
        );
        let late_retry = parse(
            deduct(&mut conn, sku, "2", "req-1", Some("ORD-1"))
                .await
                .unwrap(),
        );
        assert_eq!((late_retry.code, late_retry.remain), (1, 0));
        assert_eq!(get_stock(&cluster, sku), Some(0));
    }
}

matrix! { #[tokio::test] async fn command_names_are_case_insensitive_and_arity_uses_redis_wording }
async fn command_names_are_case_insensitive_and_arity_uses_redis_wording(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "case", 10);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let reply: Value = redis::cmd("dEdUcT")
        .arg("case")
        .arg(1)
        .arg("r1")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(parse(reply).code, 0);
    for args in [
        vec!["case", "1"],
        vec!["case", "1", "r2", "o", "extra"],
        vec![],
    ] {
        let err = redis::cmd("DEDUCT")
            .arg(&args)
            .query_async::<Value>(&mut conn)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("ERR"), "{args:?}");
        assert_eq!(
            err.detail(),
            Some("wrong number of arguments for 'deduct' command"),
            "{args:?}"
        );
    }
    assert_eq!(get_stock(&cluster, "case"), Some(9));
}

matrix! { #[tokio::test] async fn invalid_parameters_are_refused_before_redis }
async fn invalid_parameters_are_refused_before_redis(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "valid-sku", 10);
    let server = proxy(cluster.seeds(), |c| c.max_qty = 50).await;
    let mut conn = client(&server, false).await;
    let long = "x".repeat(129);
    let cases: &[(&str, &str, &str, Option<&str>, &str)] = &[
        (
            "valid-sku",
            "51",
            "r",
            None,
            "qty must be an integer from 1 to 50",
        ),
        (
            "valid-sku",
            "-1",
            "r",
            None,
            "qty must be an integer from 1 to 50",
        ),
        (
            "valid-sku",
            "1.5",
            "r",
            None,
            "qty must be an integer from 1 to 50",
        ),
        (
            "valid-sku",
            "abc",
            "r",
            None,
            "qty must be an integer from 1 to 50",
        ),
        ("bad sku", "1", "r", None, "sku must be"),
        ("bad{sku}", "1", "r", None, "sku must be"),
        (&long, "1", "r", None, "sku must be"),
        ("valid-sku", "1", "", None, "request_id must be"),
        ("valid-sku", "1", "r id", None, "request_id must be"),
        ("valid-sku", "1", &long, None, "request_id must be"),
        ("valid-sku", "1", "r", Some(&long), "order_no must be"),
        ("valid-sku", "1", "r", Some("tab\there"), "order_no must be"),
    ];
    let before = script_calls(&cluster);
    for (sku, qty, id, order_no, reason) in cases {
        let reply = parse(deduct(&mut conn, sku, qty, id, *order_no).await.unwrap());
        assert_eq!(reply.code, 3, "{sku:?} {qty:?} {id:?}");
        assert_eq!(reply.remain, -1);
        assert!(
            reply.reason.as_deref().unwrap().starts_with(reason),
            "{:?} should start with {reason:?}",
            reply.reason
        );
    }
    assert_eq!(
        script_calls(&cluster),
        before,
        "no invalid request reached Redis"
    );
    assert_eq!(get_stock(&cluster, "valid-sku"), Some(10));
}

matrix! { #[tokio::test] async fn the_record_has_a_ttl_within_the_window_and_shares_the_stock_slot }
async fn the_record_has_a_ttl_within_the_window_and_shares_the_stock_slot(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "ttl-sku", 10);
    let window = Duration::from_secs(15 * 60);
    let server = proxy(cluster.seeds(), |c| c.retry_window = window).await;
    let mut conn = client(&server, false).await;
    assert_eq!(
        parse(
            deduct(&mut conn, "ttl-sku", "1", "ttl-req", Some("ORD-T"))
                .await
                .unwrap()
        )
        .code,
        0
    );

    let mut redis = cluster.cluster_connection().unwrap();
    let record = record_key("ttl-sku", "ttl-req");
    let pttl: i64 = redis::cmd("PTTL").arg(&record).query(&mut redis).unwrap();
    assert!(
        pttl > (window.as_millis() as i64) - 10_000 && pttl <= window.as_millis() as i64,
        "PTTL {pttl} should be just under the 15 min window"
    );
    let stored: String = redis::cmd("GET").arg(&record).query(&mut redis).unwrap();
    assert_eq!(
        summary(&stored),
        "D:1:ORD-T",
        "the record keeps qty and order_no"
    );

    // A duplicate does not refresh the TTL.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        parse(
            deduct(&mut conn, "ttl-sku", "1", "ttl-req", None)
                .await
                .unwrap()
        )
        .code,
        1
    );
    let after: i64 = redis::cmd("PTTL").arg(&record).query(&mut redis).unwrap();
    assert!(
        after <= pttl - 1000,
        "TTL went from {pttl} to {after}: a duplicate refreshed it"
    );

    let mut node = cluster.nodes[0].connection().unwrap();
    let slot = |key: &[u8], node: &mut redis::Connection| -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(node)
            .unwrap()
    };
    let stock_slot = slot(&stock_key("ttl-sku"), &mut node);
    assert_eq!(stock_slot, slot(&record, &mut node));
    assert_eq!(
        stock_slot,
        stockgate::keys::slot(&stock_key("ttl-sku")) as i64,
        "CRC16 agrees with Redis"
    );
}

matrix! { #[tokio::test] async fn a_missing_sku_is_an_error_by_default_and_zero_on_request }
async fn a_missing_sku_is_an_error_by_default_and_zero_on_request(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let strict = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&strict, false).await;
    let err = deduct(&mut conn, "no-such-sku", "1", "r1", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("UNKNOWNSKU"));
    assert!(err.detail().unwrap().contains("nothing was changed"));

    let lenient = proxy(cluster.seeds(), |c| c.missing_stock = MissingStock::Zero).await;
    let mut conn = client(&lenient, false).await;
    let reply = parse(
        deduct(&mut conn, "no-such-sku", "1", "r1", None)
            .await
            .unwrap(),
    );
    assert_eq!(
        (reply.code, reply.remain, reply.order_no.as_str()),
        (2, 0, "")
    );

    let mut redis = cluster.cluster_connection().unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(stock_key("no-such-sku"))
        .arg(record_key("no-such-sku", "r1"))
        .query(&mut redis)
        .unwrap();
    assert_eq!(exists, 0, "neither mode writes anything for a missing sku");
}

matrix! { #[tokio::test] async fn reusing_a_request_id_with_another_qty_is_invalid_and_changes_nothing }
async fn reusing_a_request_id_with_another_qty_is_invalid_and_changes_nothing(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "reuse", 10);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    assert_eq!(
        parse(
            deduct(&mut conn, "reuse", "2", "same-id", Some("ORD-A"))
                .await
                .unwrap()
        )
        .code,
        0
    );
    let reply = parse(
        deduct(&mut conn, "reuse", "3", "same-id", Some("ORD-B"))
            .await
            .unwrap(),
    );
    assert_eq!(reply.code, 3);
    assert_eq!(
        reply.remain, 8,
        "code 3 from the script reports the current stock"
    );
    assert_eq!(
        reply.reason.as_deref(),
        Some("request_id was already used with qty 2 on this sku")
    );
    assert_eq!(get_stock(&cluster, "reuse"), Some(8));
    let mut redis = cluster.cluster_connection().unwrap();
    let stored: String = redis::cmd("GET")
        .arg(record_key("reuse", "same-id"))
        .query(&mut redis)
        .unwrap();
    assert_eq!(
        summary(&stored),
        "D:2:ORD-A",
        "the stored record is untouched"
    );
}

matrix! { #[tokio::test] async fn a_non_integer_stock_is_an_error_and_nothing_is_written }
async fn a_non_integer_stock_is_an_error_and_nothing_is_written(kind: ServerKind) {
    let cluster = cluster_of(kind);
    let mut redis = cluster.cluster_connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("corrupt"))
        .arg("12abc")
        .query::<()>(&mut redis)
        .unwrap();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let err = deduct(&mut conn, "corrupt", "1", "r1", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("BADSTOCK"));
    let stock: String = redis::cmd("GET")
        .arg(stock_key("corrupt"))
        .query(&mut redis)
        .unwrap();
    assert_eq!(stock, "12abc");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(record_key("corrupt", "r1"))
        .query(&mut redis)
        .unwrap();
    assert_eq!(exists, 0);
}

matrix! { #[tokio::test] async fn a_standalone_server_works_the_same }
async fn a_standalone_server_works_the_same(kind: ServerKind) {
    let redis = standalone_of(kind);
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("solo"))
        .arg(3)
        .query::<()>(&mut direct)
        .unwrap();
    let server = proxy(vec![redis.url()], |_| {}).await;
    assert_eq!(
        server.shared().upstream.mode(),
        Some(stockgate::upstream::Mode::Standalone),
        "auto mode detects a non-cluster redis"
    );
    let mut conn = client(&server, false).await;
    assert_eq!(
        parse(deduct(&mut conn, "solo", "2", "a", None).await.unwrap()).remain,
        1
    );
    assert_eq!(
        parse(deduct(&mut conn, "solo", "2", "a", None).await.unwrap()).code,
        1
    );
    assert_eq!(
        parse(deduct(&mut conn, "solo", "2", "b", None).await.unwrap()).code,
        2
    );
    let stock: i64 = redis::cmd("GET")
        .arg(stock_key("solo"))
        .query(&mut direct)
        .unwrap();
    assert_eq!(stock, 1);
}

matrix! { #[tokio::test] async fn remains_near_powers_of_ten_reach_the_client_byte_exact }
async fn remains_near_powers_of_ten_reach_the_client_byte_exact(kind: ServerKind) {
    // Issue 11: with stock 10^15, the reply carrying remain 999999999999998
    // was followed by a stray NUL, and the next pipelined reply was misread.
    use std::io::{Read, Write};
    use tokio_util::codec::Decoder as _;
    let redis = standalone_of(kind);
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("sku:7"))
        .arg(1_000_000_000_000_000_i64)
        .query::<()>(&mut direct)
        .unwrap();
    let server = proxy(vec![redis.url()], |c| {
        c.max_qty = stockgate::config::MAX_MAX_QTY;
    })
    .await;
    // Remains 10^15 - 2, - 3, - 4, then 10^14 - 1.
    let qtys = ["2", "1", "1", "899999999999997"];
    let mut pipelined = Vec::new();
    for (i, qty) in qtys.iter().enumerate() {
        pipelined.extend(encode_request(&[
            "DEDUCT",
            "sku:7",
            qty,
            &format!("big-{i}"),
        ]));
    }
    let addr = server.addr;
    // Blocking socket I/O off the runtime thread, which serves stockgate.
    let remains = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(&pipelined).unwrap();
        let mut codec = redis::ValueCodec::default();
        let mut wire = bytes::BytesMut::new();
        let mut remains = Vec::new();
        let mut chunk = [0u8; 4096];
        while remains.len() < qtys.len() {
            match codec.decode(&mut wire).unwrap() {
                Some(value) => {
                    let reply = parse(value);
                    assert_eq!(reply.code, 0, "{reply:?}");
                    remains.push(reply.remain);
                }
                None => {
                    let n = stream.read(&mut chunk).unwrap();
                    assert!(n > 0, "stockgate closed after {remains:?}");
                    assert!(!chunk[..n].contains(&0), "a NUL byte on the wire");
                    wire.extend_from_slice(&chunk[..n]);
                }
            }
        }
        assert!(wire.is_empty(), "bytes left over: {wire:?}");
        remains
    })
    .await
    .unwrap();
    assert_eq!(
        remains,
        [
            999_999_999_999_998,
            999_999_999_999_997,
            999_999_999_999_996,
            99_999_999_999_999
        ]
    );
}

#[tokio::test]
async fn the_script_answers_an_error_for_stockgates_own_arguments_and_3_for_the_callers() {
    // A caller may send EVALSHA directly. What stockgate itself supplies
    // (its settings, the key layout, the nonce) is never the
    // caller's fault, so it is a BADCALL error, not "invalid parameters",
    // which callers never retry.
    let redis = standalone();
    let mut direct = redis.node.connection().unwrap();
    redis::cmd("SET")
        .arg(stock_key("own"))
        .arg(10)
        .query::<()>(&mut direct)
        .unwrap();
    let scripts = stockgate::script::Scripts::new();
    let stock = stock_key("own");
    let record = record_key("own", "r1");
    // qty, order_no, the settings (window, max qty, missing-stock mode,
    // flags), the nonce.
    let good = ["2", "", "86400000 100 error 00", "00ff"];
    // The script takes the stock and record keys, then the SKU's holds,
    // held units, journal marker and journal (`side`, own's unless a case
    // says); `extra` names a seventh.
    let own_side: [&[u8]; 4] = [
        b"stock:{own}:holds",
        b"stock:{own}:held",
        b"stock:{own}:journal:on",
        b"stock:{own}:journal",
    ];
    let call_full = |keys: [&[u8]; 2],
                     side: [&[u8]; 4],
                     extra: Option<&[u8]>,
                     argv: &[&str],
                     direct: &mut redis::Connection| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&scripts.deduct.body)
            .arg(6 + usize::from(extra.is_some()))
            .arg(keys[0])
            .arg(keys[1])
            .arg(&side[..]);
        if let Some(extra) = extra {
            cmd.arg(extra);
        }
        for a in argv {
            cmd.arg(*a);
        }
        cmd.query::<Value>(direct)
    };
    let call_with =
        |keys: [&[u8]; 2], extra: Option<&[u8]>, argv: &[&str], direct: &mut redis::Connection| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(&scripts.deduct.body)
                .arg(6 + usize::from(extra.is_some()))
                .arg(keys[0])
                .arg(keys[1])
                .arg(&own_side[..]);
            if let Some(extra) = extra {
                cmd.arg(extra);
            }
            for a in argv {
                cmd.arg(*a);
            }
            cmd.query::<Value>(direct)
        };
    let call = |keys: [&[u8]; 2], argv: [&str; 4], direct: &mut redis::Connection| {
        call_with(keys, None, &argv, direct)
    };
    let err = call_with(
        [&stock, &record],
        Some(b"stock:{own}:holds"),
        &good,
        &mut direct,
    )
    .unwrap_err();
    assert_eq!(err.code(), Some("BADCALL"), "a key too many: {err:?}");
    // Each of the SKU's other keys must be its own, in its place.
    for side in [
        [own_side[1], own_side[0], own_side[2], own_side[3]],
        [
            b"stock:{other}:holds",
            own_side[1],
            own_side[2],
            own_side[3],
        ],
        [
            own_side[0],
            own_side[1],
            b"stock:{own}:journal",
            own_side[3],
        ],
        [
            own_side[0],
            own_side[1],
            own_side[2],
            b"stock:{other}:journal",
        ],
    ] {
        let err = call_full([&stock, &record], side, None, &good, &mut direct).unwrap_err();
        assert_eq!(err.code(), Some("BADCALL"), "{side:?}: {err:?}");
    }
    let own_faults: [([&[u8]; 2], [&str; 4]); 10] = [
        ([&stock, &record], ["2", "", "59999 100 error 00", "00ff"]),
        (
            [&stock, &record],
            ["2", "", "86400000 100 maybe 00", "00ff"],
        ),
        ([&stock, &record], ["2", "", "86400000 0 error 00", "00ff"]),
        // The flags: "<replicate><journal>".
        ([&stock, &record], ["2", "", "86400000 100 error 2", "00ff"]),
        (
            [&stock, &record],
            ["2", "", "86400000 100 error x1", "00ff"],
        ),
        // Words missing or too many.
        ([&stock, &record], ["2", "", "86400000 100 error", "00ff"]),
        (
            [&stock, &record],
            ["2", "", "86400000 100 error 00 0", "00ff"],
        ),
        (
            [&stock, &record],
            ["2", "", "86400000 100 error 00", "not-hex"],
        ),
        ([&stock, b"elsewhere:req:r1"], good),
        ([b"stock:own", &record], good),
    ];
    for (keys, argv) in own_faults {
        let err = call(keys, argv, &mut direct).unwrap_err();
        assert_eq!(err.code(), Some("BADCALL"), "{argv:?}: {err:?}");
        let fault = stockgate::error::UpstreamError::from_redis(&err);
        assert_eq!(fault.kind, stockgate::error::FaultKind::BadCall);
        assert!(
            fault.reply_text().starts_with("BADREPLY "),
            "{}",
            fault.reply_text()
        );
    }
    // The caller's qty and order_no: code 3.
    for argv in [
        ["0", "", "86400000 100 error 00", "00ff"],
        ["101", "", "86400000 100 error 00", "00ff"],
        ["2", "bad\norder", "86400000 100 error 00", "00ff"],
    ] {
        let reply = parse(call([&stock, &record], argv, &mut direct).unwrap());
        assert_eq!(reply.code, 3, "{argv:?}");
    }
    let stock_now: i64 = redis::cmd("GET").arg(&stock).query(&mut direct).unwrap();
    assert_eq!(stock_now, 10, "nothing was changed");
    let exists: bool = redis::cmd("EXISTS")
        .arg(&record)
        .query(&mut direct)
        .unwrap();
    assert!(!exists, "no record was written");
    // And a good call still deducts.
    assert_eq!(
        parse(call([&stock, &record], good, &mut direct).unwrap()).code,
        0
    );
}

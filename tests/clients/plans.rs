//! Plans: the DEDUCTs and REVERTs a test sends, the reply stockgate owes for
//! each (in the typed JSON the drivers print), and what Redis must hold
//! afterwards.

use crate::support::*;
use redis::Value;
use serde_json::{Value as Json, json};
use std::net::SocketAddr;
use stockgate::dev::LocalCluster;
use stockgate::outcome::SCRIPT_VERSION;

pub const QTY_REASON: &str = "qty must be an integer from 1 to 1000000";
pub const REQUEST_ID_REASON: &str =
    "request_id must be 1 to 128 printable ASCII bytes without whitespace, '{' or '}'";
pub const UNKNOWN_SKU: &str = "UNKNOWNSKU no stock is recorded for this sku; nothing was changed";

/// One reply stockgate owes.
pub enum Owed {
    Reply {
        code: i64,
        remain: i64,
        order_no: String,
        reason: Option<&'static str>,
    },
    Error(&'static str),
}

pub fn reply(code: i64, remain: i64, order_no: &str) -> Owed {
    Owed::Reply {
        code,
        remain,
        order_no: order_no.to_owned(),
        reason: None,
    }
}

pub fn invalid(remain: i64, reason: &'static str) -> Owed {
    Owed::Reply {
        code: 3,
        remain,
        order_no: String::new(),
        reason: Some(reason),
    }
}

#[derive(Default)]
pub struct Plan {
    pub commands: Vec<Vec<String>>,
    owed: Vec<Owed>,
    /// sku -> stock afterwards (None: no stock key).
    stocks: Vec<(String, Option<i64>)>,
    /// (sku, request_id) -> record afterwards (None: no record).
    records: Vec<(String, String, Option<String>)>,
}

impl Plan {
    /// `DEDUCT <sku> <qty> <request_id> [order_no]`.
    pub fn deduct(&mut self, args: &[&str], owed: Owed) {
        self.push("DEDUCT", args, owed);
    }

    /// `REVERT <sku> <request_id>`.
    pub fn revert(&mut self, args: &[&str], owed: Owed) {
        self.push("REVERT", args, owed);
    }

    fn push(&mut self, name: &str, args: &[&str], owed: Owed) {
        let mut command = vec![name.to_owned()];
        command.extend(args.iter().map(|a| a.to_string()));
        self.commands.push(command);
        self.owed.push(owed);
    }

    /// The replies as the drivers print them; `error_class` is what the
    /// client raises for an error reply.
    pub fn expected(&self, error_class: &str) -> Vec<Json> {
        self.owed
            .iter()
            .map(|owed| match owed {
                Owed::Reply {
                    code,
                    remain,
                    order_no,
                    reason,
                } => {
                    let mut fields = vec![
                        json!({"int": code}),
                        json!({"int": remain}),
                        json!({"str": order_no}),
                        json!({"int": SCRIPT_VERSION}),
                    ];
                    fields.extend(reason.map(|r| json!({"str": r})));
                    Json::Array(fields)
                }
                Owed::Error(text) => json!({"error": text, "class": error_class}),
            })
            .collect()
    }

    /// Reads stock keys and idempotency records straight from the cluster.
    pub fn audit(&self, cluster: &LocalCluster) {
        let mut redis = cluster.cluster_connection().unwrap();
        for (sku, stock) in &self.stocks {
            let got: Option<i64> = redis::cmd("GET")
                .arg(stock_key(sku))
                .query(&mut redis)
                .unwrap();
            assert_eq!(&got, stock, "stock of {sku}");
        }
        for (sku, request_id, record) in &self.records {
            let key = record_key(sku, request_id);
            let got: Option<String> = redis::cmd("GET").arg(&key).query(&mut redis).unwrap();
            let got = got.as_deref().map(summary);
            assert_eq!(&got, record, "record of {sku} {request_id}");
            if record.is_some() {
                let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut redis).unwrap();
                assert!((1..=86_400).contains(&ttl), "record TTL {ttl}");
            }
        }
    }
}

/// One command at a time on skus named after `tag`. DEDUCT: codes 0, 1,
/// 2, 3 (a bad qty, and a request_id reused with another qty) and
/// UNKNOWNSKU, with and without order_no. REVERT: a deduction given back
/// (0, with its order_no, and without one), reverted again (1), then
/// DEDUCTed again (4); an id never deducted (4, empty rollback), then
/// DEDUCTed (4, hanging) and reverted again (1); a bad request_id (3).
pub fn codes_plan(cluster: &LocalCluster, tag: &str) -> Plan {
    let sku = format!("{tag}-sku");
    let unstocked = format!("{tag}-unstocked");
    let order = format!("ORD-{tag}");
    let id = |n: u32| format!("{tag}-req-{n}");
    set_stocks(cluster, &[(sku.clone(), 10)]);
    let mut plan = Plan::default();
    plan.deduct(&[&sku, "3", &id(1), &order], reply(0, 7, &order));
    plan.deduct(&[&sku, "3", &id(1), &order], reply(1, 7, &order));
    plan.deduct(&[&sku, "8", &id(2), &order], reply(2, 7, ""));
    plan.deduct(&[&sku, "0", &id(3)], invalid(-1, QTY_REASON));
    plan.deduct(
        &[&sku, "2", &id(1), &order],
        invalid(7, "request_id was already used with qty 3 on this sku"),
    );
    plan.deduct(&[&unstocked, "1", &id(4)], Owed::Error(UNKNOWN_SKU));
    plan.deduct(&[&sku, "7", &id(5)], reply(0, 0, ""));
    plan.deduct(&[&sku, "7", &id(5)], reply(1, 0, ""));

    // The qty comes back from the record; remain is the stock after it.
    plan.revert(&[&sku, &id(1)], reply(0, 3, &order));
    plan.revert(&[&sku, &id(1)], reply(1, 3, &order));
    plan.deduct(&[&sku, "3", &id(1), &order], reply(4, 3, ""));
    plan.revert(&[&sku, &id(6)], reply(4, 3, ""));
    plan.deduct(&[&sku, "1", &id(6), &order], reply(4, 3, ""));
    plan.revert(&[&sku, &id(6)], reply(1, 3, ""));
    plan.revert(&[&sku, &id(5)], reply(0, 10, ""));
    plan.revert(
        &[&sku, &format!("{{{}}}", id(7))],
        invalid(-1, REQUEST_ID_REASON),
    );

    plan.stocks = vec![(sku.clone(), Some(10)), (unstocked, None)];
    plan.records = vec![
        (sku.clone(), id(1), Some(format!("R:3:{order}"))),
        (sku.clone(), id(2), None),
        (sku.clone(), id(3), None),
        (sku.clone(), id(5), Some("R:7:".to_owned())),
        (sku, id(6), Some("V:0:".to_owned())),
    ];
    plan
}

/// What a pipeline plan's sku went through before the pipeline is sent.
enum Before {
    /// DEDUCT qty 2 of 5.
    Deducted,
    /// DEDUCT qty 2 of 5, then REVERT.
    Reverted,
    /// REVERT only: the id is revoked.
    Revoked,
}

/// 100 independent commands, one sku each (its stock 5 unless said):
/// DEDUCT code 0, code 2 (empty stock), code 1 (deducted beforehand),
/// code 4 (revoked beforehand), code 3 for a bad qty and a bad request_id,
/// UNKNOWNSKU; REVERT code 0 (deducted beforehand), code 1 (reverted
/// beforehand), code 4 (never deducted), code 3 for a bad request_id.
/// "Beforehand" goes through `stockgate` too, before the pipeline.
pub async fn pipeline_plan(cluster: &LocalCluster, stockgate: SocketAddr, tag: &str) -> Plan {
    let mut plan = Plan::default();
    let mut stocks = Vec::new();
    let mut before = Vec::new();
    for i in 0..100 {
        let sku = format!("{tag}-p{i}");
        let id = format!("{tag}-p{i}-req");
        let order = format!("ORD-{tag}-{i}");
        let bad_id = format!("{{{id}}}");
        // Alternate tens of the plan send different commands in one slot.
        let odd_ten = (i / 10) % 2 == 1;
        let stock = if i % 10 <= 3 { i % 7 } else { 5 };
        let (stock_after, record) = match i % 10 {
            0..=3 if stock > 0 => {
                plan.deduct(&[&sku, "1", &id, &order], reply(0, stock - 1, &order));
                (stock - 1, Some(format!("D:1:{order}")))
            }
            0..=3 => {
                plan.deduct(&[&sku, "1", &id, &order], reply(2, 0, ""));
                (0, None)
            }
            4 => {
                before.push((sku.clone(), id.clone(), order.clone(), Before::Deducted));
                plan.revert(&[&sku, &id], reply(0, 5, &order));
                (5, Some(format!("R:2:{order}")))
            }
            5 => {
                plan.revert(&[&sku, &id], reply(4, 5, ""));
                (5, Some("V:0:".to_owned()))
            }
            6 if odd_ten => {
                before.push((sku.clone(), id.clone(), order.clone(), Before::Reverted));
                plan.revert(&[&sku, &id], reply(1, 5, &order));
                (5, Some(format!("R:2:{order}")))
            }
            6 => {
                before.push((sku.clone(), id.clone(), order.clone(), Before::Deducted));
                plan.deduct(&[&sku, "2", &id, &order], reply(1, 3, &order));
                (3, Some(format!("D:2:{order}")))
            }
            7 if odd_ten => {
                before.push((sku.clone(), id.clone(), order.clone(), Before::Revoked));
                plan.deduct(&[&sku, "2", &id, &order], reply(4, 5, ""));
                (5, Some("V:0:".to_owned()))
            }
            7 => {
                plan.deduct(&[&sku, "0", &id, &order], invalid(-1, QTY_REASON));
                (5, None)
            }
            8 => {
                if odd_ten {
                    plan.revert(&[&sku, &bad_id], invalid(-1, REQUEST_ID_REASON));
                } else {
                    plan.deduct(&[&sku, "1", &bad_id], invalid(-1, REQUEST_ID_REASON));
                }
                stocks.push((sku.clone(), 5));
                plan.stocks.push((sku, Some(5)));
                continue;
            }
            _ => {
                plan.deduct(&[&sku, "1", &id], Owed::Error(UNKNOWN_SKU));
                plan.stocks.push((sku, None));
                continue;
            }
        };
        stocks.push((sku.clone(), stock));
        plan.stocks.push((sku.clone(), Some(stock_after)));
        plan.records.push((sku, id, record));
    }
    set_stocks(cluster, &stocks);
    let mut conn = client_at(stockgate, false).await;
    for (sku, id, order, state) in before {
        let mut steps = Vec::new();
        if !matches!(state, Before::Revoked) {
            let deducted = deduct(&mut conn, &sku, "2", &id, Some(&order)).await;
            steps.push(parse(deducted.unwrap()));
        }
        if !matches!(state, Before::Deducted) {
            let reverted = redis::cmd("REVERT")
                .arg(&sku)
                .arg(&id)
                .query_async(&mut conn)
                .await;
            steps.push(parse(reverted.unwrap()));
        }
        let codes: Vec<(i64, i64)> = steps.iter().map(|r| (r.code, r.remain)).collect();
        let expected: &[(i64, i64)] = match state {
            Before::Deducted => &[(0, 3)],
            Before::Reverted => &[(0, 3), (0, 5)],
            Before::Revoked => &[(4, 5)],
        };
        assert_eq!(codes, expected, "{sku}: set up beforehand");
    }
    plan
}

/// Sets many stock keys over one cluster connection.
pub fn set_stocks(cluster: &LocalCluster, stocks: &[(String, i64)]) {
    let mut redis = cluster.cluster_connection().unwrap();
    for (sku, stock) in stocks {
        redis::cmd("SET")
            .arg(stock_key(sku))
            .arg(stock)
            .query::<()>(&mut redis)
            .unwrap();
    }
}

// ---------------------------------------------------------------------------
// Comparing replies
// ---------------------------------------------------------------------------

#[track_caller]
pub fn assert_replies(what: &str, got: &[Json], expected: &[Json]) {
    assert_eq!(got.len(), expected.len(), "{what}: reply count");
    for (i, (got, expected)) in got.iter().zip(expected).enumerate() {
        assert_eq!(got, expected, "{what}: reply {i}");
    }
}

/// A reply as the drivers print it.
pub fn typed(value: &Value, error_class: &str) -> Json {
    match value {
        Value::Int(i) => json!({"int": i}),
        Value::BulkString(b) => json!({"str": String::from_utf8_lossy(b)}),
        Value::SimpleString(s) => json!({"str": s}),
        Value::Okay => json!({"str": "OK"}),
        Value::Nil => json!({"null": true}),
        Value::Array(items) => Json::Array(items.iter().map(|v| typed(v, error_class)).collect()),
        Value::ServerError(err) => json!({
            "error": format!("{} {}", err.code(), err.details().unwrap_or_default()),
            "class": error_class,
        }),
        other => panic!("DEDUCT and REVERT never answer {other:?}"),
    }
}

pub fn strings(commands: &[&[&str]]) -> Vec<Vec<String>> {
    commands
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect()
}

/// DEDUCT or REVERT: a command of a plan, not of a client's handshake.
pub fn is_stock_command(command: &[String]) -> bool {
    ["deduct", "revert"]
        .iter()
        .any(|name| command[0].eq_ignore_ascii_case(name))
}

/// A command as every client encodes it: an array of bulk strings.
pub fn resp(args: &[String]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

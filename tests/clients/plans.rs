//! Plans: the DEDUCTs a test sends, the reply stockgate owes for each (in
//! the typed JSON the drivers print), and what Redis must hold afterwards.

use crate::support::*;
use redis::Value;
use serde_json::{Value as Json, json};
use stockgate::dev::LocalCluster;
use stockgate::outcome::SCRIPT_VERSION;
use stockgate::server::Server;

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
    pub fn deduct(&mut self, args: &[&str], owed: Owed) {
        let mut command = vec!["DEDUCT".to_owned()];
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
            assert_eq!(&got, record, "record of {sku} {request_id}");
            if record.is_some() {
                let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut redis).unwrap();
                assert!((1..=86_400).contains(&ttl), "record TTL {ttl}");
            }
        }
    }
}

/// One DEDUCT at a time: codes 0, 1, 2, 3 (twice) and UNKNOWNSKU, with and
/// without order_no, on skus named after `tag`.
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
    plan.stocks = vec![(sku.clone(), Some(0)), (unstocked, None)];
    plan.records = vec![
        (sku.clone(), id(1), Some(format!("D:3:{order}"))),
        (sku.clone(), id(2), None),
        (sku.clone(), id(3), None),
        (sku, id(5), Some("D:7:".to_owned())),
    ];
    plan
}

/// 100 independent DEDUCTs, one sku each: code 0, code 2 (empty stock),
/// code 1 (applied through stockgate beforehand), code 3 for a bad qty and
/// a bad request_id, and UNKNOWNSKU.
pub async fn pipeline_plan(cluster: &LocalCluster, server: &Server, tag: &str) -> Plan {
    let mut plan = Plan::default();
    let mut stocks = Vec::new();
    let mut applied_before = Vec::new();
    for i in 0..100 {
        let sku = format!("{tag}-p{i}");
        let id = format!("{tag}-p{i}-req");
        let order = format!("ORD-{tag}-{i}");
        match i % 10 {
            0..=5 => {
                let stock = i % 7;
                stocks.push((sku.clone(), stock));
                if stock > 0 {
                    plan.deduct(&[&sku, "1", &id, &order], reply(0, stock - 1, &order));
                    plan.stocks.push((sku.clone(), Some(stock - 1)));
                    plan.records.push((sku, id, Some(format!("D:1:{order}"))));
                } else {
                    plan.deduct(&[&sku, "1", &id, &order], reply(2, 0, ""));
                    plan.stocks.push((sku.clone(), Some(0)));
                    plan.records.push((sku, id, None));
                }
            }
            6 => {
                stocks.push((sku.clone(), 5));
                applied_before.push((sku.clone(), id.clone(), order.clone()));
                plan.deduct(&[&sku, "2", &id, &order], reply(1, 3, &order));
                plan.stocks.push((sku.clone(), Some(3)));
                plan.records.push((sku, id, Some(format!("D:2:{order}"))));
            }
            7 => {
                stocks.push((sku.clone(), 5));
                plan.deduct(&[&sku, "0", &id, &order], invalid(-1, QTY_REASON));
                plan.stocks.push((sku.clone(), Some(5)));
                plan.records.push((sku, id, None));
            }
            8 => {
                stocks.push((sku.clone(), 5));
                plan.deduct(
                    &[&sku, "1", &format!("{{{id}}}")],
                    invalid(-1, REQUEST_ID_REASON),
                );
                plan.stocks.push((sku, Some(5)));
            }
            _ => {
                plan.deduct(&[&sku, "1", &id], Owed::Error(UNKNOWN_SKU));
                plan.stocks.push((sku, None));
            }
        }
    }
    set_stocks(cluster, &stocks);
    let mut conn = client(server, false).await;
    for (sku, id, order) in applied_before {
        let first = parse(
            deduct(&mut conn, &sku, "2", &id, Some(&order))
                .await
                .unwrap(),
        );
        assert_eq!((first.code, first.remain), (0, 3), "{sku}");
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
        other => panic!("DEDUCT never answers {other:?}"),
    }
}

pub fn strings(commands: &[&[&str]]) -> Vec<Vec<String>> {
    commands
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect()
}

pub fn is_deduct(command: &[String]) -> bool {
    command[0].eq_ignore_ascii_case("deduct")
}

pub fn positions(commands: &[Vec<String>], which: fn(&[String]) -> bool) -> Vec<usize> {
    (0..commands.len())
        .filter(|&i| which(&commands[i]))
        .collect()
}

/// A command as every client encodes it: an array of bulk strings.
pub fn resp(args: &[String]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

//! DEDUCT: validate, build the keys, run the script, map its reply.
//!
//! # Format
//!
//! ```text
//! DEDUCT <sku> <qty> <request_id> [order_no]
//! ```
//!
//! Replies `[code, remain, order_no, version]` (plus a reason for code 3),
//! or an error reply for a system fault. See [`crate::outcome`] for the
//! codes and `lua/deduct.lua` for the script.

use crate::config::{Config, MissingStock};
use crate::error::{FaultKind, UpstreamError};
use crate::keys::KeyLayout;
use crate::metrics::{CommandLabel, Metrics, ResultLabel};
use crate::outcome::{Code, DeductReply};
use crate::params::{InvalidParam, OrderNo, Qty, RequestId, Sku};
use crate::script::LuaScript;
use crate::upstream::Upstream;
use bytes::Bytes;
use redis::Value;
use std::sync::Arc;
use std::time::Instant;

/// One validated deduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deduct {
    pub sku: Sku,
    pub qty: Qty,
    pub request_id: RequestId,
    pub order_no: OrderNo,
}

impl Deduct {
    /// Checks the arguments after the command name: sku, qty, request_id,
    /// and an optional order_no. The caller has checked their count.
    pub fn parse(args: &[Bytes], max_qty: u64) -> Result<Deduct, InvalidParam> {
        Ok(Deduct {
            sku: Sku::parse(args[0].clone())?,
            qty: Qty::parse(args[1].clone(), max_qty)?,
            request_id: RequestId::parse(args[2].clone())?,
            order_no: match args.get(3) {
                Some(order_no) => OrderNo::parse(order_no.clone())?,
                None => OrderNo::default(),
            },
        })
    }
}

/// Everything DEDUCT needs, shared by every connection.
pub struct Deductor {
    upstream: Arc<Upstream>,
    script: Arc<LuaScript>,
    keys: KeyLayout,
    max_qty: u64,
    /// Script arguments that never change, spelled once at startup.
    max_qty_arg: String,
    retry_window_ms: String,
    missing_stock: MissingStock,
    metrics: Arc<Metrics>,
}

/// What one DEDUCT came to: a business outcome or a system fault.
pub type DeductResult = Result<DeductReply, UpstreamError>;

impl Deductor {
    pub fn new(
        config: &Config,
        upstream: Arc<Upstream>,
        script: Arc<LuaScript>,
        metrics: Arc<Metrics>,
    ) -> Deductor {
        Deductor {
            upstream,
            script,
            keys: config.keys.clone(),
            max_qty: config.max_qty,
            max_qty_arg: config.max_qty.to_string(),
            retry_window_ms: config.retry_window.as_millis().to_string(),
            missing_stock: config.missing_stock,
            metrics,
        }
    }

    /// Serves one DEDUCT whose arguments (after the name) are `args`, and
    /// records its metrics. `arrived` is when the request was read.
    pub async fn serve(&self, args: &[Bytes], arrived: Instant) -> DeductResult {
        let result = match Deduct::parse(args, self.max_qty) {
            Ok(deduct) => self.apply(&deduct).await,
            Err(invalid) => Ok(DeductReply::invalid(invalid.0)),
        };
        let label = match &result {
            Ok(reply) => ResultLabel::Code(reply.code),
            Err(err) => {
                self.metrics.record_upstream_error(err.kind);
                ResultLabel::Error
            }
        };
        self.metrics
            .record_request(CommandLabel::Deduct, label, arrived.elapsed());
        result
    }

    /// Runs the script for a validated deduction.
    pub async fn apply(&self, deduct: &Deduct) -> DeductResult {
        let keys = self.keys.deduct_keys(&deduct.sku, &deduct.request_id);
        let started = Instant::now();
        let value = self
            .upstream
            .eval(
                &self.script,
                &[&keys.stock, &keys.record],
                &[
                    deduct.qty.as_bytes(),
                    deduct.order_no.as_bytes(),
                    self.retry_window_ms.as_bytes(),
                    self.max_qty_arg.as_bytes(),
                    self.missing_stock.as_arg().as_bytes(),
                ],
            )
            .await;
        self.metrics
            .record_upstream(CommandLabel::Deduct, started.elapsed());
        parse_script_reply(value?)
    }
}

/// Maps the script's reply, checking its shape. Elements after the fifth
/// are ignored, so a newer script that appends some still works; anything
/// else unexpected is a BADREPLY, never a guessed code.
pub fn parse_script_reply(value: Value) -> DeductResult {
    let bad = |why: &str, value: &Value| {
        let mut shown = format!("{value:?}");
        shown.truncate(200);
        UpstreamError::new(FaultKind::BadReply, format!("script reply {why}: {shown}"))
    };
    let Value::Array(items) = &value else {
        return Err(bad("is not an array", &value));
    };
    if items.len() < 4 {
        return Err(bad("has fewer than 4 elements", &value));
    }
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(Bytes::copy_from_slice(b)),
        Value::SimpleString(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        _ => None,
    };
    let code = int(&items[0])
        .and_then(Code::from_wire)
        .ok_or_else(|| bad("has an unknown code", &value))?;
    let remain = int(&items[1]).ok_or_else(|| bad("has a non-integer remain", &value))?;
    let order_no = text(&items[2]).ok_or_else(|| bad("has a non-string order_no", &value))?;
    let version = int(&items[3])
        .filter(|v| *v >= 1)
        .ok_or_else(|| bad("has no valid version", &value))?;
    let reason = match items.get(4) {
        Some(v) => Some(text(v).ok_or_else(|| bad("has a non-string reason", &value))?),
        None => None,
    };
    Ok(DeductReply {
        code,
        remain,
        order_no,
        version,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<Bytes> {
        list.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn parse_checks_each_field() {
        let d = Deduct::parse(&args(&["sku1", "2", "req-1", "ORD-9"]), 10).unwrap();
        assert_eq!(d.qty.get(), 2);
        assert_eq!(d.order_no.as_bytes(), b"ORD-9");
        let d = Deduct::parse(&args(&["sku1", "2", "req-1"]), 10).unwrap();
        assert_eq!(d.order_no.as_bytes(), b"");
        let err = Deduct::parse(&args(&["sku1", "11", "req-1"]), 10).unwrap_err();
        assert_eq!(err.0, "qty must be an integer from 1 to 10");
        assert!(Deduct::parse(&args(&["s k", "1", "r"]), 10).is_err());
        assert!(Deduct::parse(&args(&["s", "1", "r{x}"]), 10).is_err());
    }

    #[test]
    fn script_replies_map_to_codes() {
        let reply = parse_script_reply(Value::Array(vec![
            Value::Int(1),
            Value::Int(7),
            Value::BulkString(b"ORD".to_vec()),
            Value::Int(1),
            Value::BulkString(b"appended later".to_vec()),
            Value::Int(99),
        ]))
        .unwrap();
        assert_eq!(reply.code, Code::Duplicate);
        assert_eq!(reply.remain, 7);
        assert_eq!(&reply.order_no[..], b"ORD");
    }

    #[test]
    fn odd_script_replies_are_bad_replies_not_codes() {
        let odd = [
            Value::Okay,
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::BulkString(vec![]),
            ]),
            Value::Array(vec![
                Value::Int(9),
                Value::Int(1),
                Value::BulkString(vec![]),
                Value::Int(1),
            ]),
            Value::Array(vec![
                Value::BulkString(b"0".to_vec()),
                Value::Int(1),
                Value::BulkString(vec![]),
                Value::Int(1),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::BulkString(vec![]),
                Value::Int(0),
            ]),
        ];
        for value in odd {
            let err = parse_script_reply(value).unwrap_err();
            assert_eq!(err.kind, FaultKind::BadReply);
            assert!(err.reply_text().starts_with("BADREPLY script reply"));
        }
    }
}

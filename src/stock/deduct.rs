//! DEDUCT: take qty units of a sku's stock, once per request_id.
//!
//! # Format
//!
//! ```text
//! DEDUCT <sku> <qty> <request_id> [order_no]
//! ```
//!
//! Replies `[code, remain, order_no, version]` (plus a reason for code 3),
//! or an error reply for a system fault. See [`crate::outcome`] for the
//! codes and `lua/deduct.lua` for the script, which validates again,
//! checks the record and changes the stock atomically.

use super::{AccessEntry, StockCommand, StockResult, StockService};
use crate::command::spec::{CommandSpec, Serve, arg, optional};
use crate::metrics::CommandLabel;
use crate::outcome::StockReply;
use crate::params::{InvalidParam, OrderNo, Qty, RequestId, Sku};
use bytes::Bytes;
use std::time::Instant;

pub const SPEC: CommandSpec = CommandSpec {
    name: "deduct",
    arity: -4,
    max_args: Some(5),
    flags: &["write", "denyoom"],
    group: "stockgate",
    summary: "Deducts qty units of a sku's stock once per request_id. Replies [code, remain, order_no, version]: 0 ok, 1 duplicate, 2 insufficient stock, 3 invalid parameters, 4 revoked.",
    args: &[
        arg("sku", "string"),
        arg("qty", "integer"),
        arg("request_id", "string"),
        optional("order_no", "string"),
    ],
    subcommands: &[],
    serve: Serve::Stock(StockCommand::Deduct),
};

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

impl StockService {
    /// DEDUCT, with its metrics and access log.
    pub async fn deduct(&self, args: &[Bytes], arrived: Instant) -> StockResult {
        let parsed =
            Deduct::parse(args, self.max_qty).and_then(|d| self.fresh(&d.request_id).map(|()| d));
        let result = match parsed {
            Ok(deduct) => self.apply_deduct(&deduct).await,
            Err(invalid) => Ok(StockReply::invalid(invalid.0)),
        };
        let entry = AccessEntry {
            command: CommandLabel::Deduct,
            sku: args.first(),
            request_id: args.get(2),
            qty: args.get(1),
        };
        self.record(entry, &result, arrived);
        result
    }

    /// Runs the DEDUCT script for a validated deduction.
    pub async fn apply_deduct(&self, deduct: &Deduct) -> StockResult {
        let keys = self.keys.deduct_keys(&deduct.sku, &deduct.request_id);
        let nonce = self.nonces.next();
        let started = Instant::now();
        let reply = self
            .upstream
            .eval_stock(
                &self.scripts.deduct,
                [&keys.stock, &keys.record],
                &[
                    deduct.qty.as_bytes(),
                    deduct.order_no.as_bytes(),
                    self.retry_window_arg.as_bytes(),
                    self.max_qty_arg.as_bytes(),
                    self.missing_stock.as_arg().as_bytes(),
                    &nonce,
                    self.replicate_arg.as_bytes(),
                ],
            )
            .await;
        self.metrics
            .record_upstream(CommandLabel::Deduct, started.elapsed());
        reply
    }
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
    fn arity_is_four_or_five_words() {
        assert!(!SPEC.arity_ok(3));
        assert!(SPEC.arity_ok(4));
        assert!(SPEC.arity_ok(5));
        assert!(!SPEC.arity_ok(6));
    }
}

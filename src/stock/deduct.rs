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

use super::Op;
use super::single::{CallerArgs, OneRequest, Setting, Single};
use crate::doc::{Doc, StockCommand, arg, optional};
use crate::params::{InvalidParam, OrderNo, Qty, RequestId, Sku};
use bytes::Bytes;

pub const DOC: Doc = Doc {
    name: StockCommand::Deduct.name(),
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
};

/// How the stock service runs it: `lua/deduct.lua` with the caller's qty
/// and order_no, then the retry window, `--max-qty` and the missing-stock
/// mode; its reply shows no expiry.
pub(super) const CALL: Single = Single {
    command: StockCommand::Deduct,
    parse: |args, limits| Deduct::parse(args, limits.max_qty).map(Op::Deduct),
    script: |scripts| &scripts.deduct,
    caller_args: 2,
    settings: &[Setting::RetryWindow, Setting::MaxQty, Setting::MissingStock],
    ends_line: false,
    shows_expiry: false,
    // <sku> <qty> <request_id> [order_no]
    request_id_at: 2,
    qty_at: Some(1),
};

/// One validated deduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deduct {
    pub sku: Sku,
    pub qty: Qty,
    pub request_id: RequestId,
    pub order_no: OrderNo,
}

impl OneRequest for Deduct {
    fn request(&self) -> (&Sku, &RequestId) {
        (&self.sku, &self.request_id)
    }

    fn caller_args(&self) -> CallerArgs<'_> {
        CallerArgs([self.qty.as_bytes(), self.order_no.as_bytes(), b""], 2)
    }

    fn qty(&self) -> Option<&[u8]> {
        Some(self.qty.as_bytes())
    }
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
        assert!(!DOC.arity_ok(3));
        assert!(DOC.arity_ok(4));
        assert!(DOC.arity_ok(5));
        assert!(!DOC.arity_ok(6));
    }
}

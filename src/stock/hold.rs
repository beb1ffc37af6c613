//! HOLD: put qty units of a sku on hold while the customer pays.
//!
//! # Format
//!
//! ```text
//! HOLD <sku> <qty> <request_id> <ttl_ms> [order_no]
//! ```
//!
//! The units leave the stock at once, as for a DEDUCT, and come back by
//! themselves at the hold's expiry (Redis time) unless a CONFIRM makes the
//! hold final first; a REVERT cancels it. Replies `[code, remain, order_no,
//! version, expires_at_ms]` (plus a reason for code 3): 0 held, 1 already
//! held or confirmed, 2 insufficient, 3 invalid, 4 reverted or revoked,
//! 5 this id's hold already ran out. `lua/hold.lua` has the script;
//! `lua/revert.lua` the whole state machine.

use super::Op;
use super::single::{CallerArgs, OneRequest, Setting, Single};
use crate::doc::{Doc, StockCommand, arg, optional};
use crate::params::{HoldTtl, InvalidParam, OrderNo, Qty, RequestId, Sku};
use bytes::Bytes;

pub const DOC: Doc = Doc {
    name: StockCommand::Hold.name(),
    arity: -5,
    max_args: Some(6),
    flags: &["write", "denyoom"],
    group: "stockgate",
    summary: "Holds qty units of a sku for ttl_ms (Redis time), once per request_id, until CONFIRM or REVERT. Replies [code, remain, order_no, version, expires_at_ms]: 0 held, 1 already held or confirmed, 2 insufficient stock, 3 invalid, 4 revoked, 5 expired.",
    args: &[
        arg("sku", "string"),
        arg("qty", "integer"),
        arg("request_id", "string"),
        arg("ttl_ms", "integer"),
        optional("order_no", "string"),
    ],
};

/// One validated hold.
/// How the stock service runs it: `lua/hold.lua` with the caller's qty,
/// order_no and ttl_ms, then `--max-hold`, the retry window, `--max-qty`
/// and the missing-stock mode; its reply shows the hold's expiry.
pub(super) const CALL: Single = Single {
    command: StockCommand::Hold,
    parse: |args, limits| Hold::parse(args, limits.max_qty, limits.max_hold_ms).map(Op::Hold),
    script: |scripts| &scripts.hold,
    caller_args: 3,
    settings: &[
        Setting::MaxHoldMs,
        Setting::RetryWindow,
        Setting::MaxQty,
        Setting::MissingStock,
    ],
    ends_line: false,
    shows_expiry: true,
    // <sku> <qty> <request_id> <ttl_ms> [order_no]
    request_id_at: 2,
    qty_at: Some(1),
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub sku: Sku,
    pub qty: Qty,
    pub request_id: RequestId,
    pub ttl: HoldTtl,
    pub order_no: OrderNo,
}

impl OneRequest for Hold {
    fn request(&self) -> (&Sku, &RequestId) {
        (&self.sku, &self.request_id)
    }

    fn caller_args(&self) -> CallerArgs<'_> {
        CallerArgs(
            [
                self.qty.as_bytes(),
                self.order_no.as_bytes(),
                self.ttl.as_bytes(),
            ],
            3,
        )
    }

    fn qty(&self) -> Option<&[u8]> {
        Some(self.qty.as_bytes())
    }
}

impl Hold {
    /// Checks the arguments after the command name. The caller has checked
    /// their count.
    pub fn parse(args: &[Bytes], max_qty: u64, max_hold_ms: u64) -> Result<Hold, InvalidParam> {
        Ok(Hold {
            sku: Sku::parse(args[0].clone())?,
            qty: Qty::parse(args[1].clone(), max_qty)?,
            request_id: RequestId::parse(args[2].clone())?,
            ttl: HoldTtl::parse(args[3].clone(), max_hold_ms)?,
            order_no: match args.get(4) {
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
        let h = Hold::parse(&args(&["s", "2", "r", "1000", "ORD"]), 10, 5000).unwrap();
        assert_eq!((h.qty.get(), h.ttl.get()), (2, 1000));
        assert_eq!(h.order_no.as_bytes(), b"ORD");
        for (bad, why) in [
            ("999", "ttl_ms must be an integer from 1000 to 5000"),
            ("5001", "ttl_ms must be an integer from 1000 to 5000"),
            ("01000", "ttl_ms must be an integer from 1000 to 5000"),
            ("1e3", "ttl_ms must be an integer from 1000 to 5000"),
        ] {
            let err = Hold::parse(&args(&["s", "2", "r", bad]), 10, 5000).unwrap_err();
            assert_eq!(err.0, why, "{bad}");
        }
        assert!(Hold::parse(&args(&["s", "11", "r", "1000"]), 10, 5000).is_err());
    }

    #[test]
    fn arity_is_five_or_six_words() {
        assert!(!DOC.arity_ok(4));
        assert!(DOC.arity_ok(5));
        assert!(DOC.arity_ok(6));
        assert!(!DOC.arity_ok(7));
    }
}

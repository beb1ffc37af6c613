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

use super::command::{Command, Footprint, Http, Serve, codes};
use super::single::{Arg, Field, Keys, Setting, Shape, Single};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};

const FIELDS: [Field; 5] = [
    Field::Sku,
    Field::Qty,
    Field::RequestId,
    Field::TtlMs,
    Field::OrderNo,
];
static ARGS: [ArgSpec; 5] = Field::specs(FIELDS);

/// HOLD's settings, which every script that changes a hold, or keeps stock
/// by location, takes too (their headers).
pub const HOLD_SETTINGS: &[Setting] = &[
    Setting::MaxHoldMs,
    Setting::RetryWindow,
    Setting::MaxQty,
    Setting::MissingStock,
];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "hold",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Holds qty units of a sku for ttl_ms (Redis time), once per request_id, until CONFIRM or REVERT. Replies [code, remain, order_no, version, expires_at_ms]: 0 held, 1 already held or confirmed, 2 insufficient stock, 3 invalid, 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::HOLDS,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/hold.lua` with the caller's qty, order_no and ttl_ms, then
    // `--max-hold`, the retry window, `--max-qty` and the missing-stock
    // mode; its reply shows the hold's expiry.
    serve: Serve::Single(Single {
        fields: &FIELDS,
        script: |scripts| &scripts.hold,
        keys: Keys::Request,
        argv: &[
            Arg::Caller(Field::Qty),
            Arg::Caller(Field::OrderNo),
            Arg::Caller(Field::TtlMs),
            Arg::Settings,
            Arg::Nonce,
        ],
        settings: HOLD_SETTINGS,
        fresh: Field::RequestId,
        reply: Shape::Expiry,
        ends_line: false,
        takes: false,
        places_hold: true,
        extends_hold: false,
        ends_hold: false,
    }),
    http: Http::fields("/v1/hold", false),
};

#[cfg(test)]
mod tests {
    use super::super::StockCommand;
    use super::super::single::{Limits, OneRequest};
    use bytes::Bytes;

    fn parse(list: &[&str], max_qty: u64, max_hold_ms: u64) -> Result<OneRequest, String> {
        let args: Vec<Bytes> = list
            .iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        let limits = Limits {
            max_qty,
            max_hold_ms,
        };
        let command = StockCommand::Hold;
        OneRequest::parse(command, command.single().unwrap(), &args, &limits).map_err(|e| e.0)
    }

    #[test]
    fn parse_checks_each_field() {
        let h = parse(&["s", "2", "r", "1000", "ORD"], 10, 5000).unwrap();
        assert_eq!((h.qty.unwrap().get(), h.ttl.unwrap().get()), (2, 1000));
        assert_eq!(h.order_no.as_bytes(), b"ORD");
        for bad in ["999", "5001", "01000", "1e3"] {
            let err = parse(&["s", "2", "r", bad], 10, 5000).unwrap_err();
            assert_eq!(err, "ttl_ms must be an integer from 1000 to 5000", "{bad}");
        }
        assert!(parse(&["s", "11", "r", "1000"], 10, 5000).is_err());
    }

    #[test]
    fn arity_is_five_or_six_words() {
        let doc = &super::COMMAND.doc;
        assert!(!doc.arity_ok(4));
        assert!(doc.arity_ok(5));
        assert!(doc.arity_ok(6));
        assert!(!doc.arity_ok(7));
    }
}

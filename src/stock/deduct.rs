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

use super::command::{Command, Footprint, Http, Serve, codes};
use super::single::{Arg, Field, Keys, Setting, Shape, Single};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};

const FIELDS: [Field; 4] = [Field::Sku, Field::Qty, Field::RequestId, Field::OrderNo];
static ARGS: [ArgSpec; 4] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "deduct",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Deducts qty units of a sku's stock once per request_id. Replies [code, remain, order_no, version]: 0 ok, 1 duplicate, 2 insufficient stock, 3 invalid parameters, 4 revoked.",
        args: &ARGS,
    },
    answers: codes::TAKES,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/deduct.lua` with the caller's qty and order_no, then the retry
    // window, `--max-qty` and the missing-stock mode; its reply shows no
    // expiry.
    serve: Serve::Single(Single {
        fields: &FIELDS,
        script: |scripts| &scripts.deduct,
        keys: Keys::Request,
        argv: &[
            Arg::Caller(Field::Qty),
            Arg::Caller(Field::OrderNo),
            Arg::Settings,
            Arg::Nonce,
        ],
        settings: &[Setting::RetryWindow, Setting::MaxQty, Setting::MissingStock],
        fresh: Field::RequestId,
        reply: Shape::Plain,
        ends_line: false,
        takes: true,
        places_hold: false,
        extends_hold: false,
        ends_hold: false,
    }),
    http: Http::fields("/v1/deduct", false),
};

#[cfg(test)]
mod tests {
    use super::super::StockCommand;
    use super::super::single::{Limits, OneRequest};
    use bytes::Bytes;

    fn parse(list: &[&str], max_qty: u64) -> Result<OneRequest, String> {
        let args: Vec<Bytes> = list
            .iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        let limits = Limits {
            max_qty,
            max_hold_ms: 60_000,
        };
        let command = StockCommand::Deduct;
        OneRequest::parse(command, command.single().unwrap(), &args, &limits).map_err(|e| e.0)
    }

    #[test]
    fn parse_checks_each_field() {
        let d = parse(&["sku1", "2", "req-1", "ORD-9"], 10).unwrap();
        assert_eq!(d.qty.unwrap().get(), 2);
        assert_eq!(d.order_no.as_bytes(), b"ORD-9");
        let d = parse(&["sku1", "2", "req-1"], 10).unwrap();
        assert_eq!(d.order_no.as_bytes(), b"");
        let err = parse(&["sku1", "11", "req-1"], 10).unwrap_err();
        assert_eq!(err, "qty must be an integer from 1 to 10");
        assert!(parse(&["s k", "1", "r"], 10).is_err());
        assert!(parse(&["s", "1", "r{x}"], 10).is_err());
    }

    #[test]
    fn arity_is_four_or_five_words() {
        let doc = &super::COMMAND.doc;
        assert!(!doc.arity_ok(3));
        assert!(doc.arity_ok(4));
        assert!(doc.arity_ok(5));
        assert!(!doc.arity_ok(6));
    }
}

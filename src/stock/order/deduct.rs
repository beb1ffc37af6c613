//! ORDER: deduct every line of an order for good, or none.
//!
//! # Format
//!
//! ```text
//! ORDER <request_id> <sku> <qty> [<sku> <qty> ...]
//! ```
//!
//! A line on a SKU kept by location names where it takes its units after
//! its sku, `<sku>{<POLICY>:<location>,...}` (docs/locations.md).
//!
//! Up to `--max-order-lines` lines, each SKU once. Replies `[code,
//! version, 0, lines, short]` (see [`super`]): 0 every line deducted now,
//! 1 this order was already applied, 2 insufficient (no line applied;
//! `short` names the SKUs), 3 invalid (also: this request_id with another
//! line set), 4 reverted or revoked, 5 an earlier attempt's line holds ran
//! out before it could finish (no line applied).

use crate::auth::Right;
use crate::doc::{Doc, arg};
use crate::stock::command::{Body, Command, Footprint, Http, Serve, Want, codes};

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order",
        arity: -4,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Deducts every line of an order (sku qty pairs), all or none, once per request_id. Replies [code, version, expires_at_ms, lines (sku, remain ...), short skus]: 0 applied, 1 already applied, 2 insufficient (no line applied), 3 invalid, 4 reverted or revoked, 5 expired.",
        args: &[
            arg("request_id", "string"),
            arg("sku", "string"),
            arg("qty", "integer"),
        ],
    },
    answers: codes::HOLDS,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Lines { pairs_from: 1 },
    serve: Serve::Order(Want::Order),
    // ORDER.HOLD too, when the body has a ttl_ms.
    http: Http::post("/v1/orders", Body::Order),
};

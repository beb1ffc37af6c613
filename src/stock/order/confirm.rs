//! ORDER.CONFIRM: make an order's hold final, every line.
//!
//! # Format
//!
//! ```text
//! ORDER.CONFIRM <request_id> [<sku> <qty> ...]
//! ```
//!
//! The lines are optional: the order's own, as its ORDER.HOLD named them
//! (in any order). Named, they let the request go alongside the requests
//! of its connection on other SKUs, and let a user limited to prefixes
//! send it; without them it names no SKU, so it waits for every request
//! before it on its connection and every later one waits for it. Lines
//! that are not the order's answer 3 and change nothing (the intent
//! script compares them before it moves the order).
//!
//! The intent record decides against Redis time: before the order's
//! expiry it commits (every line is then confirmed), at or after it the
//! order expired (every line goes back). Replies `[code, version,
//! expires_at_ms, lines, short]` (see [`super`]): 0 confirmed now, 1
//! already confirmed, 3 the request_id is an ORDER's, 4 reverted or
//! revoked (an order never held is revoked: a late ORDER.HOLD gets 4),
//! 5 the order's hold ran out first.

use crate::auth::Right;
use crate::doc::{Doc, arg, optional_many};
use crate::stock::command::{Body, Command, Footprint, Http, Serve, Want, codes};

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order.confirm",
        arity: -2,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Makes an order's hold final, every line, once. Replies [code, version, expires_at_ms, lines, short]: 0 confirmed, 1 already confirmed, 3 invalid, 4 reverted or revoked, 5 expired first.",
        args: &[
            arg("request_id", "string"),
            optional_many("sku", "string"),
            optional_many("qty", "integer"),
        ],
    },
    answers: codes::ENDS_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::LinesOrAll { pairs_from: 1 },
    serve: Serve::Order(Want::Confirm),
    http: Http::post("/v1/orders/{request_id}/confirm", Body::Path),
};

//! ORDER.CONFIRM: make an order's hold final, every line.
//!
//! # Format
//!
//! ```text
//! ORDER.CONFIRM <request_id>
//! ```
//!
//! The intent record decides against Redis time: before the order's
//! expiry it commits (every line is then confirmed), at or after it the
//! order expired (every line goes back). Replies `[code, version,
//! expires_at_ms, lines, short]` (see [`super`]): 0 confirmed now, 1
//! already confirmed, 3 the request_id is an ORDER's, 4 reverted or
//! revoked (an order never held is revoked: a late ORDER.HOLD gets 4),
//! 5 the order's hold ran out first.

use crate::auth::Right;
use crate::doc::{Doc, arg};
use crate::stock::command::{Body, Command, Footprint, Http, Serve, Want, codes};

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order.confirm",
        arity: 2,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Makes an order's hold final, every line, once. Replies [code, version, expires_at_ms, lines, short]: 0 confirmed, 1 already confirmed, 3 invalid, 4 reverted or revoked, 5 expired first.",
        args: &[arg("request_id", "string")],
    },
    answers: codes::ENDS_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::All,
    serve: Serve::Order(Want::Confirm),
    http: Http::post("/v1/orders/{request_id}/confirm", Body::Path),
};

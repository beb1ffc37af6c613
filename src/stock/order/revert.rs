//! ORDER.REVERT: cancel an order, or give all of it back.
//!
//! # Format
//!
//! ```text
//! ORDER.REVERT <request_id>
//! ```
//!
//! From any phase: an order in flight (through any stockgate) is undone,
//! its lines given back or revoked (a line HOLD that arrives late gets 4),
//! never deducted; an order never seen is revoked, so a late ORDER of it
//! gets 4. Replies `[code, version, expires_at_ms, lines, short]` (see
//! [`super`]): 0 given back now, 1 already reverted, revoked, aborted or
//! expired (nothing to give back), 3 invalid, 4 never seen: revoked.

use crate::auth::Right;
use crate::doc::{Doc, arg};
use crate::stock::command::{Body, Command, Footprint, Http, Serve, Want, codes};

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order.revert",
        arity: 2,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Cancels an order or gives every line back, once. Replies [code, version, expires_at_ms, lines, short]: 0 given back, 1 already (nothing to give back), 3 invalid, 4 never seen (revoked).",
        args: &[arg("request_id", "string")],
    },
    answers: codes::PLAIN,
    right: Right::Caller,
    gives_back: true,
    footprint: Footprint::All,
    serve: Serve::Order(Want::Revert),
    http: Http::post("/v1/orders/{request_id}/revert", Body::Path),
};

//! ORDER.HOLD: hold every line of an order until ORDER.CONFIRM, or none.
//!
//! # Format
//!
//! ```text
//! ORDER.HOLD <request_id> <ttl_ms> <sku> <qty> [<sku> <qty> ...]
//! ```
//!
//! A line on a SKU kept by location names where it takes its units after
//! its sku, `<sku>{<POLICY>:<location>,...}` (docs/locations.md).
//!
//! ttl_ms from 1000 to `--max-hold` less 2 s: the order's expiry is the
//! intent's (Redis time), and each line holds 2 s longer, so no line runs
//! out before the order does. Unconfirmed, the order expires as a whole:
//! every line comes back by itself. Replies `[code, version,
//! expires_at_ms, lines, short]` (see [`super`]): 0 held now, 1 already
//! held (or confirmed), 2 insufficient (nothing held), 3 invalid, 4
//! reverted or revoked, 5 the order's hold ran out.

use crate::auth::Right;
use crate::doc::{Doc, arg};
use crate::stock::command::{Command, Footprint, Serve, Want, codes};

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order.hold",
        arity: -5,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Holds every line of an order for ttl_ms (Redis time), all or none, once per request_id, until ORDER.CONFIRM or ORDER.REVERT. Replies [code, version, expires_at_ms, lines, short]: 0 held, 1 already held, 2 insufficient, 3 invalid, 4 revoked, 5 expired.",
        args: &[
            arg("request_id", "string"),
            arg("ttl_ms", "integer"),
            arg("sku", "string"),
            arg("qty", "integer"),
        ],
    },
    answers: codes::HOLDS,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Lines { pairs_from: 2 },
    serve: Serve::Order(Want::Hold),
    // Served at ORDER's route (a body with a ttl_ms).
    http: None,
};

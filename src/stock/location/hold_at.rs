//! HOLD.AT: hold qty units of a SKU kept by location, taken from the
//! locations a caller names, until CONFIRM, REVERT or the ttl (Redis time).
//!
//! # Format
//!
//! ```text
//! HOLD.AT <sku> <qty> <request_id> <ttl_ms> <SPLIT|WHOLE> <location> [<location> ...]
//! ```
//!
//! Allocates as DEDUCT.AT does ([`super::deduct_at`]); the units are held
//! at the locations that gave them, and CONFIRM, REVERT, HOLD.EXTEND,
//! HOLD.SHRINK and the hold's expiry all know where. Replies as
//! DEDUCT.AT, `expires_at_ms` the hold's expiry: 0 held, 1 already held
//! or confirmed, 2 insufficient, 3 invalid, 4 revoked, 5 this id's hold
//! ran out.

use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};
use crate::stock::command::{Command, Footprint, Serve, codes};

static ARGS: [ArgSpec; 6] = [
    arg("sku", "string"),
    arg("qty", "integer"),
    arg("request_id", "string"),
    arg("ttl_ms", "integer"),
    arg("policy", "string"),
    arg("location", "string"),
];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "hold.at",
        arity: -7,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Holds qty units of a sku kept by location, taken from the locations named in their order (SPLIT or WHOLE), for ttl_ms (Redis time), once per request_id. Replies [code, remain, order_no, version, reason, expires_at_ms, [location, units, ...]]: 0 held, 1 already held or confirmed, 2 insufficient, 3 invalid, 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::HOLDS,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, caller| service.serve_allocation(true, args, caller)),
};

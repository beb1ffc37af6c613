//! HOLD.EXTEND: a live hold lasts longer, while a slow payment (a 3-D
//! Secure challenge, a bank transfer) completes.
//!
//! # Format
//!
//! ```text
//! HOLD.EXTEND <sku> <request_id> <change_id> <ttl_ms>
//! ```
//!
//! The hold of `request_id` now lasts until `ttl_ms` from now, by Redis
//! time, filed again in the sweep index; never earlier than it lasts
//! already (code 3), and at most `--max-hold` from the hold's start (code
//! 3). Each extension names itself with a `change_id`: the same one again
//! answers 1 with the expiry it set. Replies like HOLD, `[code, remain,
//! order_no, version, expires_at_ms]`: 0 extended, 1 this change_id was
//! applied (or the hold is confirmed), 3 invalid, 4 reverted or revoked,
//! 5 the hold ran out. `lua/change_hold.lua` has the script;
//! [`super::hold_change`] the call.

use super::command::{Command, Footprint, Serve, codes};
use super::hold_change::HoldChange;
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};

static ARGS: [ArgSpec; 4] = [
    arg("sku", "string"),
    arg("request_id", "string"),
    arg("change_id", "string"),
    arg("ttl_ms", "integer"),
];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "hold.extend",
        arity: 5,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Moves a live hold's expiry to ttl_ms from now (Redis time), at most --max-hold from its start, once per change_id. Replies [code, remain, order_no, version, expires_at_ms]: 0 extended, 1 already applied (or confirmed), 3 invalid, 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::CHANGES_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, caller| HoldChange::Extend.serve(service, args, caller)),
};

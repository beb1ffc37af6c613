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
//! [`super::call`] the call.

use super::command::{Command, Footprint, Http, Serve, codes};
use super::hold::HOLD_SETTINGS;
use super::single::{Arg, Field, Keys, Shape, Single};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};

const FIELDS: [Field; 4] = [Field::Sku, Field::RequestId, Field::ChangeId, Field::TtlMs];
static ARGS: [ArgSpec; 4] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "hold.extend",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Moves a live hold's expiry to ttl_ms from now (Redis time), at most --max-hold from its start, once per change_id. Replies [code, remain, order_no, version, expires_at_ms]: 0 extended, 1 already applied (or confirmed), 3 invalid, 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::CHANGES_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/change_hold.lua` "extend" with the caller's ttl_ms, then HOLD's
    // settings; its seventh key is the change's record (an order's line
    // extends without one: its order's intent records the change).
    serve: Serve::Single(Single {
        fields: &FIELDS,
        script: |scripts| &scripts.change_hold,
        keys: Keys::LocatedChanged,
        argv: &[
            Arg::Word("extend"),
            Arg::Caller(Field::TtlMs),
            Arg::Settings,
            Arg::Nonce,
        ],
        settings: HOLD_SETTINGS,
        fresh: Field::ChangeId,
        reply: Shape::Expiry,
        ends_line: false,
        takes: false,
        places_hold: false,
        extends_hold: true,
        ends_hold: false,
    }),
    // Strict: a shrink's `qty` sent here is refused, not left unread.
    http: Http::fields("/v1/hold/extend", true),
};

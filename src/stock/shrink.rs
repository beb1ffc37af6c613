//! HOLD.SHRINK: a live hold gives some of its units back, when the
//! customer takes units out of the cart while paying.
//!
//! # Format
//!
//! ```text
//! HOLD.SHRINK <sku> <request_id> <change_id> <qty>
//! ```
//!
//! `qty` of the hold's units go back to stock at once (journaled as a
//! REVERT of a hold is); the rest stays held with its expiry, and a
//! CONFIRM takes what is left. `qty` runs from 1 to the units held less
//! one: giving every unit back is a REVERT (code 3 says so). Each shrink
//! names itself with a `change_id`: the same one again answers 1 and gives
//! nothing back. Replies like HOLD, `[code, remain, order_no, version,
//! expires_at_ms]`: 0 given back (remain is the stock after it), 1 this
//! change_id was applied, 3 invalid (also: the hold is confirmed),
//! 4 reverted or revoked, 5 the hold ran out. `lua/change_hold.lua` has
//! the script; [`super::call`] the call.

use super::command::{Command, Footprint, Http, Serve, codes};
use super::hold::HOLD_SETTINGS;
use super::single::{Arg, Field, Keys, Shape, Single};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};

const FIELDS: [Field; 4] = [Field::Sku, Field::RequestId, Field::ChangeId, Field::Qty];
static ARGS: [ArgSpec; 4] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "hold.shrink",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Gives qty of a live hold's units back to stock at once, once per change_id; the rest stays held. Replies [code, remain, order_no, version, expires_at_ms]: 0 given back, 1 already applied, 3 invalid (qty not below the units held, or confirmed), 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::CHANGES_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/change_hold.lua` "shrink" with the caller's qty, then HOLD's
    // settings; its seventh key is the change's record.
    serve: Serve::Single(Single {
        fields: &FIELDS,
        script: |scripts| &scripts.change_hold,
        keys: Keys::LocatedChanged,
        argv: &[
            Arg::Word("shrink"),
            Arg::Caller(Field::Qty),
            Arg::Settings,
            Arg::Nonce,
        ],
        settings: HOLD_SETTINGS,
        fresh: Field::ChangeId,
        reply: Shape::Expiry,
        ends_line: false,
        takes: false,
        places_hold: false,
        extends_hold: false,
        ends_hold: false,
    }),
    // Strict: an extension's `ttl_ms` sent here is refused, not left unread.
    http: Http::fields("/v1/hold/shrink", true),
};

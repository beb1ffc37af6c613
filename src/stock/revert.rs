//! REVERT: give back what one request deducted, or cancel its hold.
//!
//! # Format
//!
//! ```text
//! REVERT <sku> <request_id>
//! ```
//!
//! Replies like DEDUCT, `[code, remain, order_no, version]`: 0 given back
//! (a deduction, a hold, a confirmed hold), 1 already reverted or revoked,
//! or a hold that expired, 3 invalid, 4 nothing had been deducted or held
//! (the id is now revoked, and a later DEDUCT or HOLD of it is refused).
//! The qty given back is the one the record holds, never the caller's.
//! See `lua/revert.lua` for the whole state machine.

use super::command::{Command, Footprint, Http, Serve, codes};
use super::single::{Arg, Field, Keys, Setting, Shape, Single};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};

const FIELDS: [Field; 2] = [Field::Sku, Field::RequestId];
static ARGS: [ArgSpec; 2] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "revert",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Gives back what one request_id deducted or holds, once. Replies like DEDUCT: 0 given back, 1 already reverted (or the hold expired), 3 invalid, 4 nothing was deducted or held (the id is revoked).",
        args: &ARGS,
    },
    answers: codes::PLAIN,
    right: Right::Caller,
    gives_back: true,
    footprint: Footprint::Piped,
    // `lua/revert.lua` with none of the caller's arguments (the record
    // holds the qty), then the retry window and the missing-stock mode.
    serve: Serve::Single(Single {
        fields: &FIELDS,
        script: |scripts| &scripts.revert,
        keys: Keys::Located,
        argv: &[Arg::Settings, Arg::Nonce],
        settings: &[Setting::RetryWindow, Setting::MissingStock],
        fresh: Field::RequestId,
        reply: Shape::Plain,
        ends_line: true,
        takes: false,
        places_hold: false,
        extends_hold: false,
        ends_hold: false,
    }),
    http: Http::fields("/v1/revert", false),
};

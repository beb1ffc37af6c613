//! CONFIRM: make a hold final (the customer paid).
//!
//! # Format
//!
//! ```text
//! CONFIRM <sku> <request_id>
//! ```
//!
//! Replies like HOLD, `[code, remain, order_no, version, expires_at_ms]`:
//! 0 confirmed (the units are deducted for good), 1 already confirmed,
//! 3 the id is a DEDUCT's, 4 the hold was cancelled or revoked (or there
//! never was one: the id is then revoked, so a late HOLD holds nothing),
//! 5 the hold ran out first and its units went back to stock. Against the
//! hold's expiry, Redis decides: whichever runs first wins
//! (`lua/confirm.lua`).

use super::command::{Command, Footprint, Http, Serve, codes};
use super::single::{Arg, Field, Keys, Setting, Shape, Single};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};

const FIELDS: [Field; 2] = [Field::Sku, Field::RequestId];
static ARGS: [ArgSpec; 2] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "confirm",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Makes a hold final, once. Replies [code, remain, order_no, version, expires_at_ms]: 0 confirmed, 1 already confirmed, 3 invalid, 4 cancelled or revoked, 5 expired first.",
        args: &ARGS,
    },
    answers: codes::ENDS_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/confirm.lua` with none of the caller's arguments (the record
    // holds the qty), then the retry window and the missing-stock mode;
    // its reply shows the hold's expiry.
    serve: Serve::Single(Single {
        fields: &FIELDS,
        script: |scripts| &scripts.confirm,
        keys: Keys::Located,
        argv: &[Arg::Settings, Arg::Nonce],
        settings: &[Setting::RetryWindow, Setting::MissingStock],
        fresh: Field::RequestId,
        reply: Shape::Expiry,
        ends_line: true,
        takes: false,
        places_hold: false,
        extends_hold: false,
        ends_hold: true,
    }),
    http: Http::fields("/v1/confirm", false),
};

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
use crate::doc::{ArgSpec, Doc};
use crate::stock::command::{Command, Footprint, Http, Serve, codes};
use crate::stock::hold::HOLD_SETTINGS;
use crate::stock::single::{Arg, Field, Keys, Shape, Single};

const FIELDS: [Field; 6] = [
    Field::Sku,
    Field::Qty,
    Field::RequestId,
    Field::TtlMs,
    Field::Policy,
    Field::Locations,
];
static ARGS: [ArgSpec; 6] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "hold.at",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Holds qty units of a sku kept by location, taken from the locations named in their order (SPLIT or WHOLE), for ttl_ms (Redis time), once per request_id. Replies [code, remain, order_no, version, reason, expires_at_ms, [location, units, ...]]: 0 held, 1 already held or confirmed, 2 insufficient, 3 invalid, 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::HOLDS,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/allocate.lua` "hold" with HOLD's settings, then the caller's
    // qty, policy, ttl_ms and locations; the SKU's locations hash is its
    // seventh key.
    serve: Serve::Single(HOLD_AT),
    http: Http::fields("/v1/hold/at", false),
};

/// HOLD.AT's call, which an ORDER.HOLD's line on a SKU kept by location
/// makes too.
pub const HOLD_AT: Single = Single {
    fields: &FIELDS,
    script: |scripts| &scripts.allocate,
    keys: Keys::Located,
    argv: &[
        Arg::Word("hold"),
        Arg::Settings,
        Arg::Nonce,
        Arg::Caller(Field::Qty),
        Arg::Caller(Field::Policy),
        Arg::Caller(Field::TtlMs),
        Arg::Caller(Field::Locations),
    ],
    settings: HOLD_SETTINGS,
    fresh: Field::RequestId,
    reply: Shape::Allocation,
    ends_line: false,
    takes: false,
    places_hold: true,
    extends_hold: false,
    ends_hold: false,
};

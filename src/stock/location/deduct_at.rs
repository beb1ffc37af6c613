//! DEDUCT.AT: take qty units of a SKU kept by location from the locations
//! a caller names, in its order, once per request_id.
//!
//! # Format
//!
//! ```text
//! DEDUCT.AT <sku> <qty> <request_id> <SPLIT|WHOLE> <location> [<location> ...]
//! ```
//!
//! `SPLIT` takes from each location as much as it has above its floor
//! until qty is met; `WHOLE` takes all of qty from the first location that
//! can give it. Replies `[code, remain, order_no, version, reason,
//! expires_at_ms, [location, units, ...]]`: 0 taken (the allocation says
//! from where), 1 this request_id already took (the allocation it made),
//! 2 the locations named can't give qty under the policy (nothing taken),
//! 3 invalid, 4 revoked. `remain` is the SKU's total available.
//! docs/locations.md has the model; `lua/allocate.lua` the script.

use crate::auth::Right;
use crate::doc::{ArgSpec, Doc};
use crate::stock::command::{Command, Footprint, Http, Serve, codes};
use crate::stock::hold::HOLD_SETTINGS;
use crate::stock::single::{Arg, Field, Keys, Shape, Single};

const FIELDS: [Field; 5] = [
    Field::Sku,
    Field::Qty,
    Field::RequestId,
    Field::Policy,
    Field::Locations,
];
static ARGS: [ArgSpec; 5] = Field::specs(FIELDS);

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "deduct.at",
        arity: Field::arity(&FIELDS),
        max_args: Field::max_args(&FIELDS),
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Deducts qty units of a sku kept by location from the locations named, in their order (SPLIT across them, or WHOLE from one), once per request_id. Replies [code, remain, order_no, version, reason, expires_at_ms, [location, units, ...]]: 0 ok, 1 duplicate, 2 insufficient, 3 invalid, 4 revoked.",
        args: &ARGS,
    },
    answers: codes::TAKES,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Piped,
    // `lua/allocate.lua` "deduct" with HOLD's settings, then the caller's
    // qty, policy and locations; the SKU's locations hash is its seventh
    // key.
    serve: Serve::Single(DEDUCT_AT),
    http: Http::fields("/v1/deduct/at", false),
};

/// DEDUCT.AT's call, which an ORDER's line on a SKU kept by location
/// makes too.
pub const DEDUCT_AT: Single = Single {
    fields: &FIELDS,
    script: |scripts| &scripts.allocate,
    keys: Keys::Located,
    argv: &[
        Arg::Word("deduct"),
        Arg::Settings,
        Arg::Nonce,
        Arg::Caller(Field::Qty),
        Arg::Caller(Field::Policy),
        Arg::Caller(Field::Locations),
    ],
    settings: HOLD_SETTINGS,
    fresh: Field::RequestId,
    reply: Shape::Allocation,
    ends_line: false,
    takes: false,
    places_hold: false,
    extends_hold: false,
    ends_hold: false,
};

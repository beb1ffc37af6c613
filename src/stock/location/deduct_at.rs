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
use crate::doc::{ArgSpec, Doc, arg};
use crate::stock::command::{Command, Footprint, Serve, codes};

static ARGS: [ArgSpec; 5] = [
    arg("sku", "string"),
    arg("qty", "integer"),
    arg("request_id", "string"),
    arg("policy", "string"),
    arg("location", "string"),
];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "deduct.at",
        arity: -6,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Deducts qty units of a sku kept by location from the locations named, in their order (SPLIT across them, or WHOLE from one), once per request_id. Replies [code, remain, order_no, version, reason, expires_at_ms, [location, units, ...]]: 0 ok, 1 duplicate, 2 insufficient, 3 invalid, 4 revoked.",
        args: &ARGS,
    },
    answers: codes::TAKES,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, caller| service.serve_allocation(false, args, caller)),
};

//! ORDER.STATUS: where one order is, for support and reconciliation.
//!
//! # Format
//!
//! ```text
//! ORDER.STATUS <request_id>
//! ```
//!
//! Replies a map read from the intent record (`lua/order.lua`), changing
//! nothing: `phase` (none, HOLDING, HELD, CONFIRMING, DONE, ABORTING,
//! ABORTED, REVERTING, REVERTED, REVOKED), `kind` (`order`, `hold`, or
//! empty), `lines` (flat `sku, qty, ...`, by sku), `expires_at` (the order
//! hold's expiry, ms of Redis time; 0 for an ORDER), `expired` (1 when a
//! HELD order's expiry has passed), `code` (why an order aborted: 2, 3, 4
//! or 5; else 0) and `short` (the SKUs at fault). Each line's own record
//! is `STOCK.STATUS <sku> ~ord:<request_id>`. Over HTTP:
//! `GET /v1/orders/{request_id}`.

use crate::command::doc::{Doc, arg};

pub const DOC: Doc = Doc {
    name: "order.status",
    arity: 2,
    max_args: None,
    flags: &["fast"],
    group: "stockgate",
    summary: "Returns one order's phase (none, HOLDING, HELD, CONFIRMING, DONE, ABORTING, ABORTED, REVERTING, REVERTED, REVOKED), kind, lines, hold expiry, abort code and short skus, from its intent record.",
    args: &[arg("request_id", "string")],
};

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

use super::Op;
use super::single::{CallerArgs, OneRequest, Setting, Single};
use crate::doc::{Doc, StockCommand, arg};
use crate::params::{InvalidParam, RequestId, Sku};
use bytes::Bytes;

pub const DOC: Doc = Doc {
    name: StockCommand::Revert.name(),
    arity: 3,
    max_args: None,
    flags: &["write", "denyoom"],
    group: "stockgate",
    summary: "Gives back what one request_id deducted or holds, once. Replies like DEDUCT: 0 given back, 1 already reverted (or the hold expired), 3 invalid, 4 nothing was deducted or held (the id is revoked).",
    args: &[arg("sku", "string"), arg("request_id", "string")],
};

/// How the stock service runs it: `lua/revert.lua` with none of the caller's
/// arguments (the record holds the qty), then the retry window and the
/// missing-stock mode; its reply shows no expiry.
pub(super) const CALL: Single = Single {
    command: StockCommand::Revert,
    parse: |args, _| Revert::parse(args).map(Op::Revert),
    script: |scripts| &scripts.revert,
    caller_args: 0,
    settings: &[Setting::RetryWindow, Setting::MissingStock],
    ends_line: true,
    shows_expiry: false,
    // <sku> <request_id>
    request_id_at: 1,
    qty_at: None,
};

/// One validated revert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revert {
    pub sku: Sku,
    pub request_id: RequestId,
}

impl OneRequest for Revert {
    fn request(&self) -> (&Sku, &RequestId) {
        (&self.sku, &self.request_id)
    }

    fn caller_args(&self) -> CallerArgs<'_> {
        CallerArgs::NONE
    }
}

impl Revert {
    /// Checks the arguments after the command name: sku and request_id.
    pub fn parse(args: &[Bytes]) -> Result<Revert, InvalidParam> {
        Ok(Revert {
            sku: Sku::parse(args[0].clone())?,
            request_id: RequestId::parse(args[1].clone())?,
        })
    }
}

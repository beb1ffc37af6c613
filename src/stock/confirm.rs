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

use super::Op;
use super::single::{CallerArgs, OneRequest, Setting, Single};
use crate::doc::{Doc, StockCommand, arg};
use crate::params::{InvalidParam, RequestId, Sku};
use bytes::Bytes;

pub const DOC: Doc = Doc {
    name: StockCommand::Confirm.name(),
    arity: 3,
    max_args: None,
    flags: &["write", "denyoom"],
    group: "stockgate",
    summary: "Makes a hold final, once. Replies [code, remain, order_no, version, expires_at_ms]: 0 confirmed, 1 already confirmed, 3 invalid, 4 cancelled or revoked, 5 expired first.",
    args: &[arg("sku", "string"), arg("request_id", "string")],
};

/// How the stock service runs it: `lua/confirm.lua` with none of the caller's
/// arguments (the record holds the qty), then the retry window and the
/// missing-stock mode; its reply shows the hold's expiry.
pub(super) const CALL: Single = Single {
    command: StockCommand::Confirm,
    parse: |args, _| Confirm::parse(args).map(Op::Confirm),
    script: |scripts| &scripts.confirm,
    caller_args: 0,
    settings: &[Setting::RetryWindow, Setting::MissingStock],
    ends_line: true,
    shows_expiry: true,
    // <sku> <request_id>
    request_id_at: 1,
    qty_at: None,
};

/// One validated confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirm {
    pub sku: Sku,
    pub request_id: RequestId,
}

impl OneRequest for Confirm {
    fn request(&self) -> (&Sku, &RequestId) {
        (&self.sku, &self.request_id)
    }

    fn caller_args(&self) -> CallerArgs<'_> {
        CallerArgs::NONE
    }
}

impl Confirm {
    /// Checks the arguments after the command name: sku and request_id.
    pub fn parse(args: &[Bytes]) -> Result<Confirm, InvalidParam> {
        Ok(Confirm {
            sku: Sku::parse(args[0].clone())?,
            request_id: RequestId::parse(args[1].clone())?,
        })
    }
}

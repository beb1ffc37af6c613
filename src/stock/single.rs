//! What a command on one request (DEDUCT, REVERT, HOLD, CONFIRM) is, as
//! its own file describes it: a [`Single`] of plain data, and the
//! [`OneRequest`] its checked form answers to. The stock service reads
//! nothing else about it: it validates with `parse`, builds the keys,
//! encodes the script call from `script` and `settings`, and shows the
//! reply and writes the access log as the description says.

use super::{Op, StockCommand};
use crate::params::{InvalidParam, RequestId, Sku};
use crate::script::{LuaScript, Scripts};
use bytes::Bytes;
use std::sync::Arc;

/// One command on one request, described.
pub(super) struct Single {
    pub(super) command: StockCommand,
    /// Checks the arguments after the name (their count checked).
    pub(super) parse: fn(&[Bytes], &Limits) -> Result<Op, InvalidParam>,
    /// Its script.
    pub(super) script: fn(&Scripts) -> &Arc<LuaScript>,
    /// How many of the caller's arguments its script takes first.
    pub(super) caller_args: usize,
    /// What stockgate supplies after them, in ARGV order (the header of
    /// each `lua/` script says the same).
    pub(super) settings: &'static [Setting],
    /// As one of an order's line calls it ends the line (CONFIRM, REVERT):
    /// it then takes a missing stock key as zero stock, whatever
    /// `--missing-stock` says, so that an order that named a SKU with none
    /// still ends (its line there holds nothing to give back).
    pub(super) ends_line: bool,
    /// Its reply shows the hold's expiry fifth (HOLD and CONFIRM).
    pub(super) shows_expiry: bool,
    /// Where the access log finds request_id and qty among the arguments
    /// as sent (they may be invalid); the sku is always first.
    pub(super) request_id_at: usize,
    pub(super) qty_at: Option<usize>,
}

/// A setting a script takes after the caller's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Setting {
    /// `--retry-window`, in ms: how long a finished record is kept.
    RetryWindow,
    /// `--max-qty`.
    MaxQty,
    /// `--max-hold`, in ms.
    MaxHoldMs,
    /// `--missing-stock`; always `zero` for an order's lines.
    MissingStock,
}

/// The limits `parse` checks against.
pub(super) struct Limits {
    pub(super) max_qty: u64,
    pub(super) max_hold_ms: u64,
}

/// A command on one request, checked.
pub(super) trait OneRequest {
    /// Its sku and request_id.
    fn request(&self) -> (&Sku, &RequestId);
    /// The caller's script arguments, in ARGV order.
    fn caller_args(&self) -> CallerArgs<'_>;
    /// The qty the access log shows, if it has one.
    fn qty(&self) -> Option<&[u8]> {
        None
    }
}

/// Up to three of the caller's script arguments, without an allocation.
pub(super) struct CallerArgs<'a>(pub(super) [&'a [u8]; 3], pub(super) usize);

impl<'a> CallerArgs<'a> {
    pub(super) const NONE: CallerArgs<'static> = CallerArgs([b""; 3], 0);

    pub(super) fn as_slice(&self) -> &[&'a [u8]] {
        &self.0[..self.1]
    }
}

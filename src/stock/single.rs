//! A call of one script on one request (DEDUCT, REVERT, HOLD, CONFIRM), as
//! its own file describes it: a [`Single`] of plain data, and the request
//! it checks ([`OneRequest`]). The service reads nothing else about it: it
//! checks the fields, builds the keys, encodes the script call from
//! `script`, `script_args` and `settings`, and shows the reply and writes
//! the access log as the description says.

use super::StockCommand;
use crate::doc::{ArgSpec, arg, optional};
use crate::params::{HoldTtl, InvalidParam, OrderNo, Qty, RequestId, Sku};
use crate::script::{LuaScript, Scripts};
use bytes::Bytes;
use std::sync::Arc;

/// One command on one request, described.
pub struct Single {
    /// Its arguments after the name, in order; the last may be optional
    /// ([`Field::OrderNo`]).
    pub fields: &'static [Field],
    /// Its script.
    pub script: fn(&Scripts) -> &Arc<LuaScript>,
    /// The caller's fields its script takes first, in ARGV order.
    pub script_args: &'static [Field],
    /// What stockgate supplies after them, in ARGV order (the header of
    /// each `lua/` script says the same).
    pub settings: &'static [Setting],
    /// As one of an order's line calls it ends the line (CONFIRM, REVERT):
    /// it then takes a missing stock key as zero stock, whatever
    /// `--missing-stock` says, so that an order that named a SKU with none
    /// still ends (its line there holds nothing to give back).
    pub ends_line: bool,
    /// Its reply shows the hold's expiry fifth (HOLD and CONFIRM).
    pub shows_expiry: bool,
    /// It takes stock for good (DEDUCT): a hot SKU's calls share one
    /// script call ([`super::coalesce`]), and a SKU seen short answers
    /// from one read ([`super::sold_out`]).
    pub takes: bool,
    /// It places a hold (HOLD): its SKU is filed in the sweep index
    /// ([`super::sweeper`]).
    pub places_hold: bool,
    /// It makes a hold final (CONFIRM): how long the hold was held is
    /// recorded.
    pub ends_hold: bool,
}

/// An argument of a call on one request, and the rule it is checked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Sku,
    /// Up to `--max-qty`.
    Qty,
    RequestId,
    /// A hold's ttl, up to `--max-hold`.
    TtlMs,
    /// Optional: `""` when not given.
    OrderNo,
}

impl Field {
    /// The argument as `COMMAND DOCS` describes it.
    pub const fn spec(self) -> ArgSpec {
        match self {
            Field::Sku => arg("sku", "string"),
            Field::Qty => arg("qty", "integer"),
            Field::RequestId => arg("request_id", "string"),
            Field::TtlMs => arg("ttl_ms", "integer"),
            Field::OrderNo => optional("order_no", "string"),
        }
    }

    /// The arguments of `fields`, as `COMMAND DOCS` describes them.
    pub const fn specs<const N: usize>(fields: [Field; N]) -> [ArgSpec; N] {
        let mut specs = [arg("", ""); N];
        let mut i = 0;
        while i < N {
            specs[i] = fields[i].spec();
            i += 1;
        }
        specs
    }

    /// The Redis arity of a command taking `fields` (the name included).
    pub const fn arity(fields: &[Field]) -> i64 {
        let words = fields.len() as i64 + 1;
        match Field::max_args(fields) {
            Some(_) => 1 - words,
            None => words,
        }
    }

    /// The most words a command taking `fields` has, when its arity can't
    /// say it (an optional last field).
    pub const fn max_args(fields: &[Field]) -> Option<usize> {
        match fields.last() {
            Some(last) if last.spec().optional => Some(fields.len() + 1),
            _ => None,
        }
    }
}

/// A setting a script takes after the caller's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `--retry-window`, in ms: how long a finished record is kept.
    RetryWindow,
    /// `--max-qty`.
    MaxQty,
    /// `--max-hold`, in ms.
    MaxHoldMs,
    /// `--missing-stock`; always `zero` for an order's lines.
    MissingStock,
}

/// The limits the fields are checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_qty: u64,
    pub max_hold_ms: u64,
}

/// A call on one request, checked.
#[derive(Debug, Clone)]
pub struct OneRequest {
    pub command: StockCommand,
    pub single: &'static Single,
    pub sku: Sku,
    pub request_id: RequestId,
    pub qty: Option<Qty>,
    pub ttl: Option<HoldTtl>,
    pub order_no: OrderNo,
}

impl std::fmt::Debug for Single {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Single")
            .field("fields", &self.fields)
            .finish_non_exhaustive()
    }
}

impl OneRequest {
    /// Checks the arguments after `command`'s name (their count checked)
    /// field by field, in order: the first that breaks its rule is the
    /// reason given.
    pub fn parse(
        command: StockCommand,
        single: &'static Single,
        args: &[Bytes],
        limits: &Limits,
    ) -> Result<OneRequest, InvalidParam> {
        let (mut sku, mut request_id, mut qty, mut ttl) = (None, None, None, None);
        let mut order_no = OrderNo::default();
        for (field, arg) in single.fields.iter().zip(args) {
            match field {
                Field::Sku => sku = Some(Sku::parse(arg.clone())?),
                Field::Qty => qty = Some(Qty::parse(arg.clone(), limits.max_qty)?),
                Field::RequestId => request_id = Some(RequestId::parse(arg.clone())?),
                Field::TtlMs => ttl = Some(HoldTtl::parse(arg.clone(), limits.max_hold_ms)?),
                Field::OrderNo => order_no = OrderNo::parse(arg.clone())?,
            }
        }
        match (sku, request_id) {
            (Some(sku), Some(request_id)) => Ok(OneRequest {
                command,
                single,
                sku,
                request_id,
                qty,
                ttl,
                order_no,
            }),
            _ => unreachable!(
                "{command:?}'s fields name its sku and request_id, and its arity was checked"
            ),
        }
    }

    /// The caller's script arguments, in ARGV order.
    pub fn script_args(&self) -> CallerArgs<'_> {
        let mut args = CallerArgs::NONE;
        for (i, field) in self.single.script_args.iter().enumerate() {
            args.0[i] = self.field(*field).unwrap_or_default();
            args.1 += 1;
        }
        args
    }

    /// One field as it was sent (checked), if this call has it.
    pub fn field(&self, field: Field) -> Option<&[u8]> {
        match field {
            Field::Sku => Some(self.sku.as_bytes()),
            Field::RequestId => Some(self.request_id.as_bytes()),
            Field::Qty => self.qty.as_ref().map(Qty::as_bytes),
            Field::TtlMs => self.ttl.as_ref().map(HoldTtl::as_bytes),
            Field::OrderNo => Some(self.order_no.as_bytes()),
        }
    }
}

/// Up to three of the caller's script arguments, without an allocation.
pub struct CallerArgs<'a>(pub [&'a [u8]; 3], pub usize);

impl<'a> CallerArgs<'a> {
    pub const NONE: CallerArgs<'static> = CallerArgs([b""; 3], 0);

    pub fn as_slice(&self) -> &[&'a [u8]] {
        &self.0[..self.1]
    }
}

/// Where the access log finds a field among the arguments as sent (they
/// may be invalid).
pub fn position(single: &Single, field: Field) -> Option<usize> {
    single.fields.iter().position(|f| *f == field)
}

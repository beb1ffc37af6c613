//! A call of one script on one request, as its own file describes it: a
//! [`Single`] of plain data, and the request it checks ([`OneRequest`]).
//! Every stock command that is a call on one request is one: DEDUCT,
//! REVERT, HOLD, CONFIRM, HOLD.EXTEND, HOLD.SHRINK, DEDUCT.AT and HOLD.AT.
//! The service reads nothing else about it: it checks the fields, names
//! the keys, encodes the script call from `argv` and `settings`, reads the
//! reply as `reply` says and writes the access log from the fields.

use super::StockCommand;
use crate::doc::{ArgSpec, arg, optional};
use crate::params::{
    ChangeId, HoldTtl, InvalidParam, Location, OrderNo, Placement, Policy, Qty, RequestId, Sku,
};
use crate::script::{LuaScript, Scripts};
use bytes::Bytes;
use std::sync::Arc;

/// One command on one request, described.
pub struct Single {
    /// Its arguments after the name, in order; the last may be optional
    /// ([`Field::OrderNo`]) or many ([`Field::Locations`]).
    pub fields: &'static [Field],
    /// Its script.
    pub script: fn(&Scripts) -> &Arc<LuaScript>,
    /// The keys it names after the request's six.
    pub keys: Keys,
    /// Its ARGV, in order (each `lua/` script's header says the same).
    pub argv: &'static [Arg],
    /// What stockgate supplies in the settings argument ([`Arg::Settings`]).
    pub settings: &'static [Setting],
    /// The id a `--reject-stale-ids` check reads: the request's, or a
    /// change's own.
    pub fresh: Field,
    /// How its reply is read and shown.
    pub reply: Shape,
    /// As one of an order's line calls it ends the line (CONFIRM, REVERT):
    /// it then takes a missing stock key as zero stock, whatever
    /// `--missing-stock` says, so that an order that named a SKU with none
    /// still ends (its line there holds nothing to give back).
    pub ends_line: bool,
    /// It takes stock for good from one number (DEDUCT): a hot SKU's calls
    /// share one script call ([`super::coalesce`]), and a SKU seen short
    /// answers from one read ([`super::sold_out`]).
    pub takes: bool,
    /// It places a hold (HOLD, HOLD.AT): its SKU is filed in the sweep
    /// index ([`super::sweeper`]).
    pub places_hold: bool,
    /// It moves a hold's expiry later (HOLD.EXTEND): its SKU is filed
    /// again by the new expiry.
    pub extends_hold: bool,
    /// It makes a hold final (CONFIRM): how long the hold was held is
    /// recorded.
    pub ends_hold: bool,
}

/// The keys a call names after the request's six (stock, record, holds,
/// held, journal marker, journal: [`crate::keys::RequestKeys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// None: a call that takes or holds from one number (DEDUCT, HOLD),
    /// whose script answers `LOCATED` for a SKU kept by location, which
    /// stockgate answers 3 ([`super::location::NAME_LOCATIONS`]).
    Request,
    /// The SKU's locations hash: a call whose script serves a SKU kept
    /// either way (REVERT, CONFIRM: the request state machine of
    /// `lua/common.lua`), or by location only (`lua/allocate.lua`).
    Located,
    /// The change's own record, when the request names a change (an
    /// order's line names none: its order's intent records the change).
    Changed,
    /// The locations hash, then the change's record when there is one
    /// (HOLD.EXTEND, HOLD.SHRINK).
    LocatedChanged,
}

/// One argument of a script call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// A word of its own: the operation, for a script of several.
    Word(&'static str),
    /// A field of the caller's, as sent ([`Field::Locations`]: each
    /// location, one argument each).
    Caller(Field),
    /// The settings, one argument ([`Setting`], then the replicate and
    /// journal flags: `lua/common.lua`, `settle`).
    Settings,
    /// The call's nonce.
    Nonce,
}

/// How a call's reply is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `[code, remain, order_no, version]` and a reason for code 3 (DEDUCT,
    /// REVERT).
    Plain,
    /// The hold's expiry fifth, before the reason (HOLD, CONFIRM, and the
    /// changes of a hold).
    Expiry,
    /// `[code, remain, order_no, version, reason, expires_at_ms,
    /// [location, units, ...]]`, seven elements always: what each location
    /// gave (DEDUCT.AT, HOLD.AT).
    Allocation,
}

/// An argument of a call on one request, and the rule it is checked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Sku,
    /// Up to `--max-qty`.
    Qty,
    /// Never an order line's (`~ord:...`): only an order's saga may call on
    /// its lines, or the order would no longer be all or nothing.
    RequestId,
    /// A hold's ttl, up to `--max-hold`.
    TtlMs,
    /// Optional: `""` when not given.
    OrderNo,
    /// A change of a hold's own id.
    ChangeId,
    /// `SPLIT` or `WHOLE`.
    Policy,
    /// The rest: 1 to [`Location::PER_CALL`] locations, none twice.
    Locations,
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
            Field::ChangeId => arg("change_id", "string"),
            Field::Policy => arg("policy", "string"),
            Field::Locations => arg("location", "string"),
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

    /// The Redis arity of a command taking `fields` (the name included):
    /// negative, the least, when the last is optional or many.
    pub const fn arity(fields: &[Field]) -> i64 {
        let words = fields.len() as i64 + 1;
        match fields.last() {
            Some(Field::OrderNo) => 1 - words,
            Some(Field::Locations) => -words,
            _ => words,
        }
    }

    /// The most words a command taking `fields` has, when its arity can't
    /// say it (an optional last field); `None` when it says it, or when
    /// there is no most but the one a request's size sets.
    pub const fn max_args(fields: &[Field]) -> Option<usize> {
        match fields.last() {
            Some(Field::OrderNo) => Some(fields.len() + 1),
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
    /// A change of a hold's id (HOLD.EXTEND, HOLD.SHRINK).
    pub change_id: Option<ChangeId>,
    /// Where an allocation takes its units (DEDUCT.AT, HOLD.AT, an order's
    /// line on a SKU kept by location).
    pub placement: Option<Arc<Placement>>,
}

impl std::fmt::Debug for Single {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Single")
            .field("fields", &self.fields)
            .finish_non_exhaustive()
    }
}

impl OneRequest {
    /// A call of `command` with nothing but its sku and request_id: the
    /// other fields are the caller's to set (an order's line calls).
    pub fn on(command: StockCommand, sku: Sku, request_id: RequestId) -> OneRequest {
        OneRequest {
            command,
            single: command
                .single()
                .unwrap_or_else(|| unreachable!("{command:?} is a call on one request")),
            sku,
            request_id,
            qty: None,
            ttl: None,
            order_no: OrderNo::default(),
            change_id: None,
            placement: None,
        }
    }

    /// Checks a caller's arguments after `command`'s name (their count
    /// checked) field by field, in order: the first that breaks its rule
    /// is the reason given.
    pub fn parse(
        command: StockCommand,
        single: &'static Single,
        args: &[Bytes],
        limits: &Limits,
    ) -> Result<OneRequest, InvalidParam> {
        let (mut sku, mut request_id, mut qty, mut ttl) = (None, None, None, None);
        let (mut change_id, mut policy, mut placement) = (None, None, None);
        let mut order_no = OrderNo::default();
        for (i, field) in single.fields.iter().enumerate() {
            let Some(arg) = args.get(i) else {
                // Past the arguments sent (an optional order_no; HTTP's
                // `"locations": []`, which no arity check stops).
                if *field == Field::Locations {
                    Location::parse_list(&[])?;
                }
                break;
            };
            match field {
                Field::Sku => sku = Some(Sku::parse(arg.clone())?),
                Field::Qty => qty = Some(Qty::parse(arg.clone(), limits.max_qty)?),
                Field::RequestId => {
                    let id = RequestId::parse(arg.clone())?;
                    not_an_order_line(&id)?;
                    request_id = Some(id);
                }
                Field::TtlMs => ttl = Some(HoldTtl::parse(arg.clone(), limits.max_hold_ms)?),
                Field::OrderNo => order_no = OrderNo::parse(arg.clone())?,
                Field::ChangeId => change_id = Some(ChangeId::parse(arg.clone())?),
                Field::Policy => policy = Some(Policy::parse(arg)?),
                Field::Locations => {
                    placement = Some(Arc::new(Placement {
                        policy: policy.unwrap_or_else(|| {
                            unreachable!("{command:?}'s policy comes before its locations")
                        }),
                        locations: Location::parse_list(&args[i..])?,
                    }))
                }
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
                change_id,
                placement,
            }),
            _ => unreachable!(
                "{command:?}'s fields name its sku and request_id, and its arity was checked"
            ),
        }
    }

    /// One field as it was sent (checked), if this call has it; the first
    /// location for [`Field::Locations`] (see [`OneRequest::locations`]).
    pub fn field(&self, field: Field) -> Option<&[u8]> {
        match field {
            Field::Sku => Some(self.sku.as_bytes()),
            Field::RequestId => Some(self.request_id.as_bytes()),
            Field::Qty => self.qty.as_ref().map(Qty::as_bytes),
            Field::TtlMs => self.ttl.as_ref().map(HoldTtl::as_bytes),
            Field::OrderNo => Some(self.order_no.as_bytes()),
            Field::ChangeId => self.change_id.as_ref().map(ChangeId::as_bytes),
            Field::Policy => self.placement.as_ref().map(|p| p.policy.word().as_bytes()),
            Field::Locations => self
                .placement
                .as_ref()
                .and_then(|p| p.locations.first())
                .map(Location::as_bytes),
        }
    }

    /// The locations named, in order (none but for an allocation).
    pub fn locations(&self) -> &[Location] {
        self.placement
            .as_deref()
            .map_or(&[], |placement| &placement.locations)
    }

    /// The caller's script arguments, in ARGV order (DEDUCT's, which a
    /// coalesced call writes member by member).
    pub fn caller_args(&self) -> CallerArgs<'_> {
        let mut args = CallerArgs::NONE;
        for arg in self.single.argv {
            if let Arg::Caller(field) = arg {
                args.0[args.1] = self.field(*field).unwrap_or_default();
                args.1 += 1;
            }
        }
        args
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

/// The single-line commands refuse the request_ids of order lines (code
/// 3): only an order's own saga may hold, confirm or give back its lines,
/// or the order would no longer be all or nothing.
pub(super) fn not_an_order_line(request_id: &RequestId) -> Result<(), InvalidParam> {
    if request_id
        .as_bytes()
        .starts_with(crate::keys::ORDER_LINE_PREFIX.as_bytes())
    {
        return Err(InvalidParam(format!(
            "request_id may not start with {:?}: it names the lines of an ORDER",
            crate::keys::ORDER_LINE_PREFIX
        )));
    }
    Ok(())
}

/// Where the access log finds a field among the arguments as sent (they
/// may be invalid).
pub fn position(single: &Single, field: Field) -> Option<usize> {
    single.fields.iter().position(|f| *f == field)
}

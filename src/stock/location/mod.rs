//! A SKU kept by location (docs/locations.md): the one owner of a call on
//! it. Every such call is one call of `lua/allocate.lua` on the SKU's
//! slot, with the SKU's locations hash declared beside its other keys.
//!
//! - [`deduct_at`] and [`hold_at`]: DEDUCT.AT and HOLD.AT, an allocation
//!   over the locations a caller names, in its order ([`StockService::allocate`]).
//! - [`locations`]: STOCK.LOCATIONS, what each location holds.
//! - The calls of a SKU that keeps one number, sent on here when their
//!   script met a SKU kept by location (`LOCATED`, nothing changed):
//!   REVERT, CONFIRM, HOLD.EXTEND and HOLD.SHRINK of a request made here
//!   ([`StockService::by_location`]); STOCK.GET and the sweeper's release
//!   ([`StockService::read_by_location`]). A DEDUCT or HOLD that names no
//!   location answers 3 without a call.
//! - STOCK.SET and STOCK.ADD `... AT <location>` ([`StockService::change_location`]).
//!
//! Such calls go by the awaited path (the node pipe, then the redis
//! crate), never the pre-encoded hot path of DEDUCT: their keys and
//! arguments vary with the locations named.

pub mod deduct_at;
pub mod hold_at;
pub mod locations;

use super::books::AccessEntry;
use super::call::not_an_order_line;
use super::single::OneRequest;
use super::{Caller, StockCommand, StockResult, StockService};
use crate::auth::Account;
use crate::error::{FaultKind, UpstreamError};
use crate::outcome::{Code, StockReply};
use crate::params::{
    HoldTtl, InvalidParam, Location, OpId, Placement, Policy, Qty, RequestId, Sku,
};
use crate::reply::Reply;
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use redis::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a DEDUCT or HOLD that names no location answers on a SKU kept by
/// location: never units taken from nowhere.
pub const NAME_LOCATIONS: &str =
    "the sku keeps its stock by location: name them (DEDUCT.AT, HOLD.AT)";

/// What a DEDUCT.AT or HOLD.AT came to: the reply, and what each location
/// gave (in the order taken; a retry's, what the first call took).
#[derive(Debug, Clone)]
pub struct Allocated {
    pub reply: StockReply,
    pub allocation: Vec<(Bytes, i64)>,
}

impl Allocated {
    fn invalid(reason: impl Into<Bytes>) -> Allocated {
        Allocated {
            reply: StockReply::invalid(reason),
            allocation: Vec::new(),
        }
    }

    /// The RESP reply: `[code, remain, order_no, version, reason,
    /// expires_at_ms, [location, units, ...]]`, seven elements always.
    pub fn to_reply(&self) -> Reply {
        let reply = &self.reply;
        let allocation = self
            .allocation
            .iter()
            .flat_map(|(location, units)| [Reply::Bulk(location.clone()), Reply::Integer(*units)])
            .collect();
        Reply::Array(vec![
            Reply::Integer(reply.code as i64),
            Reply::Integer(reply.remain),
            Reply::Bulk(reply.order_no.clone()),
            Reply::Integer(reply.version),
            Reply::Bulk(reply.reason.clone().unwrap_or_default()),
            Reply::Integer(reply.expires_at.unwrap_or(0)),
            Reply::Array(allocation),
        ])
    }
}

/// What a change of a hold sends on by location: its change record (none
/// for an order's line: its intent records the change) and its amount
/// (ttl_ms or qty).
pub(super) struct HoldChangeArgs<'a> {
    pub record: Option<&'a [u8]>,
    pub amount: &'a [u8],
}

/// A DEDUCT.AT's or HOLD.AT's arguments, checked in the order sent.
struct Asked {
    sku: Sku,
    qty: Qty,
    request_id: RequestId,
    ttl: Option<HoldTtl>,
    placement: Placement,
}

impl StockService {
    /// Serves DEDUCT.AT (`hold` false) or HOLD.AT for a client connection
    /// ([`super::command::Serve::Alone`]).
    pub(super) fn serve_allocation<'a>(
        self: &'a Arc<Self>,
        hold: bool,
        args: &'a [Bytes],
        caller: &'a Caller,
    ) -> BoxFuture<'a, Reply> {
        let arrived = Instant::now();
        let user = caller.user.as_deref().map(Account::name);
        async move {
            match self.allocate(hold, args, arrived, user).await {
                Ok(allocated) => allocated.to_reply(),
                Err(fault) => Reply::Error(fault.reply_text()),
            }
        }
        .boxed()
    }

    /// DEDUCT.AT or HOLD.AT with `args` (after the name, arity checked),
    /// awaited: the allocation in one call, its metrics and access log.
    pub async fn allocate(
        &self,
        hold: bool,
        args: &[Bytes],
        arrived: Instant,
        user: Option<&str>,
    ) -> Result<Allocated, UpstreamError> {
        let command = if hold {
            StockCommand::HoldAt
        } else {
            StockCommand::DeductAt
        };
        let entry = AccessEntry {
            command,
            user,
            sku: args.first().map(|a| &a[..]),
            request_id: args.get(2).map(|a| &a[..]),
            qty: args.get(1).map(|a| &a[..]),
        };
        let asked = match self.check_allocation(hold, args) {
            Ok(asked) => asked,
            Err(invalid) => {
                let allocated = Allocated::invalid(invalid.0);
                self.books
                    .record(entry, Ok(allocated.reply.code), arrived.elapsed());
                return Ok(allocated);
            }
        };
        if let Some(ttl) = &asked.ttl {
            // Filed beside the HOLD.AT, as a HOLD is: the sweeper then
            // watches the SKU's shard, and finds the hold even if this
            // stockgate dies before it answers.
            self.sweeper
                .mark_for_sweep(&asked.sku, Duration::from_millis(ttl.get()));
        }
        let result = self.run_allocation(hold, &asked).await;
        match &result {
            Ok(allocated) => {
                let reply = &allocated.reply;
                self.books.record(entry, Ok(reply.code), arrived.elapsed());
                self.books.record_holds(reply, false);
                if reply.code == Code::Ok {
                    self.books
                        .metrics
                        .record_allocation(asked.placement.policy, allocated.allocation.len() > 1);
                }
                if hold && matches!(reply.code, Code::Ok | Code::Duplicate) {
                    self.sweeper
                        .mark_held(&asked.sku, reply.expires_at.unwrap_or(0));
                }
            }
            Err(fault) => self.books.record(entry, Err(fault), arrived.elapsed()),
        }
        result
    }

    fn check_allocation(&self, hold: bool, args: &[Bytes]) -> Result<Asked, InvalidParam> {
        let limits = &self.settings.limits;
        let sku = Sku::parse(args[0].clone())?;
        let qty = Qty::parse(args[1].clone(), limits.max_qty)?;
        let request_id = RequestId::parse(args[2].clone())?;
        not_an_order_line(&request_id)?;
        let (ttl, rest) = if hold {
            (
                Some(HoldTtl::parse(args[3].clone(), limits.max_hold_ms)?),
                &args[4..],
            )
        } else {
            (None, &args[3..])
        };
        let placement = Placement {
            policy: Policy::parse(&rest[0])?,
            locations: Location::parse_list(&rest[1..])?,
        };
        self.fresh(&request_id)?;
        Ok(Asked {
            sku,
            qty,
            request_id,
            ttl,
            placement,
        })
    }

    async fn run_allocation(&self, hold: bool, asked: &Asked) -> Result<Allocated, UpstreamError> {
        let nonce = self.nonces.next();
        let ttl = asked.ttl.as_ref().filter(|_| hold);
        let allocated = self
            .allocation_call(
                (&asked.sku, &asked.request_id),
                &asked.qty,
                ttl,
                &asked.placement,
                &nonce,
                self.deadline(),
            )
            .await?;
        Ok(Allocated {
            reply: allocated.reply.with_expiry(hold),
            allocation: allocated.allocation,
        })
    }

    /// An order's line on a SKU kept by location, its HOLD or take (a
    /// DEDUCT) sent on here (LOCATED): allocated over the line's
    /// locations, under the line's own id. The order's reply shows no
    /// allocation; the line's record keeps it, and its CONFIRM, REVERT and
    /// expiry follow it.
    pub(super) async fn allocate_line(
        &self,
        request: &OneRequest,
        placement: &Placement,
        nonce: &[u8],
        deadline: tokio::time::Instant,
    ) -> StockResult {
        let hold = request.command == StockCommand::Hold;
        let (Some(qty), true) = (
            &request.qty,
            hold || request.command == StockCommand::Deduct,
        ) else {
            return Ok(StockReply::invalid(NAME_LOCATIONS));
        };
        let ttl = request.ttl.as_ref().filter(|_| hold);
        let on = (&request.sku, &request.request_id);
        Ok(self
            .allocation_call(on, qty, ttl, placement, nonce, deadline)
            .await?
            .reply)
    }

    /// One allocation (`lua/allocate.lua` "hold" with a `ttl`, else
    /// "deduct") of `qty` on the request `on`, over `placement`.
    async fn allocation_call(
        &self,
        (sku, request_id): (&Sku, &RequestId),
        qty: &Qty,
        ttl: Option<&HoldTtl>,
        placement: &Placement,
        nonce: &[u8],
        deadline: tokio::time::Instant,
    ) -> Result<Allocated, UpstreamError> {
        let keys = self.keys.request_keys(sku, request_id);
        let loc_key = self.keys.locations_key(sku);
        let [stock, record, holds, held, marker, journal] = keys.all();
        let keys: [&[u8]; 7] = [stock, record, holds, held, marker, journal, &loc_key];
        let mut argv: Vec<&[u8]> = vec![
            if ttl.is_some() { b"hold" } else { b"deduct" },
            self.located_settings(),
            nonce,
            qty.as_bytes(),
            placement.policy.word().as_bytes(),
        ];
        argv.extend(ttl.map(HoldTtl::as_bytes));
        argv.extend(placement.locations.iter().map(Location::as_bytes));
        let value = self
            .with_journal(sku, deadline, || {
                self.upstream
                    .eval_piped(&self.scripts.allocate, &keys, &argv, deadline)
            })
            .await?;
        allocated_of(value)
    }

    /// The settings every `lua/allocate.lua` call takes: HOLD's.
    fn located_settings(&self) -> &[u8] {
        self.wires.of(StockCommand::Hold, false).settings_arg()
    }

    /// A call on one request whose script met a SKU kept by location
    /// (LOCATED, nothing changed), sent on by location: REVERT, CONFIRM,
    /// HOLD.EXTEND, HOLD.SHRINK (their change record, none for an order's
    /// line, and their amount: ttl_ms or qty).
    /// A DEDUCT or HOLD names no location: code 3, no call.
    pub(super) async fn by_location(
        &self,
        command: StockCommand,
        sku: &Sku,
        request_id: &RequestId,
        nonce: &[u8],
        change: Option<HoldChangeArgs<'_>>,
        deadline: tokio::time::Instant,
    ) -> StockResult {
        let op: &[u8] = match command {
            StockCommand::Revert => b"revert",
            StockCommand::Confirm => b"confirm",
            StockCommand::HoldExtend => b"extend",
            StockCommand::HoldShrink => b"shrink",
            _ => return Ok(StockReply::invalid(NAME_LOCATIONS)),
        };
        let keys = self.keys.request_keys(sku, request_id);
        let loc_key = self.keys.locations_key(sku);
        let mut named: Vec<&[u8]> = keys.all().to_vec();
        named.push(&loc_key);
        let mut argv: Vec<&[u8]> = vec![op, self.located_settings(), nonce];
        if let Some(change) = change {
            named.extend(change.record);
            argv.push(change.amount);
        }
        self.with_journal(sku, deadline, || {
            self.upstream
                .eval_fallback(&self.scripts.allocate, &named, &argv, deadline)
        })
        .await
    }

    /// STOCK.GET (`get`), STOCK.LOCATIONS (`locations`) or the sweeper's
    /// release (`release`) of a SKU kept by location: the script's reply.
    /// Their answers acknowledge no write (what they write, expired holds
    /// given back, any later call redoes from Redis time), so no replica
    /// need confirm it: a total of 0, 1 or 4 is not a write's code.
    pub(super) async fn read_by_location(
        &self,
        op: &str,
        sku: &Sku,
    ) -> Result<Value, UpstreamError> {
        let keys = self.keys.sku_keys(sku);
        let loc_key = self.keys.locations_key(sku);
        let mut named: Vec<&[u8]> = keys.all().to_vec();
        named.push(&loc_key);
        let argv: [&[u8]; 2] = [op.as_bytes(), self.located_settings()];
        self.with_journal(sku, self.deadline(), || {
            self.upstream
                .eval_piped(&self.scripts.allocate_reads, &named, &argv, self.deadline())
        })
        .await
    }

    /// STOCK.STATUS of a request on a SKU kept by location (`lua/allocate.lua`
    /// "status"): `lua/status.lua`'s shape, its stock the SKU's total
    /// available; nil when the SKU keeps its stock by location no more. A
    /// read, as [`StockService::read_by_location`]'s.
    pub(super) async fn status_by_location(
        &self,
        sku: &Sku,
        request_id: &RequestId,
    ) -> Result<Value, UpstreamError> {
        let keys = self.keys.request_keys(sku, request_id);
        let loc_key = self.keys.locations_key(sku);
        let mut named: Vec<&[u8]> = keys.all().to_vec();
        named.push(&loc_key);
        let argv: [&[u8]; 2] = [b"status", self.located_settings()];
        self.with_journal(sku, self.deadline(), || {
            self.upstream
                .eval_piped(&self.scripts.allocate_reads, &named, &argv, self.deadline())
        })
        .await
    }

    /// STOCK.SET (`floor` maybe) or STOCK.ADD of one location: the op
    /// record's keys with the locations hash.
    pub(super) async fn change_location(
        &self,
        sku: &Sku,
        op_id: &OpId,
        set: bool,
        amount: &[u8],
        location: &Location,
        floor: Option<&[u8]>,
    ) -> StockResult {
        let keys = self.keys.op_keys(sku, op_id);
        let loc_key = self.keys.locations_key(sku);
        let mut named: Vec<&[u8]> = keys.all().to_vec();
        named.push(&loc_key);
        let nonce = self.nonces.next();
        let argv: [&[u8]; 6] = [
            if set { b"set" } else { b"add" },
            self.located_settings(),
            &nonce,
            amount,
            location.as_bytes(),
            floor.unwrap_or(b""),
        ];
        self.with_journal(sku, self.deadline(), || {
            self.upstream
                .eval_stock(&self.scripts.allocate, &named, &argv)
        })
        .await
    }
}

/// An allocation's reply: answer()'s ten elements, then the allocation.
fn allocated_of(value: Value) -> Result<Allocated, UpstreamError> {
    let bad = |what: &str| {
        UpstreamError::new(
            FaultKind::BadReply,
            format!("lua/allocate.lua answered {what}"),
        )
    };
    let Value::Array(mut items) = value else {
        return Err(bad("no array"));
    };
    if items.len() != 11 {
        return Err(bad(&format!("{} elements, not 11", items.len())));
    }
    let Some(Value::Array(flat)) = items.pop() else {
        return Err(bad("no allocation"));
    };
    let reply = StockReply::from_script(Value::Array(items))?;
    let mut allocation = Vec::with_capacity(flat.len() / 2);
    for pair in flat.chunks(2) {
        match pair {
            [Value::BulkString(name), Value::Int(units)] => {
                allocation.push((Bytes::copy_from_slice(name), *units))
            }
            _ => return Err(bad("an allocation that is not location, units pairs")),
        }
    }
    Ok(Allocated { reply, allocation })
}

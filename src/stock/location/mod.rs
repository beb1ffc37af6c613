//! A SKU kept by location (docs/locations.md). Every call on it is one
//! call of `lua/allocate.lua` on the SKU's slot, with the SKU's locations
//! hash declared beside its other keys.
//!
//! - [`deduct_at`] and [`hold_at`]: DEDUCT.AT and HOLD.AT, an allocation
//!   over the locations a caller names, in its order: calls on one request
//!   like any other ([`super::call`]), which an order's line on such a SKU
//!   makes too.
//! - REVERT, CONFIRM, HOLD.EXTEND and HOLD.SHRINK of a request made here
//!   are the request state machine's (`lua/common.lua`), which their own
//!   scripts run for a SKU of either kind: they declare its locations
//!   hash. A DEDUCT or HOLD that names no location answers 3
//!   ([`NAME_LOCATIONS`]).
//! - [`locations`]: STOCK.LOCATIONS, what each location holds; STOCK.GET
//!   and the sweeper's release of such a SKU ([`StockService::read_by_location`]).
//! - STOCK.SET and STOCK.ADD `... AT <location>` ([`StockService::change_location`]).

pub mod deduct_at;
pub mod hold_at;
pub mod locations;

use super::{StockCommand, StockResult, StockService};
use crate::error::UpstreamError;
use crate::params::{Location, OpId, RequestId, Sku};
use redis::Value;

/// What a DEDUCT or HOLD that names no location answers on a SKU kept by
/// location: never units taken from nowhere.
pub const NAME_LOCATIONS: &str =
    "the sku keeps its stock by location: name them (DEDUCT.AT, HOLD.AT)";

impl StockService {
    /// The settings every `lua/allocate.lua` call takes: HOLD's.
    fn located_settings(&self) -> &[u8] {
        self.wires.of(StockCommand::Hold, false).settings_arg()
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

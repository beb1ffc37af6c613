//! A change of a live hold (HOLD.EXTEND, HOLD.SHRINK: [`super::extend`],
//! [`super::shrink`] describe them), from the request to its reply: check
//! the arguments, run `lua/change_hold.lua` on the hold's SKU, record what
//! it came to, and file an extended hold in the sweep index again.
//!
//! A change is rare beside DEDUCT and HOLD (one per slow payment, or per
//! unit a customer takes out while paying), so it goes by the redis
//! crate's path awaited ([`crate::upstream::Upstream::eval_stock`]), not
//! through the node pipes' pre-encoded calls: it has a seventh key, the
//! change's own record, that the calls on one request don't.
//!
//! An ORDER.EXTEND extends its order's lines by the same script
//! ([`StockService::extend_order_line`]), with the six keys of the line's
//! request and no change record: the order's intent records the change.

use super::books::AccessEntry;
use super::call::not_an_order_line;
use super::location::HoldChangeArgs;
use super::service::stock_reply;
use super::{Caller, StockCommand, StockResult, StockService};
use crate::auth::Account;
use crate::outcome::{Code, StockReply};
use crate::params::{ChangeId, HoldTtl, InvalidParam, Qty, RequestId, Sku};
use crate::reply::Reply;
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which change of a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldChange {
    /// A new expiry, `ttl_ms` from now (Redis time), later than the one
    /// the hold has and within `--max-hold` of its start.
    Extend,
    /// `qty` of the hold's units given back at once; the rest stays held.
    Shrink,
}

impl HoldChange {
    /// The command it is, for its metrics and access log.
    pub fn command(self) -> StockCommand {
        match self {
            HoldChange::Extend => StockCommand::HoldExtend,
            HoldChange::Shrink => StockCommand::HoldShrink,
        }
    }

    /// Serves it for a client connection ([`super::command::Serve::Alone`]):
    /// the awaited call, as the RESP reply.
    pub fn serve<'a>(
        self,
        service: &'a Arc<StockService>,
        args: &'a [Bytes],
        caller: &'a Caller,
    ) -> BoxFuture<'a, Reply> {
        let arrived = Instant::now();
        let user = caller.user.as_deref().map(Account::name);
        async move { stock_reply(service.change_hold(self, args, arrived, user).await) }.boxed()
    }

    /// Its word in `lua/change_hold.lua`'s ARGV.
    fn word(self) -> &'static [u8] {
        match self {
            HoldChange::Extend => b"extend",
            HoldChange::Shrink => b"shrink",
        }
    }
}

/// The arguments, in the order both commands take them:
/// `<sku> <request_id> <change_id> <ttl_ms | qty>`.
struct Checked {
    sku: Sku,
    request_id: RequestId,
    change_id: ChangeId,
    /// ttl_ms or qty, as sent (canonical), and what an extension's ttl is.
    amount: Bytes,
    ttl: Option<Duration>,
}

impl StockService {
    /// HOLD.EXTEND or HOLD.SHRINK with `args` (after the name, arity
    /// checked), awaited; `arrived` is when the request was read.
    pub async fn change_hold(
        self: &Arc<Self>,
        change: HoldChange,
        args: &[Bytes],
        arrived: Instant,
        user: Option<&str>,
    ) -> StockResult {
        let command = change.command();
        let entry = || AccessEntry {
            command,
            user,
            sku: args.first().map(|a| &a[..]),
            request_id: args.get(1).map(|a| &a[..]),
            qty: match change {
                HoldChange::Shrink => args.get(3).map(|a| &a[..]),
                HoldChange::Extend => None,
            },
        };
        let checked = match self.check_change(change, args) {
            Ok(checked) => checked,
            Err(invalid) => {
                let reply = StockReply::invalid(invalid.0).with_expiry(true);
                self.books
                    .record(entry(), Ok(reply.code), arrived.elapsed());
                return Ok(reply);
            }
        };
        let keys =
            self.keys
                .hold_change_keys(&checked.sku, &checked.request_id, &checked.change_id);
        let mut result = self
            .run_change(
                change,
                &checked.sku,
                &keys.all(),
                &checked.amount,
                checked.ttl,
            )
            .await;
        if matches!(&result, Err(fault) if fault.is_located()) {
            // A hold HOLD.AT placed: the same change, by location.
            let nonce = self.nonces.next();
            result = self
                .by_location(
                    command,
                    &checked.sku,
                    &checked.request_id,
                    &nonce,
                    Some(HoldChangeArgs {
                        record: Some(&keys.change),
                        amount: &checked.amount,
                    }),
                    self.deadline(),
                )
                .await
                .map(|reply| reply.with_expiry(true));
            if let Ok(reply) = &result {
                self.books.record_holds(reply, false);
                if let Some(ttl) = checked.ttl
                    && matches!(reply.code, Code::Ok | Code::Duplicate)
                {
                    self.sweeper
                        .mark_extended(&checked.sku, ttl, reply.expires_at.unwrap_or(0));
                }
            }
        }
        match &result {
            Ok(reply) => self
                .books
                .record(entry(), Ok(reply.code), arrived.elapsed()),
            Err(fault) => self.books.record(entry(), Err(fault), arrived.elapsed()),
        }
        result
    }

    /// An ORDER.EXTEND's call on one line of its order: the line's hold
    /// (`line_id`, `~ord:<order id>`) lasts at least `ttl` from now, at
    /// most to its bound, never less than it lasts (`lua/change_hold.lua`
    /// has the rule). Code 1 when it lasts that long already.
    pub(crate) async fn extend_order_line(
        &self,
        sku: &Sku,
        line_id: &RequestId,
        ttl: &HoldTtl,
    ) -> StockResult {
        let keys = self.keys.request_keys(sku, line_id);
        let result = self
            .run_change(
                HoldChange::Extend,
                sku,
                &keys.all(),
                ttl.as_bytes(),
                Some(Duration::from_millis(ttl.get())),
            )
            .await;
        if !matches!(&result, Err(fault) if fault.is_located()) {
            return result;
        }
        // A line on a SKU kept by location: the same extension, by location.
        let nonce = self.nonces.next();
        let result = self
            .by_location(
                StockCommand::HoldExtend,
                sku,
                line_id,
                &nonce,
                Some(HoldChangeArgs {
                    record: None,
                    amount: ttl.as_bytes(),
                }),
                self.deadline(),
            )
            .await
            .map(|reply| reply.with_expiry(true));
        if let Ok(reply) = &result
            && matches!(reply.code, Code::Ok | Code::Duplicate)
        {
            self.sweeper.mark_extended(
                sku,
                Duration::from_millis(ttl.get()),
                reply.expires_at.unwrap_or(0),
            );
        }
        result
    }

    /// The script's call, its holds metrics, and an extended hold filed in
    /// the sweep index again.
    async fn run_change(
        &self,
        change: HoldChange,
        sku: &Sku,
        keys: &[&[u8]],
        amount: &[u8],
        ttl: Option<Duration>,
    ) -> StockResult {
        let nonce = self.nonces.next();
        // HOLD's settings: the script takes the same words (its header).
        let hold_settings = self.wires.of(StockCommand::Hold, false).settings_arg();
        let script_args: [&[u8]; 4] = [change.word(), amount, hold_settings, &nonce];
        let result = self
            .with_journal(sku, self.deadline(), || {
                self.upstream
                    .eval_stock(&self.scripts.change_hold, keys, &script_args)
            })
            .await
            .map(|reply| reply.with_expiry(true));
        if let Ok(reply) = &result {
            self.books.record_holds(reply, false);
            if let Some(ttl) = ttl
                && matches!(reply.code, Code::Ok | Code::Duplicate)
            {
                self.sweeper
                    .mark_extended(sku, ttl, reply.expires_at.unwrap_or(0));
            }
        }
        result
    }

    /// The arguments, checked in order; the first that breaks its rule is
    /// the reason given.
    fn check_change(&self, change: HoldChange, args: &[Bytes]) -> Result<Checked, InvalidParam> {
        let limits = &self.settings.limits;
        let sku = Sku::parse(args[0].clone())?;
        let request_id = RequestId::parse(args[1].clone())?;
        not_an_order_line(&request_id)?;
        let change_id = ChangeId::parse(args[2].clone())?;
        let (amount, ttl) = match change {
            HoldChange::Extend => {
                let ttl = HoldTtl::parse(args[3].clone(), limits.max_hold_ms)?;
                (
                    Bytes::copy_from_slice(ttl.as_bytes()),
                    Some(Duration::from_millis(ttl.get())),
                )
            }
            HoldChange::Shrink => {
                let qty = Qty::parse(args[3].clone(), limits.max_qty)?;
                (Bytes::copy_from_slice(qty.as_bytes()), None)
            }
        };
        // A change_id whose record may have expired could apply again.
        self.fresh_id("change_id", &RequestId::parse(args[2].clone())?)?;
        Ok(Checked {
            sku,
            request_id,
            change_id,
            amount,
            ttl,
        })
    }
}

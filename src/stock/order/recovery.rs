//! Recovery: every order ends, whether or not its caller retries.
//!
//! A saga stops half way when its stockgate dies, or when a fault outlasts
//! its budget (a primary stalled mid-CONFIRM): the intent then says
//! HOLDING, CONFIRMING, ABORTING or REVERTING, and nothing would move it
//! on until a retry. So before an order command changes an intent, it
//! files the order among the *orders in flight* (`lua/order_due.lua`, one
//! sorted set per shard of the sweep index, by the slot of the intent),
//! due [`super::filing::recover_after`] later; once the order rests it takes
//! it out again. What is still filed when due was left behind, and the
//! sweeper's passes (every stockgate's for the shards it filed orders in,
//! the lease holder's for every active shard: [`crate::stock::sweeper`])
//! drive it to an end, each phase the way it points:
//!
//! - HOLDING (before the commit point): back. The intent goes to ABORTING
//!   with code 5, expired (its caller was told the outcome is unknown; a
//!   retry now answers 5), and every line is given back.
//! - CONFIRMING (past it): forward. Every line is confirmed, and the order
//!   is DONE; a line that expired meanwhile aborts it as any CONFIRM would
//!   (ABORTING, 5), and every line comes back.
//! - ABORTING, REVERTING: on to ABORTED, REVERTED.
//! - HELD, DONE, ABORTED, REVERTED, REVOKED, none: at rest; nothing to do
//!   (a HELD order waits for its ORDER.CONFIRM, and its lines expire by
//!   themselves).
//!
//! Every step is the saga's own compare-and-set and idempotent line calls,
//! so a recovery racing a slow saga, a retry or another stockgate's
//! recovery converges on one outcome. An order that can't be moved yet (its
//! primary is still down) is filed again [`RETRY_AFTER`] later. So an
//! unfinished order ends within [`super::filing::recover_after`] of its last
//! command, or within about a [`crate::stock::sweeper::PASS_EVERY`] plus
//! [`RETRY_AFTER`] of the fault healing if that is later (plus the lease's
//! handover when the stockgate that filed it died too).

use super::intent::IntentOp;
use super::{Filing, OrderId, Phase, Saga, parse_id};
use crate::error::UpstreamError;
use crate::keys::SweepShard;
use crate::outcome::Code;
use crate::stock::StockService;
use crate::stock::command::Want;
use bytes::Bytes;
use redis::Value;
use std::time::Duration;

/// Between a failed recovery of an order and the next.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// Orders one index call lists, and index calls one shard gets per pass.
const LIST: usize = 64;
const ROUNDS: usize = 4;

/// The orders of one shard that are due, each driven to an end; the
/// first failure, if any (an order that failed is filed again for
/// later, the others go on).
pub async fn recover_shard(
    service: &StockService,
    shard: &SweepShard,
) -> Result<(), UpstreamError> {
    let keys = [&shard.orders[..]];
    let list = LIST.to_string();
    let retry = RETRY_AFTER.as_millis().to_string();
    let mut failed = None;
    for _ in 0..ROUNDS {
        let listed = service
            .upstream
            .eval(
                &service.scripts.order_due,
                &keys,
                &[b"list", list.as_bytes()],
            )
            .await?;
        let due = due_orders(&listed)?;
        if due.is_empty() {
            break;
        }
        let results =
            futures_util::future::join_all(due.iter().map(|(id, _)| recover_order(service, id)))
                .await;
        for ((id, score), result) in due.iter().zip(results) {
            let (op, extra): (&[u8], &[u8]) = match &result {
                Ok(()) => (b"done", b""),
                Err(_) => (b"later", retry.as_bytes()),
            };
            service.books.metrics.record_order_recovery(result.is_ok());
            if let Err(fault) = result {
                tracing::warn!(error = %fault, order = %String::from_utf8_lossy(id), "could not finish an order left behind; trying again later");
                failed = Some(fault);
            }
            service
                .upstream
                .eval(&service.scripts.order_due, &keys, &[op, id, score, extra])
                .await?;
        }
        if due.len() < LIST {
            break;
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Drives one order left behind to an end (module doc).
async fn recover_order(service: &StockService, id: &[u8]) -> Result<(), UpstreamError> {
    // Not an order stockgate would file: let it go.
    let Ok(id) = parse_id(&Bytes::copy_from_slice(id)) else {
        return Ok(());
    };
    let bound = super::filing::saga_bound(service);
    tokio::time::timeout(bound, drive_left_behind(service, &id))
        .await
        .unwrap_or_else(|_| Err(super::filing::saga_overrun(bound)))
}

async fn drive_left_behind(service: &StockService, id: &OrderId) -> Result<(), UpstreamError> {
    let mut saga = Saga::new(service, id, Filing::Off);
    let mut intent = saga.intent(IntentOp::Read).await?;
    if intent.phase == Phase::Holding {
        // Before the commit point, its caller gone: back.
        intent = saga
            .intent(IntentOp::Advance {
                from: Phase::Holding,
                to: Phase::Aborting,
                abort: Some((Code::Expired, &[])),
            })
            .await?;
    }
    match intent.phase {
        Phase::Confirming | Phase::Aborting | Phase::Reverting => {
            tracing::info!(order = %String::from_utf8_lossy(id.id.as_bytes()), phase = intent.phase.as_str(), "finishing an order left behind");
            saga.settle(Want::Recover, intent, None).await.map(drop)
        }
        _ => Ok(()),
    }
}

/// The index's `{now, id, score, ...}`, as (id, score) pairs.
fn due_orders(listed: &Value) -> Result<Vec<crate::stock::sweep_index::Due>, UpstreamError> {
    crate::stock::sweep_index::listed_pairs("order_due", listed)
}

//! The hold sweeper: gives back the expired holds of SKUs that no request
//! touches. Correctness never depends on it: every call on a SKU releases
//! the SKU's expired holds first, and answers by Redis time whether or not
//! anything has. The sweeper only makes units come back on time when
//! nobody asks.
//!
//! # How it finds them
//!
//! - Every HOLD files its SKU in the sweep index (`lua/due_mark.lua`): a
//!   sorted set per shard, its shard chosen by the SKU's slot and living in
//!   that range of slots ([`crate::keys`]), so the index of a SKU is
//!   usually on the SKU's own primary. Twice: beside the HOLD by its ttl
//!   (found even if this stockgate dies before the answer), and once the
//!   HOLD answered, by the hold's own expiry, which makes the index exact
//!   whatever order a sweep and the HOLD ran in. A mark that fails is sent
//!   again at the next pass.
//! - Each stockgate sweeps the shards it placed holds in, every
//!   [`PASS_EVERY`], until a minute after the last of them ends: for each,
//!   it asks the index for the SKUs due now (`lua/due_sweep.lua`), releases
//!   each one's expired holds (`lua/release.lua`, bounded per call), and
//!   files the SKU again under its next expiry. So a live stockgate's holds
//!   come back within about a second of their expiry, and sweeping costs
//!   nothing where no holds were placed. Nothing is scanned: the cost grows
//!   with the SKUs that have holds due, never with the keyspace.
//! - A stockgate may die with holds placed. A HOLD also tells the sweep
//!   leader that its shard is active (`lua/sweep_active.lua`, at most every
//!   [`super::sweep_index::HINT_EVERY`] per shard from each stockgate), and the leader sweeps
//!   every active shard too. One stockgate leads at a time, by a lease in
//!   Redis (`lua/sweep_lease.lua`); it looks at the active shards every
//!   [`PASS_EVERY`] while some are, every [`IDLE_EVERY`] while none is (its
//!   only cost on an idle cluster), and the others try the lease every
//!   [`TRY_EVERY`]. So the holds of a stockgate that died come back within
//!   about a second of their expiry, or [`IDLE_EVERY`] after they were
//!   placed if that is later, while the leader lives; a leader that dies is
//!   replaced within about [`LEASE`] + [`TRY_EVERY`].
//!
//! Many stockgates sweeping one shard at once is harmless (a release is
//! idempotent and exact); it costs one index call each per pass.

use super::StockService;
use super::sweep_index::{Due, bad_reply, listed_pairs};
use crate::error::UpstreamError;
use crate::keys::{SWEEP_SHARDS, SweepShard};
use crate::outcome::HoldEvent;
use crate::params::Sku;
use futures_util::stream::{self, StreamExt};
use redis::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Between passes over the shards being swept.
pub const PASS_EVERY: Duration = Duration::from_secs(1);
/// Between the leader's looks at the active shards while none is.
pub const IDLE_EVERY: Duration = Duration::from_secs(5);
/// How often a stockgate that does not lead tries the lease.
pub const TRY_EVERY: Duration = Duration::from_secs(10);
/// How long the lease lasts unless renewed (the leader renews it at every
/// look, at most [`IDLE_EVERY`] apart).
pub const LEASE: Duration = Duration::from_secs(15);
/// How long after its mark the index keeps a SKU that had no holds when
/// the sweeper looked: the HOLD that marked it may not have run yet.
pub const GRACE: Duration = Duration::from_secs(10);
/// SKUs one index call lists, and index calls one shard gets per pass: a
/// pass releases at most `LIST * ROUNDS * RELEASE_BOUND` holds per shard
/// (lua/common.lua), and a bigger backlog waits for the next pass.
const LIST: usize = 64;
const ROUNDS: usize = 16;
/// Release calls one shard has in flight at once.
const RELEASES_IN_FLIGHT: usize = 16;

/// The sweeper, until `stop`: every [`PASS_EVERY`] it sweeps the shards
/// of its own holds and, when it leads, the active ones; it tries the
/// lease when due, and gives it up on the way out.
pub async fn sweep(service: &StockService, stop: CancellationToken) {
    Sweep { service }.run(stop).await
}

/// The passes of [`sweep`].
struct Sweep<'a> {
    service: &'a StockService,
}

impl Sweep<'_> {
    async fn run(&self, stop: CancellationToken) {
        let owner = self.service.nonces.next();
        let lease_ms = LEASE.as_millis().to_string();
        let keys = [
            self.service.keys.sweep_lease(),
            self.service.keys.sweep_active(),
        ];
        let keys = [&keys[0][..], &keys[1][..]];
        let mut leading: Vec<usize> = Vec::new();
        let mut next_look = tokio::time::Instant::now();
        loop {
            if self.service.upstream.is_ready() && tokio::time::Instant::now() >= next_look {
                let looked = self
                    .service
                    .upstream
                    .eval(
                        &self.service.scripts.sweep_lease,
                        &keys,
                        &[&owner[..], lease_ms.as_bytes()],
                    )
                    .await;
                let (leads, active) = match looked {
                    Ok(Value::Array(reply)) if reply.first() == Some(&Value::Int(1)) => {
                        (true, active_shards(&reply[1..]))
                    }
                    Ok(_) => (false, Vec::new()),
                    Err(fault) => {
                        tracing::debug!(error = %fault, "could not reach the sweep lease");
                        (false, Vec::new())
                    }
                };
                next_look += match (leads, active.is_empty()) {
                    (true, false) => PASS_EVERY,
                    (true, true) => IDLE_EVERY,
                    (false, _) => TRY_EVERY,
                };
                next_look = next_look.max(tokio::time::Instant::now());
                leading = active;
            }
            if self.service.upstream.is_ready() {
                self.service.sweeper.resend_marks().await;
            }
            let mut shards = self.service.sweeper.own_shards();
            shards.extend(leading.iter().copied());
            shards.sort_unstable();
            shards.dedup();
            if !shards.is_empty() && self.service.upstream.is_ready() {
                let result = self.pass(&shards).await;
                self.service.books.metrics.record_sweep(result.is_ok());
                if let Err(fault) = result {
                    tracing::debug!(error = %fault, "a sweep pass failed; the next one tries again");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(PASS_EVERY) => {}
            }
        }
        // Hand the lease on at once rather than in LEASE.
        let _ = self
            .service
            .upstream
            .eval(
                &self.service.scripts.sweep_lease,
                &keys,
                &[&owner[..], b"0"],
            )
            .await;
    }

    /// One pass over the active shards, at once: their expired holds
    /// (unless `--sweeper false`) and their orders left behind
    /// ([`crate::stock::order::recovery`]). The first failure, if any (the
    /// other shards are swept all the same).
    async fn pass(&self, shards: &[usize]) -> Result<(), UpstreamError> {
        let all = self.service.keys.sweep_shards();
        let results = futures_util::future::join_all(shards.iter().map(|k| async {
            let holds = if self.service.sweeper.sweeps_holds() {
                self.sweep_shard(&all[*k]).await
            } else {
                Ok(())
            };
            let orders = super::order::recover_shard(self.service, &all[*k]).await;
            holds.and(orders)
        }))
        .await;
        results.into_iter().collect()
    }

    /// Releases what is due in one shard, round by round: each index call
    /// files the SKUs of the round before and lists the next ones due.
    async fn sweep_shard(&self, shard: &SweepShard) -> Result<(), UpstreamError> {
        let keys = [&shard.due[..], &shard.marks[..]];
        let (list, grace) = (LIST.to_string(), GRACE.as_millis().to_string());
        let mut filed: Vec<Vec<u8>> = Vec::new();
        let mut failed = None;
        for round in 0..=ROUNDS {
            // The last call only files what the round before released.
            let list = if round == ROUNDS { "0" } else { list.as_str() };
            let mut args: Vec<&[u8]> = vec![list.as_bytes(), grace.as_bytes()];
            args.extend(filed.iter().map(Vec::as_slice));
            let listed = self
                .service
                .upstream
                .eval(&self.service.scripts.due_sweep, &keys, &args)
                .await?;
            filed.clear();
            let due = due_skus(listed)?;
            if due.is_empty() {
                break;
            }
            let released: Vec<_> = stream::iter(due)
                .map(|(sku, mark)| async move {
                    let next = self.release(&sku).await;
                    (sku, mark, next)
                })
                .buffer_unordered(RELEASES_IN_FLIGHT)
                .collect()
                .await;
            for (sku, mark, next) in released {
                match next {
                    Ok(next_at) => filed.extend([sku, mark, next_at.to_string().into_bytes()]),
                    // Left as it is: due still, so the next pass retries it.
                    Err(fault) => failed = Some(fault),
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Releases one SKU's expired holds; when to look at it again (ms of
    /// Redis time; 0 when it has no holds).
    async fn release(&self, sku: &[u8]) -> Result<i64, UpstreamError> {
        let Ok(sku) = Sku::parse(bytes::Bytes::copy_from_slice(sku)) else {
            // Not a sku stockgate would write: let it leave the index.
            return Ok(0);
        };
        let keys = self.service.keys.sku_keys(&sku);
        let keys = keys.all();
        let args = [
            self.service.settings.retry_window_arg.as_bytes(),
            self.service.settings.journal_arg.as_bytes(),
        ];
        let reply = match self
            .service
            .with_journal(&sku, self.service.deadline(), || {
                self.service
                    .upstream
                    .eval(&self.service.scripts.release, &keys, &args)
            })
            .await
        {
            // A SKU kept by location: its holds go back to their locations.
            Err(fault) if fault.is_located() => {
                self.service.read_by_location("release", &sku).await?
            }
            other => other?,
        };
        match reply {
            Value::Array(items) => match items[..] {
                [Value::Int(released), Value::Int(next_at), ..] => {
                    if released > 0 {
                        self.service
                            .books
                            .metrics
                            .record_holds(HoldEvent::Expired, released as u64);
                    }
                    Ok(next_at)
                }
                _ => Err(bad_reply("release", &items)),
            },
            other => Err(bad_reply("release", &other)),
        }
    }
}

/// The shard numbers in a lease reply.
fn active_shards(items: &[Value]) -> Vec<usize> {
    items
        .iter()
        .filter_map(|v| match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        })
        .filter(|k| *k < SWEEP_SHARDS)
        .collect()
}

/// The index's `{now, sku, mark, ...}`, as (sku, mark) pairs.
fn due_skus(listed: Value) -> Result<Vec<Due>, UpstreamError> {
    listed_pairs("due_sweep", &listed)
}

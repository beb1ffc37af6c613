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
//!   [`HINT_EVERY`] per shard from each stockgate), and the leader sweeps
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
use crate::error::UpstreamError;
use crate::keys::KeyLayout;
use crate::keys::{SWEEP_SHARDS, SweepShard};
use crate::outcome::HoldEvent;
use crate::params::Sku;
use crate::script::Scripts;
use crate::upstream::Upstream;
use futures_util::stream::{self, StreamExt};
use redis::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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
/// How long a shard stays swept after the end of the holds placed in it.
const ACTIVE_MARGIN: Duration = Duration::from_secs(60);
/// How often one stockgate tells the leader of a shard, at most.
pub const HINT_EVERY: Duration = Duration::from_secs(10);
/// SKUs one index call lists, and index calls one shard gets per pass: a
/// pass releases at most `LIST * ROUNDS * RELEASE_BOUND` holds per shard
/// (lua/common.lua), and a bigger backlog waits for the next pass.
const LIST: usize = 64;
const ROUNDS: usize = 16;
/// Release calls one shard has in flight at once.
const RELEASES_IN_FLIGHT: usize = 16;

/// The shards this stockgate placed holds in, each with until when (by
/// its own clock: a schedule, never an expiry) it sweeps it, and until when
/// it told the leader so.
#[derive(Default)]
pub(super) struct Hints {
    shards: Mutex<[Shard; SWEEP_SHARDS]>,
    /// Marks that did not reach Redis, sent again at the next pass.
    retries: Mutex<Vec<Mark>>,
}

/// One mark of a held SKU in the sweep index (`lua/due_mark.lua`).
#[derive(Debug, Clone)]
pub(super) struct Mark {
    sku: Vec<u8>,
    /// The hold's expiry as its HOLD answered it; `None` before it did.
    expires_at: Option<i64>,
    /// The hold's ttl, when its expiry is not known yet.
    ttl_ms: u64,
}

/// Marks kept for another try at most: past that, the oldest are let go
/// (their units still come back with the next call on their SKU).
const RETRIES_KEPT: usize = 4096;

/// Sends one mark.
async fn deliver_mark(
    upstream: &crate::upstream::Upstream,
    scripts: &crate::script::Scripts,
    keys: &crate::keys::KeyLayout,
    mark: &Mark,
) -> Result<(), UpstreamError> {
    let Ok(sku) = Sku::parse(bytes::Bytes::copy_from_slice(&mark.sku)) else {
        return Ok(());
    };
    let shard = &keys.sweep_shards()[keys.sweep_shard_index(&sku)];
    let at = mark.expires_at.map(|at| at.to_string()).unwrap_or_default();
    let ttl = mark.ttl_ms.to_string();
    // Through the shard's node pipe: every HOLD sends one or two of these,
    // and the redis crate's general path costs ~20 µs of CPU each.
    upstream
        .eval_piped(
            &scripts.due_mark,
            &[&shard.due, &shard.marks],
            &[&mark.sku, at.as_bytes(), ttl.as_bytes()],
            tokio::time::Instant::now() + upstream.timeout(),
        )
        .await
        .map(drop)
}

#[derive(Default, Clone, Copy)]
struct Shard {
    sweep_until: Option<Instant>,
    told_until: Option<Instant>,
}

impl Hints {
    /// A hold of `ttl` placed in `shard`: swept here until it ends and a
    /// minute more. Returns whether the leader needs telling: it was not
    /// told of the shard lately, or not for this long.
    fn placed(&self, shard: usize, ttl: Duration) -> bool {
        let now = Instant::now();
        let until = now + ttl + ACTIVE_MARGIN;
        let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        let entry = &mut shards[shard];
        entry.sweep_until = Some(entry.sweep_until.map_or(until, |u| u.max(until)));
        match entry.told_until {
            Some(told) if told + HINT_EVERY >= until => false,
            _ => {
                entry.told_until = Some(until);
                true
            }
        }
    }

    /// Forgets a hint that did not reach Redis, so the next HOLD sends it.
    fn forget(&self, shard: usize) {
        self.shards.lock().unwrap_or_else(|e| e.into_inner())[shard].told_until = None;
    }

    /// Keeps a mark that failed for the next pass.
    fn retry(&self, mark: Mark) {
        let mut retries = self.retries.lock().unwrap_or_else(|e| e.into_inner());
        if retries.len() >= RETRIES_KEPT {
            retries.remove(0);
            tracing::warn!(
                "too many sweep marks failed; letting the oldest go (its units come back with the next call on its sku)"
            );
        }
        retries.push(mark);
    }

    fn take_retries(&self) -> Vec<Mark> {
        std::mem::take(&mut *self.retries.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The shards to sweep for this stockgate's own holds, now.
    fn own(&self) -> Vec<usize> {
        let now = Instant::now();
        let shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        (0..SWEEP_SHARDS)
            .filter(|k| shards[*k].sweep_until.is_some_and(|u| u > now))
            .collect()
    }
}

/// What the stock service's calls tell the sweep index: the SKUs they
/// placed holds on, and the shards to watch.
pub(super) struct Sweeper {
    upstream: Arc<Upstream>,
    scripts: Scripts,
    keys: KeyLayout,
    /// What this stockgate told the sweep leader lately.
    hints: Arc<Hints>,
}

impl Sweeper {
    pub(super) fn new(upstream: Arc<Upstream>, scripts: Scripts, keys: KeyLayout) -> Sweeper {
        Sweeper {
            upstream,
            scripts,
            keys,
            hints: Arc::default(),
        }
    }

    /// Files a HOLD's SKU in the sweep index by the hold's ttl (and, when
    /// due, tells the leader its shard is active), beside the HOLD itself:
    /// so the hold is found even if this stockgate dies before the HOLD
    /// answers. [`Sweeper::mark_held`] then files it by the hold's own
    /// expiry. Not awaited; a mark that fails is tried again at the next
    /// pass ([`Hints::retry`]).
    pub(super) fn mark_for_sweep(&self, sku: &Sku, ttl: Duration) {
        self.watch_shard(self.keys.sweep_shard_index(sku), ttl);
        self.send_mark(Mark {
            sku: sku.as_bytes().to_vec(),
            expires_at: None,
            ttl_ms: ttl.as_millis() as u64,
        });
    }

    /// Something to look at in shard `index` within `ttl` (a hold's
    /// expiry, an order's recovery): this stockgate sweeps the shard until
    /// then and a minute more, and tells the sweep leader of it when it was
    /// not told lately (`lua/sweep_active.lua`). Not awaited.
    pub(super) fn watch_shard(&self, index: usize, ttl: Duration) {
        if !self.hints.placed(index, ttl) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let ms = (ttl + ACTIVE_MARGIN).as_millis().to_string();
        let upstream = self.upstream.clone();
        let scripts = self.scripts.clone();
        let active = self.keys.sweep_active();
        let hints = self.hints.clone();
        runtime.spawn(async move {
            let number = index.to_string();
            if let Err(fault) = upstream
                .eval(
                    &scripts.sweep_active,
                    &[&active],
                    &[number.as_bytes(), ms.as_bytes()],
                )
                .await
            {
                hints.forget(index);
                tracing::warn!(error = %fault, "could not tell the sweep leader of a shard to watch");
            }
        });
    }

    /// Files a held SKU in the sweep index by the expiry a HOLD (or an
    /// order's line hold) answered with: after the HOLD, so the index is
    /// exact however the sweeper's passes and the HOLD interleaved
    /// (`lua/due_mark.lua`).
    pub(super) fn mark_held(&self, sku: &Sku, expires_at: i64) {
        if expires_at <= 0 {
            return;
        }
        self.send_mark(Mark {
            sku: sku.as_bytes().to_vec(),
            expires_at: Some(expires_at),
            ttl_ms: 0,
        });
    }

    /// Sends a mark, not awaited; a failure keeps it for the next pass.
    fn send_mark(&self, mark: Mark) {
        // A request served outside a runtime (the fuzz harness's, without
        // a Redis) has nothing to mark.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let upstream = self.upstream.clone();
        let scripts = self.scripts.clone();
        let keys = self.keys.clone();
        let hints = self.hints.clone();
        runtime.spawn(async move {
            if let Err(fault) = deliver_mark(&upstream, &scripts, &keys, &mark).await {
                tracing::debug!(error = %fault, "could not mark a held sku in the sweep index; trying again at the next pass");
                hints.retry(mark);
            }
        });
    }

    /// The marks that failed, sent again; those that fail again wait for
    /// the next pass.
    async fn resend_marks(&self) {
        for mark in self.hints.take_retries() {
            if deliver_mark(&self.upstream, &self.scripts, &self.keys, &mark)
                .await
                .is_err()
            {
                self.hints.retry(mark);
            }
        }
    }
}

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
            let mut shards = self.service.sweeper.hints.own();
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
            let holds = if self.service.settings.sweep_holds {
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
        let reply = self
            .service
            .with_journal(&sku, self.service.deadline(), || {
                self.service
                    .upstream
                    .eval(&self.service.scripts.release, &keys, &args)
            })
            .await?;
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

/// A name an index lists as due, and what it was filed with: a SKU and
/// its mark (so that filing it again does not undo a newer mark), an
/// order and its filing's score.
pub(super) type Due = (Vec<u8>, Vec<u8>);

/// The index's `{now, sku, mark, ...}`, as (sku, mark) pairs.
fn due_skus(listed: Value) -> Result<Vec<Due>, UpstreamError> {
    listed_pairs("due_sweep", &listed)
}

/// What an index script lists, `{now, name, tag, name, tag, ...}`, as
/// (name, tag) pairs: the sweep index's SKUs and marks, the orders in
/// flight and their filings.
pub(super) fn listed_pairs(script: &str, listed: &Value) -> Result<Vec<Due>, UpstreamError> {
    let Value::Array(items) = listed else {
        return Err(bad_reply(script, listed));
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        _ => None,
    };
    items[1.min(items.len())..]
        .chunks(2)
        .map(|pair| match pair {
            [name, tag] => Some((text(name)?, text(tag)?)),
            _ => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad_reply(script, items))
}

pub(super) fn bad_reply(script: &str, what: &impl std::fmt::Debug) -> UpstreamError {
    let mut shown = format!("{what:?}");
    shown.truncate(200);
    UpstreamError::new(
        crate::error::FaultKind::BadReply,
        format!("{script} answered {shown}"),
    )
}

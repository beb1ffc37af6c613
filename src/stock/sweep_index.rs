//! The sweep index, as the stock service's calls write it: every HOLD
//! files its SKU there (by its ttl beside the HOLD, then by the hold's own
//! expiry), and tells the sweep leader its shard is active; an order
//! command's shard is watched the same way ([`super::order`]). The passes
//! that read the index are [`super::sweeper`]'s.

use crate::error::UpstreamError;
use crate::keys::{KeyLayout, SWEEP_SHARDS};
use crate::params::Sku;
use crate::script::Scripts;
use crate::upstream::Upstream;
use redis::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a shard stays swept after the end of the holds placed in it.
const ACTIVE_MARGIN: Duration = Duration::from_secs(60);
/// How often one stockgate tells the leader of a shard, at most.
pub const HINT_EVERY: Duration = Duration::from_secs(10);

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
    due_mark: &crate::script::LuaScript,
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
            due_mark,
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
pub(super) struct SweepIndex {
    /// Whether holds are filed at all: only when the sweeper sweeps them
    /// (`--sweeper`); one rule for every call that places or moves a hold.
    holds: bool,
    upstream: Arc<Upstream>,
    scripts: Scripts,
    keys: KeyLayout,
    /// What this stockgate told the sweep leader lately.
    hints: Arc<Hints>,
}

impl SweepIndex {
    pub(super) fn new(
        holds: bool,
        upstream: Arc<Upstream>,
        scripts: Scripts,
        keys: KeyLayout,
    ) -> SweepIndex {
        SweepIndex {
            holds,
            upstream,
            scripts,
            keys,
            hints: Arc::default(),
        }
    }

    /// Files a HOLD's SKU in the sweep index by the hold's ttl (and, when
    /// due, tells the leader its shard is active), beside the HOLD itself:
    /// so the hold is found even if this stockgate dies before the HOLD
    /// answers. [`SweepIndex::mark_held`] then files it by the hold's own
    /// expiry. Not awaited; a mark that fails is tried again at the next
    /// pass ([`Hints::retry`]).
    pub(super) fn mark_for_sweep(&self, sku: &Sku, ttl: Duration) {
        if !self.holds {
            return;
        }
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
        let sweep_active = self.scripts.sweep_active.clone();
        let active = self.keys.sweep_active();
        let hints = self.hints.clone();
        runtime.spawn(async move {
            let number = index.to_string();
            if let Err(fault) = upstream
                .eval(
                    &sweep_active,
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
        if expires_at <= 0 || !self.holds {
            return;
        }
        self.send_mark(Mark {
            sku: sku.as_bytes().to_vec(),
            expires_at: Some(expires_at),
            ttl_ms: 0,
        });
    }

    /// Whether the sweeper gives expired holds back (`--sweeper`; its
    /// passes always recover the orders left behind).
    pub(super) fn sweeps_holds(&self) -> bool {
        self.holds
    }

    /// An extended hold's SKU, filed again: this stockgate (and the sweep
    /// leader) watch its shard until the new expiry and a minute more, and
    /// the SKU is marked by the new expiry. The index may keep an earlier
    /// time for it (a mark only lowers it): the sweeper then looks early,
    /// finds nothing due, and files the SKU under its earliest hold, the
    /// new expiry.
    pub(super) fn mark_extended(&self, sku: &Sku, ttl: Duration, expires_at: i64) {
        if !self.holds {
            return;
        }
        self.watch_shard(self.keys.sweep_shard_index(sku), ttl);
        self.mark_held(sku, expires_at);
    }

    /// Sends a mark, not awaited; a failure keeps it for the next pass.
    fn send_mark(&self, mark: Mark) {
        // A request served outside a runtime (the fuzz harness's, without
        // a Redis) has nothing to mark.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let upstream = self.upstream.clone();
        let due_mark = self.scripts.due_mark.clone();
        let keys = self.keys.clone();
        let hints = self.hints.clone();
        runtime.spawn(async move {
            if let Err(fault) = deliver_mark(&upstream, &due_mark, &keys, &mark).await {
                tracing::debug!(error = %fault, "could not mark a held sku in the sweep index; trying again at the next pass");
                hints.retry(mark);
            }
        });
    }

    /// The shards this stockgate placed holds in lately, to sweep.
    pub(super) fn own_shards(&self) -> Vec<usize> {
        self.hints.own()
    }

    /// The marks that failed, sent again; those that fail again wait for
    /// the next pass.
    pub(super) async fn resend_marks(&self) {
        for mark in self.hints.take_retries() {
            if deliver_mark(&self.upstream, &self.scripts.due_mark, &self.keys, &mark)
                .await
                .is_err()
            {
                self.hints.retry(mark);
            }
        }
    }
}

/// A name an index lists as due, and what it was filed with: a SKU and
/// its mark (so that filing it again does not undo a newer mark), an
/// order and its filing's score.
pub(super) type Due = (Vec<u8>, Vec<u8>);

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

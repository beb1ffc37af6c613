//! `stockgate journal sink`: moves journal entries into PostgreSQL,
//! exactly once, and trims from Redis what the database holds.
//!
//! # A round
//!
//! For each sweep shard this sink owns, it reads the shard's set of SKUs
//! with a journal, which of them hold entries (their lengths, many at a
//! time), and from each of those up to `--batch` entries, 64 SKUs at a
//! time (with `--wait-replicas`, only once that many replicas confirmed
//! them). The entries of a shard gather into batches of at most `--batch`;
//! each batch is one transaction ([`Books::commit`]), and only after its
//! commit are the journals trimmed up to the last id moved.
//!
//! # Exactly once, whatever is killed when
//!
//! - The database's key is the entry's (sku, stream id), so a batch sent
//!   again after a crash between commit and trim changes nothing.
//! - A sink killed mid-transaction, or a PostgreSQL restarting under it,
//!   leaves no row (the transaction rolls back) and no trim: the next
//!   round, here or in another sink, reads the same entries again.
//! - A trim never precedes its commit, so Redis never drops an entry the
//!   database lacks.
//! - A failover that lost entries the sink had already moved (possible
//!   only without `--wait-replicas`) lets Redis give their ids again to
//!   new changes: those are kept in `stockgate_journal_conflicts` and
//!   counted, never dropped.
//!
//! # Several sinks
//!
//! Each sweep shard is a PostgreSQL session advisory lock on the sink's one
//! connection; a sink moves only the shards it holds, and holds at most
//! its share (16 / the sinks connected, rounded up, counted by a shared
//! lock each sink holds), giving back any above it between batches. So
//! sinks never contend for a journal, a new sink gets shards within a round,
//! and a dead sink's locks go with its connection. The locks are not what
//! makes a write once (the key is): two sinks on one shard for a moment
//! (one's connection broke while its batch still ran) only waste work.

use super::database::{Books, Committed, SkuEntry};
use super::fault::JournalFault;
use super::stream;
use crate::config::Durability;
use crate::keys::KeyLayout;
use crate::metrics::JournalMetrics;
use crate::upstream::Upstream;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// What the sink needs, checked.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    pub database: super::database::Target,
    pub batch: usize,
    pub poll: Duration,
    pub durability: Option<Durability>,
}

/// The longest pause between reconnects to PostgreSQL.
const MOST_BACKOFF: Duration = Duration::from_secs(5);

pub struct Sink {
    config: SinkConfig,
    keys: KeyLayout,
    upstream: Arc<Upstream>,
    metrics: Arc<JournalMetrics>,
    books: Option<Books>,
    /// The shards whose locks this sink's connection holds.
    owned: Vec<usize>,
}

/// What one round found.
#[derive(Debug, Default, Clone)]
struct Round {
    committed: Committed,
    /// Entries in the owned journals when the round read them.
    backlog: u64,
    /// Redis time (ms) of the oldest entry read, if any.
    oldest_ms: Option<u64>,
    /// A Redis fault that stopped some shards; the others went on.
    redis_fault: Option<JournalFault>,
}

impl Sink {
    pub fn new(
        config: SinkConfig,
        keys: KeyLayout,
        upstream: Arc<Upstream>,
        metrics: Arc<JournalMetrics>,
    ) -> Sink {
        Sink {
            config,
            keys,
            upstream,
            metrics,
            books: None,
            owned: Vec::new(),
        }
    }

    /// Connects and applies the schema: a failure here is the operator's
    /// to see at once (a wrong URL, no permission), not to retry forever.
    pub async fn start(&mut self) -> Result<(), JournalFault> {
        self.books().await?;
        let marked = stream::mark_listed(&self.upstream, &self.keys).await?;
        tracing::debug!(marked, "every listed journal has its marker");
        Ok(())
    }

    /// Rounds until one finds nothing left to move, then stops: `stockgate
    /// journal sink --drain` (a walkthrough, a catch-up before a
    /// cut-over). Any fault ends it: the entries it moved stay moved, the
    /// rest stay in Redis. The entries it moved.
    pub async fn drain(mut self) -> Result<u64, JournalFault> {
        let mut moved = 0;
        loop {
            let round = self.round().await?;
            if let Some(fault) = round.redis_fault {
                return Err(fault);
            }
            let Committed {
                moved: new,
                already,
                conflicts,
            } = round.committed;
            moved += new;
            if new + already + conflicts == 0 {
                return Ok(moved);
            }
        }
    }

    /// Rounds until `stop`, reconnecting after any fault. A round cut by
    /// `stop` mid-transaction rolls back; nothing was trimmed for it.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        // When the last round that read every owned shard ended, and the
        // lag it saw: while rounds fail or leave shards unread (the
        // database down, a node down), the lag reported keeps growing from
        // it, so the lag alert fires on an outage as on a slow sink.
        let mut whole = (Instant::now(), Duration::ZERO);
        let since_whole = |whole: (Instant, Duration)| whole.1 + whole.0.elapsed();
        loop {
            let round = tokio::select! {
                _ = stop.cancelled() => return,
                round = self.round() => round,
            };
            let pause = match round {
                Ok(round) => {
                    let lag = age(round.oldest_ms);
                    if round.redis_fault.is_none() {
                        whole = (Instant::now(), lag);
                        self.metrics.set_lag(round.backlog, lag);
                    } else {
                        self.metrics
                            .set_lag(round.backlog, lag.max(since_whole(whole)));
                    }
                    if let Some(fault) = round.redis_fault {
                        // Some shards could not be read: what the others
                        // moved counts, and the pause backs off as after
                        // any fault.
                        self.metrics.record_fault(fault.origin);
                        tracing::warn!(%fault, "journal sink: some shards could not be read; trying again");
                        let pause = backoff;
                        backoff = (backoff * 2).min(MOST_BACKOFF);
                        pause
                    } else {
                        backoff = Duration::from_millis(100);
                        if round.committed.moved + round.committed.already > 0 {
                            Duration::ZERO
                        } else {
                            self.config.poll
                        }
                    }
                }
                Err(fault) => {
                    self.metrics.record_fault(fault.origin);
                    self.metrics.set_lag_seconds(since_whole(whole));
                    tracing::warn!(%fault, retry_safe = fault.retry_safe, "journal sink round failed; trying again");
                    if self.books.as_ref().is_none_or(Books::is_closed)
                        || fault.origin == crate::metrics::JournalSource::Database
                    {
                        // Start afresh: the locks went with the connection,
                        // or a failed statement left it in doubt.
                        self.books = None;
                        self.owned.clear();
                        self.metrics.set_shards(0);
                    }
                    let pause = backoff;
                    backoff = (backoff * 2).min(MOST_BACKOFF);
                    pause
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }

    /// The database connection, made (and the schema applied, and this
    /// sink counted among the sinks) when there is none.
    async fn books(&mut self) -> Result<&mut Books, JournalFault> {
        if self.books.as_ref().is_none_or(Books::is_closed) {
            self.owned.clear();
            let mut books = Books::connect(&self.config.database).await?;
            let tls = books.tls_in_use().await?;
            tracing::info!(
                database = self.config.database.shown(),
                tls = tls.as_deref().unwrap_or("none"),
                "connected to the books' database"
            );
            books.migrate().await?;
            books.join_sinks().await?;
            self.books = Some(books);
        }
        Ok(self.books.as_mut().expect("connected above"))
    }

    /// Takes free shards up to this sink's share, gives back any above it.
    async fn balance(&mut self) -> Result<(), JournalFault> {
        let shards = self.keys.sweep_shards().len();
        self.books().await?;
        let mut owned = std::mem::take(&mut self.owned);
        let before = owned.clone();
        let books = self.books.as_mut().expect("connected above");
        let sinks = books.sinks().await?;
        let share = shards.div_ceil(sinks);
        while owned.len() > share {
            let shard = owned.pop().expect("more than the share");
            books.release(shard).await?;
        }
        for shard in 0..shards {
            if owned.len() >= share {
                break;
            }
            if !owned.contains(&shard) && books.claim(shard).await? {
                owned.push(shard);
            }
        }
        owned.sort_unstable();
        if owned != before {
            tracing::info!(?owned, sinks, share, "journal shards this sink moves");
        }
        self.owned = owned;
        self.metrics.set_shards(self.owned.len());
        Ok(())
    }

    /// One pass over the owned shards. A Redis fault stops only its own
    /// shard: a shard's set and its SKUs' journals all live in the shard's
    /// slots, on one node, so a node that is down or failing over holds
    /// back its shards and not the others'. A database fault stops the
    /// round (its connection is in doubt).
    async fn round(&mut self) -> Result<Round, JournalFault> {
        self.balance().await?;
        let mut round = Round::default();
        for shard in self.owned.clone() {
            match self.shard(shard, &mut round).await {
                Ok(()) => {}
                Err(fault) if fault.origin == crate::metrics::JournalSource::Redis => {
                    tracing::debug!(%fault, shard, "journal shard left for the next round");
                    round.redis_fault.get_or_insert(fault);
                }
                Err(fault) => return Err(fault),
            }
        }
        Ok(round)
    }

    /// Moves what the journals of one shard hold. Each SKU's first read
    /// (and its replication check) goes out [`READS_IN_FLIGHT`] at a time,
    /// ahead of the batches: most journals hold a few entries, and one
    /// read each in turn would cost a round trip per SKU. What a SKU holds
    /// past its first read (a hot SKU) is read in turn, batch by batch.
    async fn shard(&mut self, shard: usize, round: &mut Round) -> Result<(), JournalFault> {
        use futures_util::stream::{self as futures_stream, StreamExt};
        let set = self.keys.sweep_shards()[shard].journals.clone();
        let mut batch: Vec<SkuEntry> = Vec::new();
        let listed = stream::listed(&self.upstream, &set).await?;
        let holding = stream::holding(&self.upstream, &self.keys, listed).await?;
        let (upstream, keys) = (self.upstream.clone(), self.keys.clone());
        let (count, durability) = (self.config.batch, self.config.durability);
        let mut firsts = futures_stream::iter(holding)
            .map(|name| {
                let (upstream, keys) = (upstream.clone(), keys.clone());
                async move {
                    let first = first_read(&upstream, &keys, &name, count, durability).await;
                    (name, first)
                }
            })
            .buffered(READS_IN_FLIGHT);
        while let Some((name, first)) = firsts.next().await {
            match self.sku(&name, first, &mut batch, round).await {
                Ok(()) => {}
                // An entry nobody can read stops its own SKU only (its
                // journal stays, untrimmed from there, for a human); the
                // others move on.
                Err(fault) if fault.origin == crate::metrics::JournalSource::Data => {
                    self.metrics.record_fault(fault.origin);
                    tracing::error!(%fault, sku = name, "journal left in Redis: an entry cannot be read");
                }
                Err(fault) => return Err(fault),
            }
        }
        self.flush(&mut batch, round).await
    }

    /// Gathers one SKU's journal into `batch` from its first read, reading
    /// on while a read comes back full, and flushing each full batch (a
    /// SKU's entries may span two: each trims up to what it moved).
    async fn sku(
        &mut self,
        name: &str,
        first: Result<FirstRead, JournalFault>,
        batch: &mut Vec<SkuEntry>,
        round: &mut Round,
    ) -> Result<(), JournalFault> {
        let FirstRead {
            sku,
            mut read,
            mut replicated,
        } = first?;
        round.backlog += read.length;
        loop {
            let unreadable = read.unreadable.take();
            let Some(last) = read.entries.last().map(|e| e.at) else {
                match unreadable {
                    Some(fault) => return Err(fault),
                    None => break,
                }
            };
            if !replicated {
                // Not on enough replicas yet: a failover now could lose
                // them. Left for a later round.
                self.metrics.record_unreplicated();
                break;
            }
            let first_ms = read.entries[0].at.0;
            round.oldest_ms = Some(round.oldest_ms.map_or(first_ms, |o| o.min(first_ms)));
            let full = read.entries.len() >= self.config.batch;
            for entry in read.entries {
                batch.push(SkuEntry {
                    sku: name.to_owned(),
                    entry,
                });
                if batch.len() >= self.config.batch {
                    self.flush(batch, round).await?;
                }
            }
            if let Some(fault) = unreadable {
                // What came before it moves with the batch; its SKU
                // stops at it.
                return Err(fault);
            }
            if !full {
                break;
            }
            (read, replicated) = read_checked(
                &self.upstream,
                &self.keys,
                &sku,
                Some(last),
                self.config.batch,
                self.config.durability,
            )
            .await?;
        }
        Ok(())
    }

    /// Commits `batch`, then trims each journal up to its last id moved.
    async fn flush(
        &mut self,
        batch: &mut Vec<SkuEntry>,
        round: &mut Round,
    ) -> Result<(), JournalFault> {
        if batch.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let committed = self.books().await?.commit(batch).await?;
        // Committed: from here on the database holds every entry of the
        // batch (or a conflict row for it), so Redis may let them go.
        let mut last: Vec<(String, (u64, u64))> = Vec::new();
        for item in batch.iter() {
            match last.last_mut() {
                Some((sku, at)) if *sku == item.sku => *at = item.entry.at,
                _ => last.push((item.sku.clone(), item.entry.at)),
            }
        }
        // The trims, READS_IN_FLIGHT at a time (a batch of one-entry
        // journals is a trim per SKU).
        {
            use futures_util::stream::{self as futures_stream, StreamExt, TryStreamExt};
            let (upstream, keys) = (&self.upstream, &self.keys);
            futures_stream::iter(last)
                .map(|(name, at)| async move {
                    stream::trim(upstream, keys, &stream::sku(&name)?, at).await
                })
                .buffer_unordered(READS_IN_FLIGHT)
                .try_collect::<()>()
                .await?;
        }
        self.metrics
            .record_batch(committed.moved, started.elapsed());
        if committed.conflicts > 0 {
            self.metrics.record_conflicts(committed.conflicts);
        }
        tracing::debug!(
            entries = batch.len(),
            moved = committed.moved,
            already = committed.already,
            conflicts = committed.conflicts,
            elapsed = ?started.elapsed(),
            "batch committed and trimmed"
        );
        round.committed.moved += committed.moved;
        round.committed.already += committed.already;
        round.committed.conflicts += committed.conflicts;
        batch.clear();
        Ok(())
    }
}

/// SKUs whose first read (and trim) are in flight at once.
const READS_IN_FLIGHT: usize = 64;

/// A SKU's first read in a round, and whether its entries are on enough
/// replicas (always, without `--wait-replicas`).
struct FirstRead {
    sku: crate::params::Sku,
    read: stream::Read,
    replicated: bool,
}

/// The first read of the journal of `name` ([`read_checked`] from its
/// start).
async fn first_read(
    upstream: &Upstream,
    keys: &KeyLayout,
    name: &str,
    count: usize,
    durability: Option<Durability>,
) -> Result<FirstRead, JournalFault> {
    let sku = stream::sku(name)?;
    let (read, replicated) = read_checked(upstream, keys, &sku, None, count, durability).await?;
    Ok(FirstRead {
        sku,
        read,
        replicated,
    })
}

/// Reads up to `count` entries of `sku`'s journal after `after`, then,
/// with `durability`, asks whether they are on its replicas (true
/// without).
async fn read_checked(
    upstream: &Upstream,
    keys: &KeyLayout,
    sku: &crate::params::Sku,
    after: Option<(u64, u64)>,
    count: usize,
    durability: Option<Durability>,
) -> Result<(stream::Read, bool), JournalFault> {
    let read = stream::read(upstream, keys, sku, after, count).await?;
    let replicated = match (durability, read.entries.last()) {
        (Some(durability), Some(entry)) => {
            stream::replicated(upstream, keys, sku, entry.at, durability).await?
        }
        _ => true,
    };
    Ok((read, replicated))
}

/// How old an entry of Redis time `ms` is by this host's clock (0 when
/// none, or when the clocks disagree the other way).
fn age(ms: Option<u64>) -> Duration {
    let Some(ms) = ms else {
        return Duration::ZERO;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    Duration::from_millis(now.saturating_sub(ms))
}

/// The sink's admin port: `/metrics`, `/healthz`.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    metrics: Arc<JournalMetrics>,
    stop: CancellationToken,
) {
    use axum::Router;
    use axum::http::header;
    use axum::routing::get;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    metrics.run_upkeep();
                    (
                        [(
                            header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        metrics.render(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(%err, "sink admin server stopped");
    }
}

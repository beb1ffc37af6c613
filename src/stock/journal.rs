//! The journal's side of the stock service (issue 26): what a call does
//! when its SKU has no journal yet.
//!
//! Every script that changes a SKU's stock appends an entry to the SKU's
//! journal in the same call when the SKU has one, whatever `--journal`
//! ([`crate::journal`] owns the entry's shape). With `--journal` it
//! refuses with NOJOURNAL, having changed nothing, when the journal does
//! not exist (DEDUCT, the hot path, only when it would change the SKU: see
//! lua/deduct.lua). The sink finds journals through
//! each sweep shard's set of the SKUs that have one, so a journal must be listed
//! before its stream exists: [`StockService::open_journal`] lists the SKU,
//! then makes the stream, each a call of its own (the set lives in another
//! slot), and the refused call goes again. A SKU pays this once, on its
//! first call with the journal on.

use super::StockService;
use crate::error::{FaultKind, UpstreamError};
use crate::keys::KeyLayout;
use crate::params::Sku;
use crate::script::Scripts;
use crate::upstream::Upstream;
use std::future::Future;

impl StockService {
    /// The deadline of a call that has none of its own: one `--timeout`.
    pub(super) fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.upstream.timeout()
    }

    /// Runs `call`, and once more after opening the SKU's journal if it was
    /// refused for want of one.
    pub(super) async fn with_journal<T, F, Fut>(
        &self,
        sku: &Sku,
        deadline: tokio::time::Instant,
        call: F,
    ) -> Result<T, UpstreamError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        match call().await {
            Err(fault) if fault.kind == FaultKind::NoJournal => {
                self.open_journal(sku, deadline).await?;
                call().await
            }
            other => other,
        }
    }

    /// Opens `sku`'s journal ([`open`]) and counts it.
    pub(super) async fn open_journal(
        &self,
        sku: &Sku,
        deadline: tokio::time::Instant,
    ) -> Result<(), UpstreamError> {
        open(&self.upstream, &self.scripts, &self.keys, sku, deadline).await?;
        self.metrics.record_journal_opened();
        Ok(())
    }
}

/// Lists `sku` in its shard's set of journals, then makes its journal
/// (`lua/journal_open.lua`); both idempotent, so racing stockgates and a
/// retry after a crash between the two are harmless. For the stock service
/// and for `stockgate stock import --journal true` ([`crate::bulk`]).
pub async fn open(
    upstream: &Upstream,
    scripts: &Scripts,
    keys: &KeyLayout,
    sku: &Sku,
    deadline: tokio::time::Instant,
) -> Result<(), UpstreamError> {
    let shard = &keys.sweep_shards()[keys.sweep_shard_index(sku)];
    upstream
        .eval_piped(
            &scripts.journal_open,
            &[&shard.journals],
            &[b"list", sku.as_bytes()],
            deadline,
        )
        .await?;
    upstream
        .eval_piped(
            &scripts.journal_open,
            &[&keys.journal_key(sku)],
            &[b"make"],
            deadline,
        )
        .await?;
    Ok(())
}

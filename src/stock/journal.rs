//! The journal's side of the stock service: what a call does when its SKU
//! has no journal yet.
//!
//! Every script that changes a SKU's stock appends an entry to the SKU's
//! journal in the same call when the SKU has one, whatever `--journal`
//! ([`crate::journal`] owns the entry's shape). With `--journal` it
//! refuses with NOJOURNAL, having changed nothing, when the journal does
//! not exist (DEDUCT, the hot path, only when it would change the SKU: see
//! lua/deduct.lua). The sink finds journals through
//! each sweep shard's set of the SKUs that have one, so a journal must be listed
//! before its stream exists: [`open`] lists the SKU, then makes the
//! stream, each a call of its own (the set lives in another slot), and the
//! refused call goes again ([`super::StockService::with_journal`]). A SKU
//! pays this once, on its first call with the journal on.

use crate::error::UpstreamError;
use crate::keys::KeyLayout;
use crate::params::Sku;
use crate::script::Scripts;
use crate::upstream::Upstream;

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

//! `stockgate journal retire`: the journals taken back, once the books are
//! no longer kept.
//!
//! Every call on a SKU that has a journal appends to it, whatever the
//! sidecar's `--journal` (`lua/common.lua`, `journal_of`), so turning the
//! flag off everywhere does not stop the entries: the journals go on
//! growing until something deletes them. Retiring a SKU's journal deletes
//! its stream only when it holds no entry (`lua/journal_open.lua`'s
//! `retire`, one atomic call: an entry appended before it stays, with its
//! stream, for the sink), then takes the SKU off its shard's set of
//! journals: the opening's two steps taken back in the other order. A
//! journal that still holds entries is left as it is and reported; run
//! the sink's drain and retire again. Run it only once no sidecar has the
//! journal on, which would open the journal again at its next change
//! (docs/books.md, Turning the journal off).

use super::fault::JournalFault;
use super::stream;
use crate::keys::KeyLayout;
use crate::script::Scripts;
use crate::upstream::Upstream;
use redis::Value;

/// What a retire did.
#[derive(Debug, Default)]
pub struct Retired {
    /// SKUs whose journal is gone, and their listing with it.
    pub retired: Vec<String>,
    /// SKUs whose journal still holds entries the sink has not moved, and
    /// how many.
    pub holding: Vec<(String, i64)>,
}

impl Retired {
    /// One line for the operator.
    pub fn render(&self) -> String {
        let mut out = format!("{} journals retired", self.retired.len());
        if self.holding.is_empty() {
            out.push_str("; none left\n");
        } else {
            out.push_str(&format!(
                "; {} still hold entries not moved yet (run `stockgate journal sink --drain`, then retire again):\n",
                self.holding.len()
            ));
            for (sku, entries) in &self.holding {
                out.push_str(&format!("  {sku}: {entries} entries\n"));
            }
        }
        out
    }
}

/// Retires the journals of `skus`, or of every listed SKU when empty.
pub async fn run(
    upstream: &Upstream,
    keys: &KeyLayout,
    skus: &[String],
) -> Result<Retired, JournalFault> {
    let scripts = Scripts::new();
    let names = if skus.is_empty() {
        stream::all_listed(upstream, keys).await?
    } else {
        skus.to_vec()
    };
    let mut done = Retired::default();
    for name in names {
        let sku = stream::sku(&name)?;
        let deadline = tokio::time::Instant::now() + upstream.timeout();
        let reply = upstream
            .eval_piped(
                &scripts.journal_open,
                &[&keys.journal_key(&sku)],
                &[b"retire"],
                deadline,
            )
            .await
            .map_err(JournalFault::redis)?;
        match reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(0)] => {}
                [Value::Int(1), Value::Int(entries)] => {
                    done.holding.push((name, *entries));
                    continue;
                }
                other => {
                    return Err(JournalFault::bad_reply(format!(
                        "retire answered {other:?}"
                    )));
                }
            },
            other => {
                return Err(JournalFault::bad_reply(format!(
                    "retire answered {other:?}"
                )));
            }
        }
        let shard = &keys.sweep_shards()[keys.sweep_shard_index(&sku)];
        upstream
            .eval_piped(
                &scripts.journal_open,
                &[&shard.journals],
                &[b"unlist", sku.as_bytes()],
                deadline,
            )
            .await
            .map_err(JournalFault::redis)?;
        done.retired.push(name);
    }
    Ok(done)
}

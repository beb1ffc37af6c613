//! `stockgate reconcile`: proves Redis and the database agree, SKU by SKU.
//!
//! For each SKU, one atomic read of its stock, held units and journal
//! ([`stream::snapshot`]), so a change running meanwhile is all in it or
//! not at all; then its account in the database as of the last id that
//! read saw (many SKUs' accounts in one query).
//! The entries of the journal after the newest one the database holds are
//! the ones not moved yet: applied to the account in order, they must
//! give exactly Redis's stock and held units. Entries the database already
//! has (committed, not trimmed yet) are not counted twice.

use super::database::{Account, Books};
use super::fault::JournalFault;
use super::stream::{self, Snapshot};
use super::{Entry, Event};
use crate::keys::KeyLayout;
use crate::upstream::Upstream;

/// How far the database's history of a drifting SKU is searched for
/// entries that don't follow from the one before.
const BREAKS_SHOWN: i64 = 10;

/// What the books say a SKU's state must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub stock: i64,
    pub held: i64,
}

/// The account carried forward by the journal's entries the database does
/// not hold yet (those after `account.last`). None when neither has an
/// entry of the SKU: its stock was never changed through stockgate.
pub fn expected(account: Option<&Account>, journal: &[Entry]) -> Option<Expected> {
    let pending = pending(account, journal);
    let mut state = match (account, pending.first()) {
        (Some(account), _) => Expected {
            stock: account.stock,
            held: account.held,
        },
        // No account yet: the journal's first entry opens it where it
        // found the SKU, as the database will when it has it.
        (None, Some(first)) => Expected {
            stock: first.stock - first.stock_change,
            held: first.held - first.held_change,
        },
        (None, None) => return None,
    };
    for entry in pending {
        if entry.event == Event::Set {
            state = Expected {
                stock: entry.stock,
                held: entry.held,
            };
        } else {
            state.stock += entry.stock_change;
            state.held += entry.held_change;
        }
    }
    Some(state)
}

/// The entries of `journal` the database does not hold yet.
pub fn pending<'a>(account: Option<&Account>, journal: &'a [Entry]) -> &'a [Entry] {
    let held_up_to = account.map(|a| a.last);
    let from = journal
        .iter()
        .position(|entry| held_up_to.is_none_or(|last| entry.at > last))
        .unwrap_or(journal.len());
    &journal[from..]
}

/// One SKU's verdict.
#[derive(Debug, Clone)]
pub enum Verdict {
    Agrees,
    /// No entry anywhere: nothing to compare.
    Unjournaled,
    Drifts(Drift),
    /// Redis or the database could not be read for it.
    Unchecked(JournalFault),
}

#[derive(Debug, Clone)]
pub struct Drift {
    pub redis_stock: Option<i64>,
    pub redis_held: i64,
    pub expected: Option<Expected>,
    pub account: Option<Account>,
    /// The journal's entries not in the database yet.
    pub pending: Vec<Entry>,
    /// The database's entries that don't follow from the one before.
    pub breaks: Vec<Entry>,
}

/// The whole report.
#[derive(Debug, Default)]
pub struct Report {
    pub skus: Vec<(String, Verdict)>,
}

impl Report {
    /// 0: every SKU agrees; 1: some drift (whether or not others could be
    /// checked: a drift found is the news); 2: some could not be checked.
    pub fn exit_code(&self) -> u8 {
        if self
            .skus
            .iter()
            .any(|(_, v)| matches!(v, Verdict::Drifts(_)))
        {
            1
        } else if self
            .skus
            .iter()
            .any(|(_, v)| matches!(v, Verdict::Unchecked(_)))
        {
            2
        } else {
            0
        }
    }
}

/// Checks `only`, or every SKU with a journal in Redis or an account in
/// the database.
pub async fn run(
    upstream: &Upstream,
    keys: &KeyLayout,
    books: &mut Books,
    only: &[String],
) -> Result<Report, JournalFault> {
    let skus = if only.is_empty() {
        let mut all = stream::all_listed(upstream, keys).await?;
        all.extend(books.skus().await?);
        all.sort();
        all.dedup();
        all
    } else {
        only.to_vec()
    };
    let mut report = Report::default();
    for chunk in skus.chunks(CHECKED_AT_ONCE) {
        report
            .skus
            .extend(check(upstream, keys, books, chunk).await);
    }
    Ok(report)
}

/// SKUs checked at once: their Redis reads in flight together on the
/// one multiplexed connection, then their accounts in one query. One at
/// a time, 20,000 SKUs took 18.7 s (docs/performance.md).
const CHECKED_AT_ONCE: usize = 64;

/// Checks `names`: Redis first, then the database as of the last id
/// Redis had given, for each. An entry moved between the two reads is
/// counted once (by its id), and one written after the snapshot, and
/// moved at once, not at all.
async fn check(
    upstream: &Upstream,
    keys: &KeyLayout,
    books: &mut Books,
    names: &[String],
) -> Vec<(String, Verdict)> {
    use futures_util::stream::{self as futures_stream, StreamExt};
    let snapshots: Vec<(String, Result<Snapshot, JournalFault>)> =
        futures_stream::iter(names.iter().cloned())
            .map(|name| async move {
                let snapshot = match stream::sku(&name) {
                    Ok(sku) => stream::snapshot(upstream, keys, &sku).await,
                    Err(fault) => Err(fault),
                };
                (name, snapshot)
            })
            .buffered(CHECKED_AT_ONCE)
            .collect()
            .await;
    let wanted: Vec<(String, Option<(u64, u64)>)> = snapshots
        .iter()
        .filter_map(|(name, snapshot)| Some((name.clone(), snapshot.as_ref().ok()?.last_given)))
        .collect();
    let mut accounts = match books.accounts(&wanted).await {
        Ok(accounts) => accounts,
        Err(fault) => {
            return snapshots
                .into_iter()
                .map(|(name, snapshot)| {
                    let fault = snapshot.err().unwrap_or_else(|| fault.clone());
                    (name, Verdict::Unchecked(fault))
                })
                .collect();
        }
    };
    let mut verdicts = Vec::with_capacity(snapshots.len());
    for (name, snapshot) in snapshots {
        let verdict = match snapshot {
            Ok(snapshot) => {
                // The SKU's own account: a SKU that keeps one number.
                let account = accounts.remove(&name).and_then(|mut by| by.remove(""));
                verdict(books, &name, snapshot, account)
                    .await
                    .unwrap_or_else(Verdict::Unchecked)
            }
            Err(fault) => Verdict::Unchecked(fault),
        };
        verdicts.push((name, verdict));
    }
    verdicts
}

/// One SKU's verdict from its Redis snapshot and its account as of it.
async fn verdict(
    books: &mut Books,
    name: &str,
    snapshot: Snapshot,
    account: Option<Account>,
) -> Result<Verdict, JournalFault> {
    let Snapshot {
        stock,
        held,
        journal,
        last_given: _,
    } = snapshot;
    let Some(expected) = expected(account.as_ref(), &journal) else {
        return Ok(Verdict::Unjournaled);
    };
    if stock == Some(expected.stock) && held == expected.held {
        return Ok(Verdict::Agrees);
    }
    let breaks = if account.is_some() {
        books.breaks(name, "", BREAKS_SHOWN).await?
    } else {
        Vec::new()
    };
    Ok(Verdict::Drifts(Drift {
        redis_stock: stock,
        redis_held: held,
        expected: Some(expected),
        pending: pending(account.as_ref(), &journal).to_vec(),
        account,
        breaks,
    }))
}

/// The report as `stockgate reconcile` prints it.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let (mut agree, mut drift, mut unchecked, mut bare) = (0, 0, 0, 0);
    for (sku, verdict) in &report.skus {
        match verdict {
            Verdict::Agrees => agree += 1,
            Verdict::Unjournaled => {
                bare += 1;
                out.push_str(&format!(
                    "{sku}: no journal entries in Redis or the database; nothing to compare\n"
                ));
            }
            Verdict::Unchecked(fault) => {
                unchecked += 1;
                out.push_str(&format!("{sku}: could not check: {fault}\n"));
            }
            Verdict::Drifts(d) => {
                drift += 1;
                let stock = d
                    .redis_stock
                    .map_or("no stock key".to_owned(), |s| s.to_string());
                let exp = d.expected.expect("a drift has an expectation");
                out.push_str(&format!(
                    "{sku}: DRIFT: redis stock {stock} held {}, the books say stock {} held {} (stock off by {}, held off by {})\n",
                    d.redis_held,
                    exp.stock,
                    exp.held,
                    d.redis_stock.map_or("?".to_owned(), |s| (s - exp.stock).to_string()),
                    d.redis_held - exp.held,
                ));
                match &d.account {
                    Some(a) => out.push_str(&format!(
                        "  database: stock {} held {} from {} entries ({}), newest {}-{}\n",
                        a.stock,
                        a.held,
                        a.entries,
                        if a.from_baseline {
                            "since its last set"
                        } else {
                            "since its first entry"
                        },
                        a.last.0,
                        a.last.1
                    )),
                    None => out.push_str("  database: no entries\n"),
                }
                out.push_str(&format!("  not moved yet: {} entries\n", d.pending.len()));
                for entry in d.pending.iter().take(20) {
                    out.push_str(&format!("    {}\n", describe(entry)));
                }
                for entry in &d.breaks {
                    out.push_str(&format!(
                        "  does not follow from the entry before it: {}\n",
                        describe(entry)
                    ));
                }
                if d.breaks.is_empty() {
                    out.push_str("  every entry follows from the one before: the difference was made outside the journal (a write around stockgate, or an entry lost)\n");
                }
            }
        }
    }
    out.push_str(&format!(
        "{} skus: {agree} agree, {drift} drift, {unchecked} could not be checked, {bare} without entries\n",
        report.skus.len()
    ));
    out
}

fn describe(entry: &Entry) -> String {
    format!(
        "{} {} id={} order_no={:?} stock {:+} -> {} held {:+} -> {}",
        entry.stream_id(),
        entry.event.name(),
        entry.id,
        entry.order_no,
        entry.stock_change,
        entry.stock,
        entry.held_change,
        entry.held
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: (u64, u64), event: Event, ds: i64, dh: i64, st: i64, hd: i64) -> Entry {
        Entry {
            at,
            format: super::super::FORMAT,
            event,
            id: "r".into(),
            location: String::new(),
            order_no: String::new(),
            stock_change: ds,
            held_change: dh,
            stock: st,
            held: hd,
            time_ms: at.0,
        }
    }

    #[test]
    fn the_books_carry_the_account_forward_by_what_is_not_moved_yet() {
        let journal = [
            entry((1, 0), Event::Deduct, -2, 0, 98, 0),
            entry((2, 0), Event::Hold, -3, 3, 95, 3),
            entry((3, 0), Event::Set, 5, 0, 100, 3),
            entry((4, 0), Event::Expire, 3, -3, 103, 0),
        ];
        // Nothing in the database: the first entry opens the account.
        assert_eq!(
            expected(None, &journal),
            Some(Expected {
                stock: 103,
                held: 0
            })
        );
        // The database holds the first two; the set restarts from its st.
        let account = Account {
            from_baseline: false,
            stock: 95,
            held: 3,
            entries: 2,
            last: (2, 0),
        };
        assert_eq!(pending(Some(&account), &journal).len(), 2);
        assert_eq!(
            expected(Some(&account), &journal),
            Some(Expected {
                stock: 103,
                held: 0
            })
        );
        // Everything moved and trimmed: the account alone.
        assert_eq!(
            expected(Some(&account), &[]),
            Some(Expected { stock: 95, held: 3 })
        );
        assert_eq!(expected(None, &[]), None);
    }

    #[test]
    fn drift_outranks_what_could_not_be_checked() {
        let mut report = Report::default();
        assert_eq!(report.exit_code(), 0);
        report.skus.push(("a".into(), Verdict::Agrees));
        report.skus.push(("b".into(), Verdict::Unjournaled));
        assert_eq!(report.exit_code(), 0);
        report
            .skus
            .push(("c".into(), Verdict::Unchecked(JournalFault::bad_reply("x"))));
        assert_eq!(report.exit_code(), 2);
        report.skus.push((
            "d".into(),
            Verdict::Drifts(Drift {
                redis_stock: None,
                redis_held: 0,
                expected: Some(Expected { stock: 1, held: 0 }),
                account: None,
                pending: vec![],
                breaks: vec![],
            }),
        ));
        assert_eq!(report.exit_code(), 1);
    }
}

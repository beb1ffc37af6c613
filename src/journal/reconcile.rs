//! `stockgate reconcile`: proves Redis and the database agree, SKU by SKU
//! and, for a SKU kept by location, location by location.
//!
//! For each SKU, one atomic read of its units (its stock and held units,
//! or each location's) and its journal ([`stream::snapshot`]), so a
//! change running meanwhile is all in it or not at all; then its accounts
//! in the database as of the last id that read saw (many SKUs' accounts
//! in one query), one per location (`''` for a SKU that keeps one
//! number). For each location, the entries of the journal after the
//! newest one of that location the database holds are the ones not moved
//! yet: applied to its account in order, they must give exactly Redis's
//! units there. Entries the database already has (committed, not trimmed
//! yet) are not counted twice. A SKU kept by location is also held to
//! Redis's own sum: its units on hold (`:held`) are its locations' held
//! units added up, whatever the books say.

use super::database::{Account, Accounts, Books};
use super::fault::JournalFault;
use super::stream::{self, Snapshot, Units};
use super::{Entry, Event};
use crate::keys::KeyLayout;
use crate::upstream::Upstream;
use std::collections::{BTreeMap, BTreeSet};

/// How far the database's history of a drifting SKU is searched for
/// entries that don't follow from the one before.
const BREAKS_SHOWN: i64 = 10;

/// What the books say a SKU's state at one location must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub stock: i64,
    pub held: i64,
}

/// The account of one location carried forward by its journal entries
/// (`journal`, that location's alone) the database does not hold yet
/// (those after `account.last`). None when neither has an entry of it:
/// its stock was never changed through stockgate.
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

/// The entries of `journal` (one location's) the database does not hold
/// yet.
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
    /// Redis and the books differ, or Redis's held units disagree with
    /// themselves.
    Drifts(Drifts),
    /// Redis or the database could not be read for it.
    Unchecked(JournalFault),
}

/// What drifts in one SKU.
#[derive(Debug, Clone, Default)]
pub struct Drifts {
    /// One drift for each location that drifts (one, `''`, for a SKU
    /// that keeps one number).
    pub locations: Vec<Drift>,
    /// A SKU kept by location whose held units are not its locations'.
    pub held: Option<HeldApart>,
}

/// A SKU kept by location whose units on hold (its `:held`, what
/// STOCK.STATUS and the hold scripts read) are not the sum of its
/// locations' held units (`<location>:held`, what its allocations give
/// back): every script changes both in the same call, so only a write
/// around stockgate parts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldApart {
    /// The SKU's `:held`.
    pub held: i64,
    /// Its locations' held units, summed.
    pub at_locations: i64,
}

/// The held units of a SKU kept by location, when its `:held` is not
/// its locations' held units summed; None when they agree, or for a SKU
/// that keeps one number (its `:held` is its only count of them).
pub fn held_apart(units: &Units) -> Option<HeldApart> {
    let Units::ByLocation { locations, held } = units else {
        return None;
    };
    let at_locations = locations.values().map(|units| units.held).sum();
    (*held != at_locations).then_some(HeldApart {
        held: *held,
        at_locations,
    })
}

/// One location where Redis and the books differ.
#[derive(Debug, Clone)]
pub struct Drift {
    /// `''` for a SKU that keeps one number.
    pub location: String,
    /// None when Redis has no such stock: no stock key, or no such
    /// location.
    pub redis_stock: Option<i64>,
    pub redis_held: i64,
    pub expected: Expected,
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
                let accounts = accounts.remove(&name).unwrap_or_default();
                verdict(books, &name, snapshot, accounts)
                    .await
                    .unwrap_or_else(Verdict::Unchecked)
            }
            Err(fault) => Verdict::Unchecked(fault),
        };
        verdicts.push((name, verdict));
    }
    verdicts
}

/// One SKU's verdict from its Redis snapshot and its accounts as of it,
/// with the breaks in the books' history of each location that drifts.
async fn verdict(
    books: &mut Books,
    name: &str,
    snapshot: Snapshot,
    accounts: Accounts,
) -> Result<Verdict, JournalFault> {
    let held = held_apart(&snapshot.units);
    let locations = drifts(&snapshot.units, snapshot.journal, &accounts);
    let mut locations = match (locations, held) {
        (None, None) => return Ok(Verdict::Unjournaled),
        (Some(locations), None) if locations.is_empty() => return Ok(Verdict::Agrees),
        (locations, _) => locations.unwrap_or_default(),
    };
    for drift in &mut locations {
        if drift.account.is_some() {
            drift.breaks = books.breaks(name, &drift.location, BREAKS_SHOWN).await?;
        }
    }
    Ok(Verdict::Drifts(Drifts { locations, held }))
}

/// The locations of a SKU where Redis and the books differ (their breaks
/// not looked up yet), or None when the books know no location of it.
/// Every location the books know (an account or a journal entry) is
/// compared; a location Redis has and the books don't was never changed
/// through stockgate, as a SKU without entries.
pub fn drifts(units: &Units, journal: Vec<Entry>, accounts: &Accounts) -> Option<Vec<Drift>> {
    let mut journals: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for entry in journal {
        journals
            .entry(entry.location.clone())
            .or_default()
            .push(entry);
    }
    let locations: BTreeSet<String> = accounts.keys().chain(journals.keys()).cloned().collect();
    if locations.is_empty() {
        return None;
    }
    let mut drifts = Vec::new();
    for location in locations {
        let account = accounts.get(&location);
        let journal = journals.remove(&location).unwrap_or_default();
        let Some(expected) = expected(account, &journal) else {
            continue;
        };
        let (redis_stock, redis_held) = in_redis(units, &location);
        if redis_stock == Some(expected.stock) && redis_held == expected.held {
            continue;
        }
        drifts.push(Drift {
            redis_stock,
            redis_held,
            expected,
            pending: pending(account, &journal).to_vec(),
            account: account.cloned(),
            breaks: Vec::new(),
            location,
        });
    }
    Some(drifts)
}

/// What Redis keeps at `location` of a SKU: its available units (None
/// when there are none to read) and its units on hold.
fn in_redis(units: &Units, location: &str) -> (Option<i64>, i64) {
    match units {
        Units::One { stock, held } if location.is_empty() => (*stock, *held),
        // A SKU that keeps one number has no other location.
        Units::One { .. } => (None, 0),
        // A SKU kept by location keeps no units of its own: what it had
        // as one number before its first location, its books say, is 0.
        Units::ByLocation { .. } if location.is_empty() => (Some(0), 0),
        Units::ByLocation { locations, .. } => locations
            .get(location)
            .map_or((None, 0), |units| (units.available, units.held)),
    }
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
            Verdict::Drifts(drifts) => {
                drift += 1;
                if let Some(apart) = drifts.held {
                    render_held_apart(&mut out, sku, apart);
                }
                for d in &drifts.locations {
                    render_drift(&mut out, sku, d);
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

/// One location's drift: `<sku>: DRIFT: ...` for a SKU that keeps one
/// number, `<sku> location <location>: DRIFT: ...` for one kept by
/// location.
fn render_drift(out: &mut String, sku: &str, d: &Drift) {
    let stock = match (d.redis_stock, d.location.is_empty()) {
        (Some(stock), _) => stock.to_string(),
        (None, true) => "no stock key".to_owned(),
        (None, false) => "no such location".to_owned(),
    };
    let exp = d.expected;
    let at = if d.location.is_empty() {
        String::new()
    } else {
        format!(" location {}", d.location)
    };
    out.push_str(&format!(
        "{sku}{at}: DRIFT: redis stock {stock} held {}, the books say stock {} held {} (stock off by {}, held off by {})\n",
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

/// A SKU kept by location whose `:held` is not its locations' held
/// units summed: `<sku>: DRIFT: held ...`.
fn render_held_apart(out: &mut String, sku: &str, apart: HeldApart) {
    out.push_str(&format!(
        "{sku}: DRIFT: redis held {} over the sku, its locations hold {} (held off by {})\n",
        apart.held,
        apart.at_locations,
        apart.held - apart.at_locations
    ));
    out.push_str("  a sku's held units are its locations' summed, each change of them made in one script call: the difference was made outside stockgate's scripts (a write around stockgate)\n");
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
            Verdict::Drifts(Drifts {
                locations: vec![Drift {
                    location: String::new(),
                    redis_stock: None,
                    redis_held: 0,
                    expected: Expected { stock: 1, held: 0 },
                    account: None,
                    pending: vec![],
                    breaks: vec![],
                }],
                held: None,
            }),
        ));
        assert_eq!(report.exit_code(), 1);
    }

    fn at(location: &str, entry: Entry) -> Entry {
        Entry {
            format: super::super::FORMAT_AT_LOCATION,
            location: location.into(),
            ..entry
        }
    }

    fn account(stock: i64, held: i64, last: (u64, u64)) -> Account {
        Account {
            from_baseline: true,
            stock,
            held,
            entries: 1,
            last,
        }
    }

    /// A SKU kept by location whose `:held` is its locations' summed.
    fn located(locations: &[(&str, Option<i64>, i64)]) -> Units {
        Units::ByLocation {
            locations: locations
                .iter()
                .map(|(name, available, held)| {
                    (
                        name.to_string(),
                        stream::LocationUnits {
                            available: *available,
                            held: *held,
                        },
                    )
                })
                .collect(),
            held: locations.iter().map(|(_, _, held)| held).sum(),
        }
    }

    #[test]
    fn each_location_is_its_own_account() {
        // w1 and w2 interleave in one stream; the database holds w1 up to
        // (2, 0) and w2 up to (1, 0), and what follows of each is pending.
        let journal = vec![
            at("w1", entry((2, 0), Event::Deduct, -2, 0, 8, 0)),
            at("w2", entry((3, 0), Event::Hold, -1, 1, 4, 1)),
            at("w1", entry((4, 0), Event::Deduct, -1, 0, 7, 0)),
        ];
        let accounts: Accounts = [
            ("w1".to_owned(), account(8, 0, (2, 0))),
            ("w2".to_owned(), account(5, 0, (1, 0))),
        ]
        .into();
        let agreeing = located(&[("w1", Some(7), 0), ("w2", Some(4), 1), ("w3", Some(9), 0)]);
        // w3 is in Redis only: never changed through stockgate.
        assert_eq!(
            drifts(&agreeing, journal.clone(), &accounts).map(|d| d.len()),
            Some(0)
        );
        // w2's held units moved outside the journal, and w1 is gone.
        let drifting = located(&[("w2", Some(4), 3)]);
        let found = drifts(&drifting, journal.clone(), &accounts).unwrap();
        let summary: Vec<_> = found
            .iter()
            .map(|d| {
                (
                    d.location.as_str(),
                    d.redis_stock,
                    d.redis_held,
                    d.expected,
                    d.pending.len(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("w1", None, 0, Expected { stock: 7, held: 0 }, 1),
                ("w2", Some(4), 3, Expected { stock: 4, held: 1 }, 1),
            ]
        );
        let mut report = Report::default();
        report.skus.push((
            "sku-1".into(),
            Verdict::Drifts(Drifts {
                locations: found,
                held: None,
            }),
        ));
        let text = render(&report);
        assert!(
            text.contains("sku-1 location w1: DRIFT: redis stock no such location held 0"),
            "{text}"
        );
        assert!(
            text.contains("sku-1 location w2: DRIFT: redis stock 4 held 3, the books say stock 4 held 1 (stock off by 0, held off by 2)"),
            "{text}"
        );
        assert!(text.contains("1 skus: 0 agree, 1 drift"), "{text}");
    }

    #[test]
    fn a_sku_that_keeps_one_number_is_checked_as_one() {
        let journal = vec![entry((1, 0), Event::Set, 10, 0, 10, 0)];
        let one = |stock| Units::One { stock, held: 0 };
        assert_eq!(
            drifts(&one(Some(10)), journal.clone(), &Accounts::new()).map(|d| d.len()),
            Some(0)
        );
        let found = drifts(&one(Some(12)), journal.clone(), &Accounts::new()).unwrap();
        assert_eq!(found.len(), 1);
        let mut report = Report::default();
        report.skus.push((
            "sku-2".into(),
            Verdict::Drifts(Drifts {
                locations: found,
                held: None,
            }),
        ));
        assert!(
            render(&report).starts_with("sku-2: DRIFT: redis stock 12 held 0"),
            "{}",
            render(&report)
        );
        assert!(drifts(&one(None), Vec::new(), &Accounts::new()).is_none());
        // A SKU kept by location keeps nothing as one number: what its
        // books had there before its first location must have come to 0.
        let emptied = [("".to_owned(), account(0, 0, (1, 0)))].into();
        assert_eq!(
            drifts(&located(&[]), Vec::new(), &emptied).map(|d| d.len()),
            Some(0)
        );
        let left = [("".to_owned(), account(3, 0, (1, 0)))].into();
        let found = drifts(&located(&[]), Vec::new(), &left).unwrap();
        assert_eq!(
            (found[0].location.as_str(), found[0].redis_stock),
            ("", Some(0))
        );
    }

    #[test]
    fn a_located_sku_s_held_units_are_its_locations_summed() {
        let agreeing = located(&[("w1", Some(7), 2), ("w2", Some(4), 1), ("w3", None, 3)]);
        assert_eq!(held_apart(&agreeing), None);
        let Units::ByLocation { locations, .. } = agreeing else {
            unreachable!()
        };
        let apart = Units::ByLocation { locations, held: 4 };
        assert_eq!(
            held_apart(&apart),
            Some(HeldApart {
                held: 4,
                at_locations: 6
            })
        );
        // A SKU that keeps one number has nothing to sum.
        assert_eq!(
            held_apart(&Units::One {
                stock: Some(3),
                held: 9
            }),
            None
        );
        let mut report = Report::default();
        report.skus.push((
            "sku-3".into(),
            Verdict::Drifts(Drifts {
                locations: Vec::new(),
                held: held_apart(&apart),
            }),
        ));
        let text = render(&report);
        assert!(
            text.starts_with(
                "sku-3: DRIFT: redis held 4 over the sku, its locations hold 6 (held off by -2)\n"
            ),
            "{text}"
        );
        assert_eq!(report.exit_code(), 1);
    }
}

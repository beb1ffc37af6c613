//! The books: every change of a SKU's stock or records, as its journal
//! keeps it.
//!
//! The script that makes a change appends one entry to the SKU's journal
//! in the same atomic call, whenever the SKU has one, and with `--journal`
//! gives it one first (`lua/common.lua`, `journal_of`):
//! a Redis stream under the SKU's hash tag
//! ([`crate::keys::KeyLayout::journal_key`]), so entries of one SKU are
//! totally ordered, and their ids (Redis's `<ms>-<seq>`, from the
//! primary's clock, never below the stream's last id) are stable and never
//! reused while the stream exists. A call that changes nothing (codes 1 to
//! 5) writes no entry. Before a SKU's first entry, stockgate lists the SKU
//! in its sweep shard's set of journals ([`crate::keys::SweepShard`]
//! `journals`), then makes the stream (`lua/journal_open.lua`): a stream
//! never exists unlisted, so the sink finds every journal without a scan.
//! The sink moves entries into PostgreSQL and only then trims them;
//! `reconcile` proves Redis and the database agree.
//!
//! This module owns the entry's shape: its field names, its events and
//! what each does to the SKU's account. The scripts write it (`lua/`,
//! the `journal` helper of `lua/common.lua`), and everything that reads a
//! journal parses it here.
//!
//! # An entry
//!
//! A stream entry has one field, `e`, whose value is words separated by
//! single spaces, the last the rest of the text (an order_no may hold
//! spaces). A SKU that keeps one number writes format 1, eight words; a
//! SKU kept by location (docs/locations.md) writes format 2, nine, one
//! entry for each location a change moves, with the location before the
//! order_no:
//!
//! ```text
//! e = "1 <event> <id> <stock change> <held change> <stock after> <held after> <order_no>"
//! e = "1 deduct d-1 -3 0 97 0 ORD 1"
//! e = "2 <event> <id> <stock change> <held change> <stock after> <held after> <location> <order_no>"
//! e = "2 deduct d-1 -3 0 17 0 w1 ORD 1"
//! ```
//!
//! | word | what |
//! |---|---|
//! | format | the format version: [`FORMAT`] or [`FORMAT_AT_LOCATION`] |
//! | event | [`Event`]'s name |
//! | id | the request_id (an order's line: `~ord:<order id>`), or the op_id of STOCK.SET / STOCK.ADD |
//! | stock change | the change of the available stock, signed |
//! | held change | the change of the held units, signed |
//! | stock after, held after | both after the change |
//! | location | format 2 only: the location whose units these are; format 1's is `''` |
//! | order_no | the order_no the request carried, or empty |
//!
//! The stock and held units are the SKU's in format 1, the location's in
//! format 2.
//!
//! One field, not one per word: an XADD's cost in Redis grows with its
//! arguments, and this one is on every change (docs/performance.md has the
//! figures). The entry's time is its id's first part: Redis time of the
//! primary, in milliseconds, when it was appended (never below the entry
//! before it).
//!
//! The account, one per (SKU, location): after any entry, `stock after =
//! stock before + stock change` and likewise for the held units, where
//! "before" is what the entry before it of the same location left. A
//! `set` entry starts its location's account again (its stock after is
//! the new baseline whatever came before); every other entry moves it.

pub mod database;
pub mod fault;
pub mod reconcile;
pub mod retire;
pub mod sink;
pub mod stream;

/// The entry format of a SKU that keeps one number: no location.
pub const FORMAT: u32 = 1;

/// The entry format of a SKU kept by location: the location's units, and
/// its name before the order_no.
pub const FORMAT_AT_LOCATION: u32 = 2;

/// The longest location name an entry may carry: the width of the tables'
/// `location` column (`VARCHAR(64)` in MySQL), and no more than the
/// commands accept (docs/locations.md). A longer one would fail its whole
/// batch in a strict MySQL session; refused here, it stops only its SKU.
pub const MOST_LOCATION_BYTES: usize = 64;

/// What a journal entry records. The names are the `ev` field's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// DEDUCT 0 (and an ORDER's line): `ds = -qty`.
    Deduct,
    /// REVERT 0 of a DEDUCTED or CONFIRMED record: `ds = +qty`.
    Revert,
    /// HOLD 0 (and an ORDER.HOLD's line): `ds = -qty, dh = +qty`.
    Hold,
    /// CONFIRM 0: the held units leave for good, `dh = -qty`.
    Confirm,
    /// REVERT 0 of a HELD record, and HOLD.SHRINK 0 (the units it gives
    /// back): `ds = +qty, dh = -qty`.
    Cancel,
    /// A hold released by its expiry, by any script or the sweeper:
    /// `ds = +qty, dh = -qty`.
    Expire,
    /// STOCK.SET (and `stock import`): the account starts again at `st`.
    Set,
    /// STOCK.ADD: `ds = n`, signed.
    Add,
}

impl Event {
    pub const ALL: [Event; 8] = [
        Event::Deduct,
        Event::Revert,
        Event::Hold,
        Event::Confirm,
        Event::Cancel,
        Event::Expire,
        Event::Set,
        Event::Add,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Event::Deduct => "deduct",
            Event::Revert => "revert",
            Event::Hold => "hold",
            Event::Confirm => "confirm",
            Event::Cancel => "cancel",
            Event::Expire => "expire",
            Event::Set => "set",
            Event::Add => "add",
        }
    }

    pub fn parse(name: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|event| event.name() == name)
    }
}

/// One journal entry, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The stream id, `<ms>-<seq>`, as its two numbers.
    pub at: (u64, u64),
    pub format: u32,
    pub event: Event,
    pub id: String,
    /// The location whose units the entry counts; `''` for a SKU that
    /// keeps one number (format 1).
    pub location: String,
    pub order_no: String,
    pub stock_change: i64,
    pub held_change: i64,
    pub stock: i64,
    pub held: i64,
    /// The id's first part: Redis time when it was appended.
    pub time_ms: u64,
}

/// Why an entry could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal entry {at}: {what}")]
pub struct BadEntry {
    pub at: String,
    pub what: String,
}

impl Entry {
    /// Reads one stream entry: its id and its field/value pairs.
    pub fn parse(at: &str, fields: &[(String, String)]) -> Result<Entry, BadEntry> {
        let bad = |what: String| BadEntry {
            at: at.to_owned(),
            what,
        };
        let stream_id: (u64, u64) = at
            .split_once('-')
            .and_then(|(ms, seq)| Some((ms.parse().ok()?, seq.parse().ok()?)))
            .ok_or_else(|| bad("the id is not <ms>-<seq>".into()))?;
        let text = fields
            .iter()
            .find(|(k, _)| k == "e")
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| bad("no field \"e\"".into()))?;
        let format = text
            .split(' ')
            .next()
            .and_then(|word| word.parse::<u32>().ok())
            .ok_or_else(|| bad(format!("no format version in {text:?}")))?;
        let count = match format {
            FORMAT => 8,
            FORMAT_AT_LOCATION => 9,
            _ => {
                return Err(bad(format!(
                    "format {format}, this stockgate reads formats {FORMAT} and \
                     {FORMAT_AT_LOCATION}"
                )));
            }
        };
        let mut words = text.splitn(count, ' ').skip(1);
        let mut word = |name: &str| {
            words
                .next()
                .ok_or_else(|| bad(format!("no {name} in {text:?}")))
        };
        let event = word("event")?;
        let event = Event::parse(event).ok_or_else(|| bad(format!("unknown event {event:?}")))?;
        let id = word("id")?.to_owned();
        let mut int = |name: &str| {
            let w = word(name)?;
            w.parse::<i64>()
                .map_err(|_| bad(format!("{name} {w:?} is not an integer")))
        };
        let stock_change = int("stock change")?;
        let held_change = int("held change")?;
        let stock = int("stock after")?;
        let held = int("held after")?;
        let location = if format == FORMAT_AT_LOCATION {
            let location = word("location")?;
            // Empty, the entry could not be told from one whose order_no
            // follows a missing location.
            if location.is_empty() || location.len() > MOST_LOCATION_BYTES {
                return Err(bad(format!(
                    "location {location:?} is not 1 to {MOST_LOCATION_BYTES} bytes"
                )));
            }
            location.to_owned()
        } else {
            String::new()
        };
        let order_no = word("order_no").unwrap_or("").to_owned();
        Ok(Entry {
            at: stream_id,
            format,
            event,
            id,
            location,
            order_no,
            stock_change,
            held_change,
            stock,
            held,
            time_ms: stream_id.0,
        })
    }

    /// The stream id as Redis spells it.
    pub fn stream_id(&self) -> String {
        format!("{}-{}", self.at.0, self.at.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_entry_reads_back_and_a_bad_one_says_why() {
        let entry = Entry::parse(
            "1700000000000-2",
            &fields(&[("e", "1 hold h-1 -3 3 7 3 ORD 1")]),
        )
        .unwrap();
        assert_eq!(entry.event, Event::Hold);
        assert_eq!((entry.stock_change, entry.held_change), (-3, 3));
        assert_eq!((entry.stock, entry.held), (7, 3));
        assert_eq!(
            (entry.id.as_str(), entry.order_no.as_str()),
            ("h-1", "ORD 1")
        );
        assert_eq!(entry.stream_id(), "1700000000000-2");
        assert_eq!(entry.time_ms, 1_700_000_000_000);
        let none = Entry::parse("1-0", &fields(&[("e", "1 deduct d 1 0 5 0 ")])).unwrap();
        assert_eq!(none.order_no, "");
        for event in Event::ALL {
            assert_eq!(Event::parse(event.name()), Some(event));
        }
        assert_eq!(none.location, "", "format 1 has no location");
        let newer = Entry::parse("1-0", &fields(&[("e", "3 deduct d 1 0 5 0 w1 ")]));
        assert!(newer.unwrap_err().what.contains("format 3"));
        for bad in [
            "1 steal d 1 0 5 0 ",
            "1 deduct d x 0 5 0 ",
            "1 deduct d 1 0",
        ] {
            assert!(
                Entry::parse("1-0", &fields(&[("e", bad)])).is_err(),
                "{bad}"
            );
        }
        assert!(Entry::parse("nope", &fields(&[("e", "1 deduct d 1 0 5 0 ")])).is_err());
        assert!(Entry::parse("1-0", &fields(&[("v", "1")])).is_err());
    }

    #[test]
    fn a_located_entry_carries_its_location_before_the_order_no() {
        let entry = Entry::parse(
            "1700000000000-3",
            &fields(&[("e", "2 hold h-1 -3 3 17 3 w1 ORD 1")]),
        )
        .unwrap();
        assert_eq!(entry.format, FORMAT_AT_LOCATION);
        assert_eq!(entry.event, Event::Hold);
        assert_eq!(
            (
                entry.stock_change,
                entry.held_change,
                entry.stock,
                entry.held
            ),
            (-3, 3, 17, 3)
        );
        assert_eq!(
            (
                entry.id.as_str(),
                entry.location.as_str(),
                entry.order_no.as_str()
            ),
            ("h-1", "w1", "ORD 1")
        );
        let bare = Entry::parse("1-0", &fields(&[("e", "2 set op-1 5 0 5 0 w.2 ")])).unwrap();
        assert_eq!(
            (bare.location.as_str(), bare.order_no.as_str()),
            ("w.2", "")
        );
        let unended = Entry::parse("1-0", &fields(&[("e", "2 add op-2 5 0 10 0 w-3")])).unwrap();
        assert_eq!(
            (unended.location.as_str(), unended.order_no.as_str()),
            ("w-3", "")
        );
        // The same words read as format 1 put the location into the
        // order_no: the format decides, not the count of words.
        let one = Entry::parse("1-0", &fields(&[("e", "1 hold h-1 -3 3 17 3 w1 ORD 1")])).unwrap();
        assert_eq!(
            (one.location.as_str(), one.order_no.as_str()),
            ("", "w1 ORD 1")
        );
        assert_ne!(one, entry, "the location is part of what an entry is");
        let longest = "w".repeat(MOST_LOCATION_BYTES);
        let at_most = format!("2 deduct d -1 0 4 0 {longest} ");
        assert_eq!(
            Entry::parse("1-0", &fields(&[("e", &at_most)]))
                .unwrap()
                .location,
            longest
        );
        let too_long = format!("2 deduct d -1 0 4 0 {longest}w ");
        for bad in [
            // No location: its order_no would be taken for one.
            "2 deduct d -1 0 4 0  ORD-1",
            "2 deduct d -1 0 4 0",
            "2 deduct d -1 0 4 w1 ORD-1",
            too_long.as_str(),
        ] {
            let err = Entry::parse("1-0", &fields(&[("e", bad)])).unwrap_err();
            assert!(!err.what.is_empty(), "{bad}");
        }
    }
}

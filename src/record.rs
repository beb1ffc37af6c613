//! The idempotency record as Rust reads it: for `stock export`'s neighbours,
//! audits and tests. The scripts write records; `lua/common.lua` is the
//! other half of this fact and documents the format, and a test checks the
//! two agree.
//!
//! ```text
//! 3:<state>:<qty>:<nonce>:<aux>:<order_no>   written since script version 3
//! <state>:<qty>:<order_no>                   written by versions 1 and 2
//! ```
//!
//! aux is empty, but for the states of a hold (H, C, X, from version 4):
//! `<expires_at>.<held_at>`, milliseconds of Redis time; a hold that gave
//! some of its units back (HOLD.SHRINK) holds `qty` units now and keeps the
//! qty its HOLD asked for third, `<expires_at>.<held_at>.<asked>`.

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// qty units were deducted.
    Deducted,
    /// qty units were deducted (or held), then given back.
    Reverted,
    /// A REVERT (or a CONFIRM) came first; the id may never deduct or hold.
    Revoked,
    /// qty units are on hold until the record's expiry.
    Held,
    /// A hold made final: qty units deducted for good.
    Confirmed,
    /// A hold that ran out: its units went back to stock.
    Expired,
}

impl State {
    fn from_letter(letter: u8) -> Option<State> {
        match letter {
            b'D' => Some(State::Deducted),
            b'R' => Some(State::Reverted),
            b'V' => Some(State::Revoked),
            b'H' => Some(State::Held),
            b'C' => Some(State::Confirmed),
            b'X' => Some(State::Expired),
            _ => None,
        }
    }

    /// The record's letter for it.
    pub fn letter(self) -> char {
        match self {
            State::Deducted => 'D',
            State::Reverted => 'R',
            State::Revoked => 'V',
            State::Held => 'H',
            State::Confirmed => 'C',
            State::Expired => 'X',
        }
    }

    /// Whether records in this state carry a hold's times.
    pub fn is_hold(self) -> bool {
        matches!(self, State::Held | State::Confirmed | State::Expired)
    }
}

/// A record read in place, its fields slices of the value: what the
/// sold-out path decides from on a hot SKU, without a copy; and what
/// [`Record::parse`] makes its owned record of. The one parser of the
/// format in Rust: `parse_record` and `parse_located` in `lua/common.lua`,
/// byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub state: State,
    /// Its qty as text (the scripts compare it with a request's as text).
    pub qty: &'a [u8],
    pub nonce: &'a [u8],
    /// A hold's expiry and start as text (hold states only).
    pub hold: Option<(&'a [u8], &'a [u8])>,
    /// The qty a shrunk hold's HOLD asked for (`qty` is what it holds now).
    pub asked: Option<&'a [u8]>,
    pub order_no: &'a [u8],
    /// Where a record made by allocation took its units
    /// (`<location>=<units>,...`, docs/locations.md); `None` for others.
    pub allocation: Option<&'a [u8]>,
}

impl<'a> RecordView<'a> {
    /// A record as the scripts of a SKU that keeps one number read it
    /// (`parse_record`): `None` for any shape they call BADRECORD, a
    /// record made by allocation included (its units are its locations',
    /// never the one number's).
    pub fn parse(raw: &'a [u8]) -> Option<RecordView<'a>> {
        let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
        let letter = |field: &[u8]| match field {
            [letter] => State::from_letter(*letter),
            _ => None,
        };
        if let Some(rest) = raw.strip_prefix(b"3:") {
            // '^3:([DRVHCX]):(%d+):(%x*):([%d.]*):(.*)$', then for H, C and
            // X an aux of '^(%d+)%.(%d+)$' or '^(%d+)%.(%d+)%.(%d+)$', for
            // the others '^%d*$'.
            let mut fields = rest.splitn(5, |b| *b == b':');
            let (state, qty, nonce, aux, order_no) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            let state = letter(state)?;
            if !digits(qty) || !nonce.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let (hold, asked) = if state.is_hold() {
                let mut parts = aux.splitn(3, |b| *b == b'.');
                let (expires, held) = (parts.next()?, parts.next()?);
                let asked = parts.next();
                if !digits(expires) || !digits(held) || asked.is_some_and(|a| !digits(a)) {
                    return None;
                }
                (Some((expires, held)), asked)
            } else {
                // Version 3 read (and ignored) digits here; so does this one.
                if !aux.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                (None, None)
            };
            return Some(RecordView {
                state,
                qty,
                nonce,
                hold,
                asked,
                order_no,
                allocation: None,
            });
        }
        // '^([DRV]):(%d+):(.*)$', the records of versions 1 and 2.
        let mut fields = raw.splitn(3, |b| *b == b':');
        let (state, qty, order_no) = (fields.next()?, fields.next()?, fields.next()?);
        let state = letter(state)?;
        if !matches!(state, State::Deducted | State::Reverted | State::Revoked) || !digits(qty) {
            return None;
        }
        Some(RecordView {
            state,
            qty,
            nonce: b"",
            hold: None,
            asked: None,
            order_no,
            allocation: None,
        })
    }

    /// A record as `lua/allocate.lua` reads it (`parse_located`): one made
    /// by allocation, its allocation first, or any [`RecordView::parse`]
    /// reads.
    pub fn parse_located(raw: &'a [u8]) -> Option<RecordView<'a>> {
        let Some(located) = raw.strip_prefix(b"@") else {
            return RecordView::parse(raw);
        };
        // '^@([^;]*);(3:.*)$': the allocation, then the record.
        let split = located.iter().position(|b| *b == b';')?;
        let (allocation, rest) = (&located[..split], &located[split + 1..]);
        if !rest.starts_with(b"3:") {
            return None;
        }
        let mut view = RecordView::parse(rest)?;
        view.allocation = Some(allocation);
        Some(view)
    }
}

/// One record, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: State,
    pub qty: u64,
    /// The call that wrote it (empty in records of scripts before 3).
    pub nonce: String,
    /// A hold's expiry and start, ms of Redis time (hold states only).
    pub hold: Option<(u64, u64)>,
    /// The qty a shrunk hold's HOLD asked for.
    pub asked: Option<u64>,
    pub order_no: String,
    /// A record made by allocation: `<location>=<units>,...`.
    pub allocation: Option<String>,
}

impl Record {
    /// Parses a record's value, of either kind of SKU
    /// ([`RecordView::parse_located`]); `None` for any shape the scripts
    /// would call BADRECORD (and for a number past `u64`).
    pub fn parse(raw: &str) -> Option<Record> {
        let view = RecordView::parse_located(raw.as_bytes())?;
        let number = |s: &[u8]| std::str::from_utf8(s).ok()?.parse().ok();
        let hold = match view.hold {
            Some((expires, held)) => Some((number(expires)?, number(held)?)),
            None => None,
        };
        let asked = match view.asked {
            Some(asked) => Some(number(asked)?),
            None => None,
        };
        Some(Record {
            state: view.state,
            qty: number(view.qty)?,
            nonce: String::from_utf8_lossy(view.nonce).into_owned(),
            hold,
            asked,
            order_no: String::from_utf8_lossy(view.order_no).into_owned(),
            allocation: view
                .allocation
                .map(|a| String::from_utf8_lossy(a).into_owned()),
        })
    }

    /// `<state>:<qty>:<order_no>`, the record without the call that wrote
    /// it: what an audit compares.
    pub fn summary(&self) -> String {
        format!("{}:{}:{}", self.state.letter(), self.qty, self.order_no)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_parse_and_others_do_not() {
        let now = Record::parse("3:D:2:00ff:0:ORD:1").unwrap();
        assert_eq!(now.state, State::Deducted);
        assert_eq!((now.qty, now.nonce.as_str()), (2, "00ff"));
        assert_eq!(now.order_no, "ORD:1", "an order_no may hold colons");
        assert_eq!(now.summary(), "D:2:ORD:1");
        let old = Record::parse("R:3:ORD-A").unwrap();
        assert_eq!(
            (old.state, old.qty, old.nonce.as_str()),
            (State::Reverted, 3, "")
        );
        assert_eq!(Record::parse("V:0:").unwrap().summary(), "V:0:");
        let held = Record::parse("3:H:4:ab:1790000000000.1789999000000:O").unwrap();
        assert_eq!(held.state, State::Held);
        assert_eq!(held.hold, Some((1_790_000_000_000, 1_789_999_000_000)));
        assert_eq!(held.summary(), "H:4:O");
        assert_eq!(held.asked, None);
        let shrunk = Record::parse("3:H:1:ab:1790000000000.1789999000000.4:O").unwrap();
        assert_eq!((shrunk.qty, shrunk.asked), (1, Some(4)));
        assert_eq!(shrunk.hold, Some((1_790_000_000_000, 1_789_999_000_000)));
        let located = Record::parse("@w1=2,w2=1;3:D:3:ab::ORD").unwrap();
        assert_eq!(located.allocation.as_deref(), Some("w1=2,w2=1"));
        assert_eq!(located.summary(), "D:3:ORD");
        // A SKU that keeps one number reads no record made by allocation.
        assert_eq!(RecordView::parse(b"@w1=2,w2=1;3:D:3:ab::ORD"), None);
        assert_eq!(
            RecordView::parse_located(b"3:D:2:00ff:0:ORD:1"),
            RecordView::parse(b"3:D:2:00ff:0:ORD:1")
        );
        for bad in [
            "@w1=2;D:2:",
            "@w1=2",
            "",
            "X:1:",
            "H:1:",
            "3:H:1:ab::",
            "3:D:1:ab:5.6:",
            "3:R:1:ab:x:",
            "3:C:1:ab:5:",
            "3:H:1:ab:5.6.:",
            "3:H:1:ab:5.6.7.8:",
            "3:X:1:ab:5..7:",
            "D::",
            "D:x:",
            "3:D:1:zz::",
            "3:Q:1:ab::",
            "garbage",
        ] {
            assert_eq!(Record::parse(bad), None, "{bad:?}");
        }
    }
}

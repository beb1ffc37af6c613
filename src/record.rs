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
//! `<expires_at>.<held_at>`, milliseconds of Redis time.

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
    fn from_letter(letter: &str) -> Option<State> {
        match letter {
            "D" => Some(State::Deducted),
            "R" => Some(State::Reverted),
            "V" => Some(State::Revoked),
            "H" => Some(State::Held),
            "C" => Some(State::Confirmed),
            "X" => Some(State::Expired),
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

/// One record, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: State,
    pub qty: u64,
    /// The call that wrote it (empty in records of scripts before 3).
    pub nonce: String,
    /// A hold's expiry and start, ms of Redis time (hold states only).
    pub hold: Option<(u64, u64)>,
    pub order_no: String,
}

impl Record {
    /// Parses a record's value; `None` for any shape the scripts would call
    /// BADRECORD.
    pub fn parse(raw: &str) -> Option<Record> {
        let (state, qty, nonce, aux, order_no) = match raw.strip_prefix("3:") {
            Some(rest) => {
                let mut fields = rest.splitn(5, ':');
                let (state, qty, nonce, aux, order_no) = (
                    fields.next()?,
                    fields.next()?,
                    fields.next()?,
                    fields.next()?,
                    fields.next()?,
                );
                if !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                (state, qty, nonce, aux, order_no)
            }
            None => {
                let mut fields = raw.splitn(3, ':');
                let (state, qty, order_no) = (fields.next()?, fields.next()?, fields.next()?);
                if !matches!(state, "D" | "R" | "V") {
                    return None;
                }
                (state, qty, "", "", order_no)
            }
        };
        if qty.is_empty() || !qty.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let state = State::from_letter(state)?;
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let hold = match (state.is_hold(), aux.split_once('.')) {
            (true, Some((expires, held))) => Some((number(expires)?, number(held)?)),
            // Version 3 read (and ignored) digits here; so does this one.
            (false, _) if aux.bytes().all(|b| b.is_ascii_digit()) => None,
            _ => return None,
        };
        Some(Record {
            state,
            qty: qty.parse().ok()?,
            nonce: nonce.to_owned(),
            hold,
            order_no: order_no.to_owned(),
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
        for bad in [
            "",
            "X:1:",
            "H:1:",
            "3:H:1:ab::",
            "3:D:1:ab:5.6:",
            "3:R:1:ab:x:",
            "3:C:1:ab:5:",
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

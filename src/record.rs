//! The idempotency record as Rust reads it: for `stock export`'s neighbours,
//! audits and tests. The scripts write records; `lua/common.lua` is the
//! other half of this fact and documents the format, and a test checks the
//! two agree.
//!
//! ```text
//! 3:<state>:<qty>:<nonce>:<aux>:<order_no>   written since script version 3
//! <state>:<qty>:<order_no>                   written by versions 1 and 2
//! ```

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// qty units were deducted.
    Deducted,
    /// qty units were deducted, then given back.
    Reverted,
    /// A REVERT came first; the id may never deduct.
    Revoked,
}

impl State {
    fn from_letter(letter: &str) -> Option<State> {
        match letter {
            "D" => Some(State::Deducted),
            "R" => Some(State::Reverted),
            "V" => Some(State::Revoked),
            _ => None,
        }
    }

    /// The record's letter for it.
    pub fn letter(self) -> char {
        match self {
            State::Deducted => 'D',
            State::Reverted => 'R',
            State::Revoked => 'V',
        }
    }
}

/// One record, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: State,
    pub qty: u64,
    /// The call that wrote it (empty in records of scripts before 3).
    pub nonce: String,
    pub order_no: String,
}

impl Record {
    /// Parses a record's value; `None` for any shape the scripts would call
    /// BADRECORD.
    pub fn parse(raw: &str) -> Option<Record> {
        let (state, qty, nonce, order_no) = match raw.strip_prefix("3:") {
            Some(rest) => {
                let mut fields = rest.splitn(5, ':');
                let (state, qty, nonce, aux, order_no) = (
                    fields.next()?,
                    fields.next()?,
                    fields.next()?,
                    fields.next()?,
                    fields.next()?,
                );
                if !nonce.bytes().all(|b| b.is_ascii_hexdigit())
                    || !aux.bytes().all(|b| b.is_ascii_digit())
                {
                    return None;
                }
                (state, qty, nonce, order_no)
            }
            None => {
                let mut fields = raw.splitn(3, ':');
                let (state, qty, order_no) = (fields.next()?, fields.next()?, fields.next()?);
                (state, qty, "", order_no)
            }
        };
        if qty.is_empty() || !qty.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Record {
            state: State::from_letter(state)?,
            qty: qty.parse().ok()?,
            nonce: nonce.to_owned(),
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
        for bad in [
            "",
            "X:1:",
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

//! The business code table, and the reply DEDUCT, REVERT, HOLD and CONFIRM
//! give.
//!
//! This module is the one place that knows what each code means. A code's
//! meaning never changes once published; new information is added as new
//! reply elements or new codes, never by redefining one (codes 4 and 5
//! came later and left the others as they were).

use crate::answer::{self, Item, Shape};
use crate::error::{FaultKind, UpstreamError};
use bytes::Bytes;
use redis::Value;

/// The version of the script set this build ships (the fourth reply
/// element); `lua/common.lua` says the same, and a test checks they agree.
/// 1: DEDUCT only. 2: REVERT and code 4. 3: records name the call that
/// wrote them (a resent call answers as it did the first time), and
/// stockgate's own arguments, when wrong, are a BADCALL error. 4: holds
/// (HOLD, CONFIRM, code 5), released by Redis time; every reply carries
/// eight elements.
pub const SCRIPT_VERSION: i64 = 4;

/// A business outcome: what happened to the stock. System faults are never
/// a `Code`; they are [`UpstreamError`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// Done: deducted (DEDUCT) or given back (REVERT).
    Ok = 0,
    /// This request_id was already applied; nothing changed.
    Duplicate = 1,
    /// Not enough stock; nothing changed.
    Insufficient = 2,
    /// Invalid parameters; nothing changed.
    Invalid = 3,
    /// The request_id was revoked: reverted, or revoked by a REVERT (or a
    /// CONFIRM) that came before any DEDUCT or HOLD. It never deducts.
    Revoked = 4,
    /// The request's hold ran out (by Redis time) before this call, and its
    /// units went back to stock.
    Expired = 5,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 6] = [
        Code::Ok,
        Code::Duplicate,
        Code::Insufficient,
        Code::Invalid,
        Code::Revoked,
        Code::Expired,
    ];

    /// The code a script reply carries, if this build knows it.
    pub fn from_wire(code: i64) -> Option<Code> {
        Code::ALL.into_iter().find(|c| *c as i64 == code)
    }

    /// The `result` label of the request metrics.
    pub fn label(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::Duplicate => "duplicate",
            Code::Insufficient => "insufficient",
            Code::Invalid => "invalid",
            Code::Revoked => "revoked",
            Code::Expired => "expired",
        }
    }
}

/// The reply to one DEDUCT or REVERT, `[code, remain, order_no, version]`
/// plus a human reason for code 3; HOLD and CONFIRM put the hold's expiry
/// fifth, before the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockReply {
    pub code: Code,
    /// Stock after the call (code 0), the current stock (other codes), or
    /// -1 when not known.
    pub remain: i64,
    /// The order_no of the deduction this reply is about (see "DEDUCT and
    /// REVERT" in docs/holds-and-orders.md); empty when there is none.
    pub order_no: Bytes,
    pub version: i64,
    /// The hold's expiry, in milliseconds of Redis time (0 when there is no
    /// hold to speak of): HOLD and CONFIRM replies only.
    pub expires_at: Option<i64>,
    /// Why the parameters were refused (code 3 only).
    pub reason: Option<Bytes>,
    /// What each location gave an allocation (DEDUCT.AT, HOLD.AT), in the
    /// order taken (a retry's: what the first call took); `None` for every
    /// other reply. Shown as the seventh element.
    /// Boxed: most replies have none, and every reply moves this struct.
    pub allocation: Option<Box<Allocation>>,
    /// What the call did besides its answer, for the metrics; never sent.
    pub effects: Effects,
}

/// What each location gave an allocation, in the order taken.
pub type Allocation = Vec<(Bytes, i64)>;

/// What a script call did that its caller is not told: from the elements
/// after the sixth of a version-4 reply (none from older scripts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effects {
    /// The SKU's expired holds the call gave back to stock first.
    pub released: u32,
    /// For a CONFIRM that confirmed: how long the units were held (ms; at
    /// most u32's, 49 days, which the metrics' buckets end far below).
    pub held_ms: u32,
    /// What the call did to the request's own hold.
    pub event: Option<HoldEvent>,
    /// A DEDUCT's 2: the SKU had units on hold then (the script's tenth
    /// element is their count; false in every other reply). A read can't
    /// answer for a SKU with holds ([`crate::stock::sold_out`]).
    pub held: bool,
}

/// What happens to a hold, for `stockgate_holds_total`. `Expired` is
/// counted from [`Effects::released`], whichever call released it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEvent {
    Placed,
    Confirmed,
    Cancelled,
    Expired,
    /// HOLD.EXTEND moved a live hold's expiry later.
    Extended,
    /// HOLD.SHRINK gave some of a live hold's units back.
    Shrunk,
}

impl HoldEvent {
    pub const ALL: [HoldEvent; 6] = [
        HoldEvent::Placed,
        HoldEvent::Confirmed,
        HoldEvent::Cancelled,
        HoldEvent::Expired,
        HoldEvent::Extended,
        HoldEvent::Shrunk,
    ];

    /// The `event` label, and the script's word for it.
    pub fn label(self) -> &'static str {
        match self {
            HoldEvent::Placed => "placed",
            HoldEvent::Confirmed => "confirmed",
            HoldEvent::Cancelled => "cancelled",
            HoldEvent::Expired => "expired",
            HoldEvent::Extended => "extended",
            HoldEvent::Shrunk => "shrunk",
        }
    }

    fn from_script(word: &[u8]) -> Option<HoldEvent> {
        HoldEvent::ALL
            .into_iter()
            .find(|e| e.label().as_bytes() == word)
    }
}

impl StockReply {
    /// A code 3 decided by stockgate before anything is sent to Redis.
    pub fn invalid(reason: impl Into<Bytes>) -> Self {
        StockReply {
            code: Code::Invalid,
            remain: -1,
            order_no: Bytes::new(),
            version: SCRIPT_VERSION,
            expires_at: None,
            reason: Some(reason.into()),
            allocation: None,
            effects: Effects::default(),
        }
    }

    /// The reply as HOLD and CONFIRM show it (with the hold's expiry), or
    /// as DEDUCT and REVERT do (without).
    pub fn show_expiry(&mut self, shown: bool) {
        self.expires_at = if shown {
            Some(self.expires_at.unwrap_or(0))
        } else {
            None
        };
    }

    /// Maps a script's reply from the redis crate, checking its shape.
    pub fn from_script(value: Value) -> Result<StockReply, UpstreamError> {
        let shown = || format!("{value:?}");
        let Value::Array(items) = &value else {
            return Err(bad_reply("is not an array", shown));
        };
        let fields = items.iter().map(|item| match item {
            Value::Int(i) => Field::Int(*i),
            Value::BulkString(b) => Field::Text(Bytes::copy_from_slice(b)),
            Value::SimpleString(s) => Field::Text(Bytes::copy_from_slice(s.as_bytes())),
            _ => Field::Other,
        });
        let mut reply = StockReply::from_fields(fields, shown)?;
        if let Some(Value::Array(flat)) = items.get(ALLOCATION_AT) {
            let mut allocation = Vec::with_capacity(flat.len() / 2);
            for pair in flat.chunks(2) {
                match pair {
                    [Value::BulkString(name), Value::Int(units)] => {
                        allocation.push((Bytes::copy_from_slice(name), *units))
                    }
                    _ => {
                        return Err(bad_reply(
                            "has an allocation that is not location, units pairs",
                            shown,
                        ));
                    }
                }
            }
            reply.allocation = Some(Box::new(allocation));
        }
        Ok(reply)
    }

    /// Maps a script's reply as the node pipes read it: its raw bytes, as
    /// Redis sent them (the order_no is a slice of them, not a copy).
    pub fn from_raw(frame: &bytes::Bytes) -> Result<StockReply, UpstreamError> {
        if let Some(reply) = StockReply::from_flat(frame) {
            return Ok(reply);
        }
        let shown = || String::from_utf8_lossy(frame).into_owned();
        let Shape::Array(count) = answer::shape(frame) else {
            return Err(bad_reply("is not an array", shown));
        };
        let fields = answer::items(frame).map(|item| match item {
            Item::Integer(i) => Field::Int(i),
            Item::Text(b) => Field::Text(b),
            Item::Other => Field::Other,
        });
        let mut reply = StockReply::from_fields(fields, shown)?;
        let eleventh = answer::elements(frame, count).and_then(|mut e| e.nth(ALLOCATION_AT));
        if let Some(element) = eleventh.filter(|e| e.first() == Some(&b'*')) {
            let allocation = answer::flat(&element)
                .and_then(|mut array| allocation_of(&element, &mut array))
                .ok_or_else(|| {
                    bad_reply("has an allocation that is not location, units pairs", shown)
                })?;
            reply.allocation = Some(Box::new(allocation));
        }
        Ok(reply)
    }

    /// [`StockReply::from_raw`] in one pass over the bytes, for a reply of
    /// the expected shape; `None` for anything else, which the element by
    /// element reading then refuses with the exact reason.
    fn from_flat(frame: &bytes::Bytes) -> Option<StockReply> {
        let mut flat = answer::flat(frame)?;
        if flat.left < 4 {
            return None;
        }
        let code = Code::from_wire(flat.int()?)?;
        let remain = flat.int()?;
        let order_no = flat.text()?;
        let version = flat.int().filter(|v| *v >= 1)?;
        let reason = match flat.left {
            0 => None,
            _ => Some(flat.text()?).filter(|r| !r.is_empty()),
        };
        let mut number = || match flat.left {
            0 => Some(None),
            _ => flat.int().filter(|n| *n >= 0).map(Some),
        };
        let expires_at = number()?;
        let released = number()?.unwrap_or(0);
        let held_ms = number()?.unwrap_or(0);
        let event = match flat.left {
            0 => None,
            _ => {
                let word = flat.text()?;
                if word.is_empty() {
                    None
                } else {
                    Some(HoldEvent::from_script(&frame[word])?)
                }
            }
        };
        let held = match flat.left {
            0 => 0,
            _ => flat.int().filter(|n| *n >= 0)?,
        };
        // An eleventh element that is an array is an allocation; anything
        // else after the tenth, a newer script's, is left unread.
        let allocation = match flat.array() {
            Some(mut array) => Some(Box::new(allocation_of(frame, &mut array)?)),
            None => None,
        };
        Some(StockReply {
            code,
            remain,
            order_no: frame.slice(order_no),
            version,
            expires_at,
            reason: reason.map(|r| frame.slice(r)),
            allocation,
            effects: Effects {
                released: u32::try_from(released).unwrap_or(u32::MAX),
                held_ms: u32::try_from(held_ms).unwrap_or(u32::MAX),
                event,
                held: held > 0,
            },
        })
    }

    /// Checks the shape: `{code, remain, order_no, version}`, then (from
    /// version 4) `reason, expires_at, released, held_ms, event, held`,
    /// where an older script put only a reason, for code 3. Elements after
    /// the tenth are ignored, so a newer script that appends some still
    /// works; anything else unexpected is a BADREPLY, never a guessed code.
    fn from_fields(
        fields: impl Iterator<Item = Field>,
        shown: impl Fn() -> String,
    ) -> Result<StockReply, UpstreamError> {
        // The first ten, on the stack: a reply is read once per request.
        let mut first: [Option<Field>; 10] = Default::default();
        let mut count = 0;
        for (slot, field) in first.iter_mut().zip(fields) {
            *slot = Some(field);
            count += 1;
        }
        if count < 4 {
            return Err(bad_reply("has fewer than 4 elements", shown));
        }
        let int = |f: &Option<Field>| match f {
            Some(Field::Int(i)) => Some(*i),
            _ => None,
        };
        let text = |f: &Option<Field>| match f {
            Some(Field::Text(b)) => Some(b.clone()),
            _ => None,
        };
        let code = int(&first[0])
            .and_then(Code::from_wire)
            .ok_or_else(|| bad_reply("has an unknown code", &shown))?;
        let remain = int(&first[1]).ok_or_else(|| bad_reply("has a non-integer remain", &shown))?;
        let order_no =
            text(&first[2]).ok_or_else(|| bad_reply("has a non-string order_no", &shown))?;
        let version = int(&first[3])
            .filter(|v| *v >= 1)
            .ok_or_else(|| bad_reply("has no valid version", &shown))?;
        let reason = match &first[4] {
            Some(_) => {
                Some(text(&first[4]).ok_or_else(|| bad_reply("has a non-string reason", &shown))?)
                    .filter(|r| !r.is_empty())
            }
            None => None,
        };
        // Integers from here on, where present.
        let number = |i: usize, what: &str| match &first[i] {
            None => Ok(0),
            Some(_) => int(&first[i])
                .filter(|n| *n >= 0)
                .ok_or_else(|| bad_reply(what, &shown)),
        };
        let expires_at = first[5]
            .is_some()
            .then(|| number(5, "has a bad expires_at"))
            .transpose()?;
        let released = number(6, "has a bad released count")?;
        let held_ms = number(7, "has a bad held_ms")?;
        let held = number(9, "has a bad held count")?;
        let event = match &first[8] {
            None => None,
            Some(Field::Text(word)) if word.is_empty() => None,
            Some(Field::Text(word)) => Some(
                HoldEvent::from_script(word)
                    .ok_or_else(|| bad_reply("has an unknown hold event", &shown))?,
            ),
            Some(_) => return Err(bad_reply("has a non-string hold event", &shown)),
        };
        Ok(StockReply {
            code,
            remain,
            order_no,
            version,
            expires_at,
            reason,
            allocation: None,
            effects: Effects {
                released: u32::try_from(released).unwrap_or(u32::MAX),
                held_ms: u32::try_from(held_ms).unwrap_or(u32::MAX),
                event,
                held: held > 0,
            },
        })
    }
}

/// Where a reply of `lua/allocate.lua`'s deduct and hold has its
/// allocation: after answer()'s ten elements.
const ALLOCATION_AT: usize = 10;

/// An allocation, `[location, units, ...]` (`array`, read from `frame`):
/// its pairs, or `None` for anything else.
fn allocation_of(frame: &bytes::Bytes, array: &mut answer::Flat<'_>) -> Option<Allocation> {
    if !array.left.is_multiple_of(2) {
        return None;
    }
    let mut allocation = Vec::with_capacity(array.left / 2);
    while array.left > 0 {
        let location = array.text()?;
        allocation.push((frame.slice(location), array.int()?));
    }
    Some(allocation)
}

/// One element of a script's reply, whichever client decoded it.
enum Field {
    Int(i64),
    Text(Bytes),
    Other,
}

fn bad_reply(why: &str, shown: impl Fn() -> String) -> UpstreamError {
    let mut shown = shown();
    shown.truncate(200);
    UpstreamError::new(FaultKind::BadReply, format!("script reply {why}: {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script reply in RESP2 from its elements: `i:` an integer, `s:` a
    /// bulk string, `nil`.
    fn reply(elements: &[&str]) -> bytes::Bytes {
        let mut out = format!("*{}\r\n", elements.len());
        for e in elements {
            if let Some(i) = e.strip_prefix("i:") {
                out += &format!(":{i}\r\n");
            } else if let Some(t) = e.strip_prefix("s:") {
                out += &format!("${}\r\n{t}\r\n", t.len());
            } else {
                out += "$-1\r\n";
            }
        }
        bytes::Bytes::from(out)
    }

    use proptest::prelude::*;

    fn element() -> impl Strategy<Value = String> {
        prop_oneof![
            (-3i64..20).prop_map(|i| format!("i:{i}")),
            prop_oneof![Just(""), Just("ORD-1"), Just("placed"), Just("x y")]
                .prop_map(|t| format!("s:{t}")),
            Just("nil".to_string()),
        ]
    }

    proptest! {
        /// The one-pass reading answers exactly what the element by
        /// element reading does, whenever it answers at all.
        #[test]
        fn the_fast_reading_agrees_with_the_careful_one(
            head in prop::collection::vec(element(), 4),
            codes in (0i64..7, -2i64..5, 0i64..6),
            tail in prop::collection::vec(element(), 0..9),
            typed in any::<bool>(),
        ) {
            // Mostly a well-typed head, so that the fast reading answers.
            let mut elements = head;
            if typed {
                elements[0] = format!("i:{}", codes.0);
                elements[1] = format!("i:{}", codes.1);
                elements[2] = "s:ORD-1".into();
                elements[3] = format!("i:{}", codes.2);
            }
            elements.extend(tail);
            let elements: Vec<&str> = elements.iter().map(String::as_str).collect();
            let frame = reply(&elements);
            let careful = StockReply::from_fields(
                answer::items(&frame).map(|item| match item {
                    Item::Integer(i) => Field::Int(i),
                    Item::Text(b) => Field::Text(b),
                    Item::Other => Field::Other,
                }),
                String::new,
            );
            if let Some(fast) = StockReply::from_flat(&frame) {
                prop_assert_eq!(Ok(fast), careful.map_err(|e| e.to_string()));
            }
        }
    }

    #[test]
    fn the_usual_replies_are_read_in_one_pass() {
        for elements in [
            &["i:0", "i:98", "s:ORD-1001", "i:4"][..],
            &["i:3", "i:-1", "s:", "i:4", "s:qty must be an integer"],
            &[
                "i:0",
                "i:7",
                "s:",
                "i:4",
                "s:",
                "i:1700000000000",
                "i:2",
                "i:0",
                "s:placed",
                "i:3",
            ],
        ] {
            assert!(
                StockReply::from_flat(&reply(elements)).is_some(),
                "{elements:?}"
            );
        }
    }

    #[test]
    fn wire_values_are_the_published_ones() {
        assert_eq!(Code::from_wire(0), Some(Code::Ok));
        assert_eq!(Code::from_wire(1), Some(Code::Duplicate));
        assert_eq!(Code::from_wire(2), Some(Code::Insufficient));
        assert_eq!(Code::from_wire(3), Some(Code::Invalid));
        assert_eq!(Code::from_wire(4), Some(Code::Revoked));
        assert_eq!(Code::from_wire(5), Some(Code::Expired));
        assert_eq!(Code::from_wire(6), None);
        assert_eq!(Code::from_wire(-1), None);
    }

    #[test]
    fn script_replies_map_to_codes_and_extra_elements_are_ignored() {
        let reply = StockReply::from_script(Value::Array(vec![
            Value::Int(5),
            Value::Int(7),
            Value::BulkString(b"ORD".to_vec()),
            Value::Int(4),
            Value::BulkString(vec![]),
            Value::Int(1_790_000_000_000),
            Value::Int(2),
            Value::Int(0),
            Value::BulkString(vec![]),
            Value::Int(3),
            Value::BulkString(b"appended later".to_vec()),
        ]))
        .unwrap();
        assert_eq!(reply.code, Code::Expired);
        assert_eq!(reply.remain, 7);
        assert_eq!(&reply.order_no[..], b"ORD");
        assert_eq!(reply.reason, None, "an empty reason is none");
        assert_eq!(reply.expires_at, Some(1_790_000_000_000));
        assert_eq!(reply.effects.released, 2);
        assert!(reply.effects.held);
        // A version-3 script's code 3: four elements and the reason.
        let old = StockReply::from_script(Value::Array(vec![
            Value::Int(3),
            Value::Int(-1),
            Value::BulkString(vec![]),
            Value::Int(3),
            Value::BulkString(b"qty must be".to_vec()),
        ]))
        .unwrap();
        assert_eq!(
            (old.code, old.version, old.reason.as_deref()),
            (Code::Invalid, 3, Some(&b"qty must be"[..])),
            "an older script's reply is still understood"
        );
        assert_eq!(old.effects, Effects::default());
    }

    #[test]
    fn odd_script_replies_are_bad_replies_not_codes() {
        let four = |code: Value, version: Value| {
            Value::Array(vec![
                code,
                Value::Int(1),
                Value::BulkString(vec![]),
                version,
            ])
        };
        let odd = [
            Value::Okay,
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::BulkString(vec![]),
            ]),
            four(Value::Int(9), Value::Int(1)),
            four(Value::BulkString(b"0".to_vec()), Value::Int(1)),
            four(Value::Int(0), Value::Int(0)),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::BulkString(vec![]),
                Value::Int(4),
                Value::BulkString(vec![]),
                Value::Int(-5),
            ]),
        ];
        for value in odd {
            let err = StockReply::from_script(value).unwrap_err();
            assert_eq!(err.kind, FaultKind::BadReply);
            assert!(err.reply_text().starts_with("BADREPLY script reply"));
        }
    }
}

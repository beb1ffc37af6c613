//! The business code table, and the reply DEDUCT and REVERT give.
//!
//! This module is the one place that knows what each code means. A code's
//! meaning never changes once published; new information is added as new
//! reply elements or new codes, never by redefining one (code 4 came later
//! and left 0 to 3 as they were).

use crate::answer::{self, Item, Shape};
use crate::error::{FaultKind, UpstreamError};
use bytes::Bytes;
use redis::Value;

/// The version of the script set this build ships (the fourth reply
/// element); `lua/common.lua` says the same, and a test checks they agree.
/// 1: DEDUCT only. 2: REVERT and code 4. 3: records name the call that
/// wrote them (a resent call answers as it did the first time), and
/// stockgate's own arguments, when wrong, are a BADCALL error.
pub const SCRIPT_VERSION: i64 = 3;

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
    /// The request_id was revoked: reverted, or revoked by a REVERT that
    /// came before any DEDUCT. It never deducts.
    Revoked = 4,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 5] = [
        Code::Ok,
        Code::Duplicate,
        Code::Insufficient,
        Code::Invalid,
        Code::Revoked,
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
        }
    }
}

/// The reply to one DEDUCT or REVERT: `[code, remain, order_no, version]`,
/// plus a human reason for code 3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockReply {
    pub code: Code,
    /// Stock after the call (code 0), the current stock (other codes), or
    /// -1 when not known.
    pub remain: i64,
    /// The order_no of the deduction this reply is about (see the README's
    /// contract table); empty when there is none.
    pub order_no: Bytes,
    pub version: i64,
    /// Why the parameters were refused (code 3 only).
    pub reason: Option<Bytes>,
}

impl StockReply {
    /// A code 3 decided by stockgate before anything is sent to Redis.
    pub fn invalid(reason: impl Into<Bytes>) -> Self {
        StockReply {
            code: Code::Invalid,
            remain: -1,
            order_no: Bytes::new(),
            version: SCRIPT_VERSION,
            reason: Some(reason.into()),
        }
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
        StockReply::from_fields(fields, shown)
    }

    /// Maps a script's reply as the node pipes read it: its raw bytes, as
    /// Redis sent them (the order_no is a slice of them, not a copy).
    pub fn from_raw(frame: &bytes::Bytes) -> Result<StockReply, UpstreamError> {
        let shown = || String::from_utf8_lossy(frame).into_owned();
        if !matches!(answer::shape(frame), Shape::Array(_)) {
            return Err(bad_reply("is not an array", shown));
        }
        let fields = answer::items(frame).map(|item| match item {
            Item::Integer(i) => Field::Int(i),
            Item::Text(b) => Field::Text(b),
            Item::Other => Field::Other,
        });
        StockReply::from_fields(fields, shown)
    }

    /// Checks the shape. Elements after the fifth are ignored, so a newer
    /// script that appends some still works; anything else unexpected is a
    /// BADREPLY, never a guessed code.
    fn from_fields(
        fields: impl Iterator<Item = Field>,
        shown: impl Fn() -> String,
    ) -> Result<StockReply, UpstreamError> {
        // The first five, on the stack: a reply is read once per request.
        let mut first: [Option<Field>; 5] = Default::default();
        let mut count = 0;
        for (slot, field) in first.iter_mut().zip(fields) {
            *slot = Some(field);
            count += 1;
        }
        if count < 4 {
            return Err(bad_reply("has fewer than 4 elements", shown));
        }
        let [Some(f0), Some(f1), Some(f2), Some(f3), f4] = first else {
            unreachable!("four fields were counted")
        };
        let fields = [f0, f1, f2, f3];
        let int = |f: &Field| match f {
            Field::Int(i) => Some(*i),
            _ => None,
        };
        let text = |f: &Field| match f {
            Field::Text(b) => Some(b.clone()),
            _ => None,
        };
        let code = int(&fields[0])
            .and_then(Code::from_wire)
            .ok_or_else(|| bad_reply("has an unknown code", &shown))?;
        let remain =
            int(&fields[1]).ok_or_else(|| bad_reply("has a non-integer remain", &shown))?;
        let order_no =
            text(&fields[2]).ok_or_else(|| bad_reply("has a non-string order_no", &shown))?;
        let version = int(&fields[3])
            .filter(|v| *v >= 1)
            .ok_or_else(|| bad_reply("has no valid version", &shown))?;
        let reason = match &f4 {
            Some(f) => Some(text(f).ok_or_else(|| bad_reply("has a non-string reason", &shown))?),
            None => None,
        };
        Ok(StockReply {
            code,
            remain,
            order_no,
            version,
            reason,
        })
    }
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

    #[test]
    fn wire_values_are_the_published_ones() {
        assert_eq!(Code::from_wire(0), Some(Code::Ok));
        assert_eq!(Code::from_wire(1), Some(Code::Duplicate));
        assert_eq!(Code::from_wire(2), Some(Code::Insufficient));
        assert_eq!(Code::from_wire(3), Some(Code::Invalid));
        assert_eq!(Code::from_wire(4), Some(Code::Revoked));
        assert_eq!(Code::from_wire(5), None);
        assert_eq!(Code::from_wire(-1), None);
    }

    #[test]
    fn script_replies_map_to_codes_and_extra_elements_are_ignored() {
        let reply = StockReply::from_script(Value::Array(vec![
            Value::Int(1),
            Value::Int(7),
            Value::BulkString(b"ORD".to_vec()),
            Value::Int(1),
            Value::BulkString(b"appended later".to_vec()),
            Value::Int(99),
        ]))
        .unwrap();
        assert_eq!(reply.code, Code::Duplicate);
        assert_eq!(reply.remain, 7);
        assert_eq!(&reply.order_no[..], b"ORD");
        assert_eq!(
            reply.version, 1,
            "an older script's reply is still understood"
        );
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
        ];
        for value in odd {
            let err = StockReply::from_script(value).unwrap_err();
            assert_eq!(err.kind, FaultKind::BadReply);
            assert!(err.reply_text().starts_with("BADREPLY script reply"));
        }
    }
}

//! Request parameters, validated before anything is sent to Redis.
//!
//! A value of one of these types has passed its rules, so the rest of the
//! code never re-checks them. The Lua script checks them again (defence in
//! depth), with the same rules.

use bytes::Bytes;
use std::fmt;

/// Longest sku, request_id or order_no, in bytes.
pub const MAX_FIELD_LEN: usize = 128;

/// A parameter that breaks its rules; the text is the code-3 reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidParam(pub String);

impl fmt::Display for InvalidParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// 1 to 128 bytes of printable ASCII, no whitespace, no `{` or `}`: the
/// shape of a sku or a request_id. Braces are refused because the sku is the
/// cluster hash tag; a brace inside it would move the tag.
fn is_token(value: &[u8]) -> bool {
    (1..=MAX_FIELD_LEN).contains(&value.len())
        && value
            .iter()
            .all(|&b| b.is_ascii_graphic() && b != b'{' && b != b'}')
}

/// A stock-keeping unit: the thing whose stock is counted, and the hash tag
/// of both keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sku(Bytes);

impl Sku {
    pub fn parse(value: Bytes) -> Result<Sku, InvalidParam> {
        if is_token(&value) {
            Ok(Sku(value))
        } else {
            Err(InvalidParam(
                "sku must be 1 to 128 printable ASCII bytes without whitespace, '{' or '}'".into(),
            ))
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The caller's idempotency token: one deduction per (sku, request_id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(Bytes);

impl RequestId {
    pub fn parse(value: Bytes) -> Result<RequestId, InvalidParam> {
        if is_token(&value) {
            Ok(RequestId(value))
        } else {
            Err(InvalidParam(
                "request_id must be 1 to 128 printable ASCII bytes without whitespace, '{' or '}'"
                    .into(),
            ))
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Units to deduct: a canonical decimal integer from 1 to the configured
/// maximum. Only the canonical spelling (no sign, no leading zero) is taken,
/// so a retry compares equal to its first call byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qty {
    value: u64,
    text: Bytes,
}

impl Qty {
    pub fn parse(text: Bytes, max: u64) -> Result<Qty, InvalidParam> {
        let canonical = !text.is_empty()
            && text.len() <= 16
            && text[0] != b'0'
            && text.iter().all(u8::is_ascii_digit);
        let value = canonical
            .then(|| std::str::from_utf8(&text).ok()?.parse::<u64>().ok())
            .flatten()
            .filter(|v| (1..=max).contains(v));
        match value {
            Some(value) => Ok(Qty { value, text }),
            None => Err(InvalidParam(format!(
                "qty must be an integer from 1 to {max}"
            ))),
        }
    }

    pub fn get(&self) -> u64 {
        self.value
    }

    /// The decimal text, as the caller sent it (it is canonical).
    pub fn as_bytes(&self) -> &[u8] {
        &self.text
    }
}

/// The caller's order number, echoed back and stored with the record:
/// at most 128 bytes of printable ASCII (space included); empty when absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OrderNo(Bytes);

impl OrderNo {
    pub fn parse(value: Bytes) -> Result<OrderNo, InvalidParam> {
        if value.len() <= MAX_FIELD_LEN && value.iter().all(|&b| (b' '..=b'~').contains(&b)) {
            Ok(OrderNo(value))
        } else {
            Err(InvalidParam(
                "order_no must be at most 128 printable ASCII bytes".into(),
            ))
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn sku_rules() {
        assert!(Sku::parse(b("sku-1:red/XL")).is_ok());
        assert!(Sku::parse(b(&"x".repeat(128))).is_ok());
        for bad in ["", "a b", "a{b", "a}b", "tab\there", "é"] {
            assert!(Sku::parse(b(bad)).is_err(), "{bad:?} should be refused");
        }
        assert!(Sku::parse(b(&"x".repeat(129))).is_err());
        assert!(Sku::parse(Bytes::from_static(b"nul\0")).is_err());
    }

    #[test]
    fn qty_rules() {
        assert_eq!(Qty::parse(b("1"), 10).unwrap().get(), 1);
        assert_eq!(Qty::parse(b("10"), 10).unwrap().get(), 10);
        for bad in [
            "0",
            "11",
            "-1",
            "+1",
            "01",
            "1.0",
            " 1",
            "",
            "x",
            "99999999999999999",
        ] {
            let err = Qty::parse(b(bad), 10).unwrap_err();
            assert_eq!(err.0, "qty must be an integer from 1 to 10", "{bad:?}");
        }
    }

    #[test]
    fn order_no_rules() {
        assert!(OrderNo::parse(b("")).is_ok());
        assert!(OrderNo::parse(b("ORD 2026/11 #7")).is_ok());
        assert!(OrderNo::parse(b(&"o".repeat(128))).is_ok());
        assert!(OrderNo::parse(b(&"o".repeat(129))).is_err());
        assert!(OrderNo::parse(b("line\nbreak")).is_err());
    }
}

//! Request parameters, validated before anything is sent to Redis.
//!
//! A value of one of these types has passed its rules, so the rest of the
//! code never re-checks them. The Lua script checks them again (defence in
//! depth), with the same rules.

use bytes::Bytes;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest sku, request_id or order_no, in bytes.
pub const MAX_FIELD_LEN: usize = 128;

/// Largest stock the scripts handle exactly: Lua numbers are doubles.
pub const MAX_STOCK: i64 = 9_007_199_254_740_991;

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
        && all_bytes(value, |word| {
            in_range(word, 0x21, 0x7e) && !has_byte(word, b'{') && !has_byte(word, b'}')
        })
}

/// Printable ASCII, space included: what an order_no may hold.
fn is_printable(value: &[u8]) -> bool {
    all_bytes(value, |word| in_range(word, 0x20, 0x7e))
}

/// Whether every 8-byte word of `value` passes `word_ok`, eight bytes at a
/// time (the tail padded with a byte that passes: `!`); each request
/// checks two or three fields of up to 128 bytes.
#[inline(always)]
fn all_bytes(value: &[u8], word_ok: impl Fn(u64) -> bool) -> bool {
    let mut chunks = value.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        if !word_ok(word) {
            return false;
        }
    }
    let rest = chunks.remainder();
    if rest.is_empty() {
        return true;
    }
    let mut last = [b'!'; 8];
    last[..rest.len()].copy_from_slice(rest);
    word_ok(u64::from_le_bytes(last))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether every byte of `word` is within `low..=high` (both at most 0x7f).
#[inline(always)]
fn in_range(word: u64, low: u8, high: u8) -> bool {
    // A byte below `low`, or above `high`, or with its top bit set, sets
    // its top bit in one of these.
    let below = word.wrapping_sub(ONES * u64::from(low)) & !word;
    let above = word.wrapping_add(ONES * u64::from(0x7f - high)) | word;
    (below | above) & HIGHS == 0
}

/// Whether `word` holds the byte `byte`.
#[inline(always)]
fn has_byte(word: u64, byte: u8) -> bool {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// Which bytes a token may hold (printable ASCII but braces), one by one:
/// what [`is_token`] checks eight at a time.
#[cfg(test)]
const TOKEN_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_graphic() && byte != b'{' && byte != b'}';
        b += 1;
    }
    table
};

/// A stock-keeping unit: the thing whose stock is counted, and the hash tag
/// of both keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sku(Bytes);

impl Sku {
    /// The sku's bytes, shared (no copy).
    pub fn to_bytes(&self) -> Bytes {
        self.0.clone()
    }

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

    /// When the id says it was made, if it is a time-ordered id: a ULID
    /// (26 Crockford base32 characters, the first 10 a millisecond time) or
    /// a UUIDv7 (the first 48 bits a millisecond time).
    pub fn embedded_time(&self) -> Option<SystemTime> {
        let millis = ulid_millis(&self.0).or_else(|| uuid_v7_millis(&self.0))?;
        UNIX_EPOCH.checked_add(Duration::from_millis(millis))
    }
}

fn ulid_millis(id: &[u8]) -> Option<u64> {
    const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    if id.len() != 26 {
        return None;
    }
    let mut digits = id.iter().map(|c| {
        CROCKFORD
            .iter()
            .position(|d| *d == c.to_ascii_uppercase())
            .map(|v| v as u64)
    });
    // All 26 must be base32 for this to be a ULID at all.
    let values: Vec<u64> = digits.by_ref().collect::<Option<_>>()?;
    // 10 characters carry 50 bits; a ULID's time is 48, so the first is 0-7.
    if values[0] > 7 {
        return None;
    }
    Some(values[..10].iter().fold(0, |acc, v| acc << 5 | v))
}

fn uuid_v7_millis(id: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(id).ok()?;
    let groups: Vec<&str> = text.split('-').collect();
    let shape = [8, 4, 4, 4, 12];
    if groups.len() != 5 || groups.iter().zip(shape).any(|(g, n)| g.len() != n) {
        return None;
    }
    if !groups
        .iter()
        .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return None;
    }
    let version = groups[2].as_bytes()[0];
    let variant = groups[3].as_bytes()[0].to_ascii_lowercase();
    if version != b'7' || !matches!(variant, b'8' | b'9' | b'a' | b'b') {
        return None;
    }
    u64::from_str_radix(&format!("{}{}", groups[0], groups[1]), 16).ok()
}

/// An operator's change's own id (STOCK.SET, STOCK.ADD): the same rules as
/// a request_id, so a change is applied once however often it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpId(Bytes);

impl OpId {
    pub fn parse(value: Bytes) -> Result<OpId, InvalidParam> {
        if is_token(&value) {
            Ok(OpId(value))
        } else {
            Err(InvalidParam(
                "op_id must be 1 to 128 printable ASCII bytes without whitespace, '{' or '}'"
                    .into(),
            ))
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A change of a hold's own id (HOLD.EXTEND, HOLD.SHRINK): the same rules
/// as a request_id, so a change is applied once however often it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeId(Bytes);

impl ChangeId {
    pub fn parse(value: Bytes) -> Result<ChangeId, InvalidParam> {
        if is_token(&value) {
            Ok(ChangeId(value))
        } else {
            Err(InvalidParam(
                "change_id must be 1 to 128 printable ASCII bytes without whitespace, '{' or '}'"
                    .into(),
            ))
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A location of a SKU kept by location (docs/locations.md): 1 to 64
/// bytes of `A-Z a-z 0-9 _ . -`, so that its hash fields (`<location>`,
/// `<location>:held`, `<location>:floor`) can't be another's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location(Bytes);

impl Location {
    /// The most locations one call may name.
    pub const PER_CALL: usize = 16;

    pub fn parse(value: Bytes) -> Result<Location, InvalidParam> {
        let ok = (1..=64).contains(&value.len())
            && value
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if ok {
            Ok(Location(value))
        } else {
            Err(InvalidParam(
                "a location is 1 to 64 bytes of A-Z a-z 0-9 _ . -".into(),
            ))
        }
    }

    /// The locations an allocation names, in the caller's order: 1 to
    /// [`Location::PER_CALL`] of them, none twice.
    pub fn parse_list(values: &[Bytes]) -> Result<Vec<Location>, InvalidParam> {
        if values.is_empty() || values.len() > Location::PER_CALL {
            return Err(InvalidParam(format!(
                "name 1 to {} locations",
                Location::PER_CALL
            )));
        }
        let mut list: Vec<Location> = Vec::with_capacity(values.len());
        for value in values {
            let location = Location::parse(value.clone())?;
            if list.contains(&location) {
                return Err(InvalidParam(format!(
                    "location {} is named twice",
                    String::from_utf8_lossy(&location.0)
                )));
            }
            list.push(location);
        }
        Ok(list)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// How an allocation takes qty from the locations it names, in their
/// order: from each as much as it has above its floor (`SPLIT`), or all
/// from the first that can give it whole (`WHOLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Split,
    Whole,
}

impl Policy {
    pub fn parse(text: &[u8]) -> Result<Policy, InvalidParam> {
        match text {
            b"SPLIT" => Ok(Policy::Split),
            b"WHOLE" => Ok(Policy::Whole),
            _ => Err(InvalidParam("policy must be SPLIT or WHOLE".into())),
        }
    }

    /// Its word, as the scripts and the metrics take it.
    pub fn word(self) -> &'static str {
        match self {
            Policy::Split => "SPLIT",
            Policy::Whole => "WHOLE",
        }
    }
}

/// Where an order's line on a SKU kept by location takes its units: the
/// caller's policy and locations, in its order, written after the line's
/// sku as `<sku>{<POLICY>:<location>,<location>...}` (braces are no
/// sku's: docs/locations.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub policy: Policy,
    pub locations: Vec<Location>,
}

impl Placement {
    /// `<POLICY>:<location>,<location>...`, what the braces hold.
    pub fn parse(text: &[u8]) -> Result<Placement, InvalidParam> {
        let split = text.iter().position(|b| *b == b':').ok_or_else(|| {
            InvalidParam("a line's locations are <sku>{<POLICY>:<location>,...}".into())
        })?;
        let policy = Policy::parse(&text[..split])?;
        let names: Vec<Bytes> = text[split + 1..]
            .split(|b| *b == b',')
            .map(Bytes::copy_from_slice)
            .collect();
        Ok(Placement {
            policy,
            locations: Location::parse_list(&names)?,
        })
    }

    /// The text [`Placement::parse`] reads.
    pub fn text(&self) -> Vec<u8> {
        let mut out = self.policy.word().as_bytes().to_vec();
        out.push(b':');
        for (i, location) in self.locations.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(location.as_bytes());
        }
        out
    }
}

/// A stock level to set: a canonical decimal integer from 0 to
/// [`MAX_STOCK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockLevel(pub i64);

impl StockLevel {
    pub fn parse(text: &[u8]) -> Result<StockLevel, InvalidParam> {
        match canonical_int(text) {
            Some(v) if (0..=MAX_STOCK).contains(&v) => Ok(StockLevel(v)),
            _ => Err(InvalidParam(format!(
                "stock must be an integer from 0 to {MAX_STOCK}"
            ))),
        }
    }

    /// A location's floor (docs/locations.md): a stock level, named so.
    pub fn parse_floor(text: &[u8]) -> Result<StockLevel, InvalidParam> {
        StockLevel::parse(text)
            .map_err(|_| InvalidParam(format!("floor must be an integer from 0 to {MAX_STOCK}")))
    }
}

/// A signed change of stock, |delta| at most [`MAX_STOCK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta(pub i64);

impl Delta {
    pub fn parse(text: &[u8]) -> Result<Delta, InvalidParam> {
        match canonical_int(text) {
            Some(v) if (-MAX_STOCK..=MAX_STOCK).contains(&v) => Ok(Delta(v)),
            _ => Err(InvalidParam(format!(
                "delta must be an integer from -{MAX_STOCK} to {MAX_STOCK}"
            ))),
        }
    }
}

/// A decimal integer in canonical spelling: an optional `-`, no `+`, no
/// leading zero (`0` itself is fine, `-0` is not).
fn canonical_int(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    let canonical = !digits.is_empty()
        && digits.len() <= 16
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" && digits.len() == text.len() || digits[0] != b'0');
    canonical
        .then(|| std::str::from_utf8(text).ok()?.parse().ok())
        .flatten()
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
        let value = canonical_u64(&text).filter(|v| (1..=max).contains(v));
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

/// A positive integer in its one spelling ("1", never "01" or "+1"), of at
/// most 16 digits: what the scripts accept too.
fn canonical_u64(text: &[u8]) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.len() <= 16
        && text[0] != b'0'
        && text.iter().all(u8::is_ascii_digit);
    canonical
        .then(|| std::str::from_utf8(text).ok()?.parse::<u64>().ok())
        .flatten()
}

/// How long a HOLD holds, in milliseconds: a canonical decimal integer
/// from 1000 (a shorter hold would expire before a retry of it could
/// arrive) to `--max-hold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldTtl {
    value: u64,
    text: Bytes,
}

/// The shortest hold, in milliseconds.
pub const MIN_HOLD_MS: u64 = 1000;

impl HoldTtl {
    pub fn parse(text: Bytes, max_ms: u64) -> Result<HoldTtl, InvalidParam> {
        let value = canonical_u64(&text).filter(|v| (MIN_HOLD_MS..=max_ms).contains(v));
        match value {
            Some(value) => Ok(HoldTtl { value, text }),
            None => Err(InvalidParam(format!(
                "ttl_ms must be an integer from {MIN_HOLD_MS} to {max_ms}"
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
        if value.len() <= MAX_FIELD_LEN && is_printable(&value) {
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
    use proptest::prelude::*;

    proptest! {
        /// Eight bytes at a time, the checks say what a look at each byte
        /// says.
        #[test]
        fn the_word_checks_agree_with_each_byte(
            value in prop::collection::vec(prop_oneof![any::<u8>(), 0x1fu8..0x81, Just(b'{'), Just(b'}')], 0..140),
        ) {
            let token = (1..=MAX_FIELD_LEN).contains(&value.len())
                && value.iter().all(|&b| TOKEN_BYTE[b as usize]);
            prop_assert_eq!(is_token(&value), token);
            prop_assert_eq!(is_printable(&value), value.iter().all(|&b| (b' '..=b'~').contains(&b)));
        }
    }

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
    fn time_ordered_ids_reveal_their_time() {
        let id = |s: &str| RequestId::parse(b(s)).unwrap();
        let millis = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis();
        // The ULID spec's example id; its first 10 characters decode to
        // 1469922850259 ms, 2016-07-30T23:54:10.259Z.
        assert_eq!(
            millis(id("01ARZ3NDEKTSV4RRFFQ69G5FAV").embedded_time().unwrap()),
            1_469_922_850_259
        );
        assert_eq!(
            millis(id("01arz3ndektsv4rrffq69g5fav").embedded_time().unwrap()),
            1_469_922_850_259
        );
        // RFC 9562's UUIDv7 example: 017F22E2-79B0-7CC3-98C4-DC0C0C07398F
        // is 0x017F22E279B0 = 1645557742000 ms.
        let v7 = id("017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
        assert_eq!(millis(v7.embedded_time().unwrap()), 1_645_557_742_000);
        for other in [
            "order-20261129-001",
            "550e8400-e29b-41d4-a716-446655440000", // UUIDv4: no time
            "81ARZ3NDEKTSV4RRFFQ69G5FAV",           // over 48 bits
            "01ARZ3NDEKTSV4RRFFQ69G5FA",            // 25 characters
            "01ARZ3NDEKTSV4RRFFQ69G5FAU",           // U is not Crockford
        ] {
            assert_eq!(id(other).embedded_time(), None, "{other}");
        }
    }

    #[test]
    fn stock_levels_and_deltas() {
        assert_eq!(StockLevel::parse(b"0").unwrap().0, 0);
        assert_eq!(StockLevel::parse(b"9007199254740991").unwrap().0, MAX_STOCK);
        for bad in [&b"-1"[..], b"01", b"", b"9007199254740992", b"1e3", b"-0"] {
            assert!(StockLevel::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Delta::parse(b"-5").unwrap().0, -5);
        assert_eq!(Delta::parse(b"7").unwrap().0, 7);
        assert_eq!(Delta::parse(b"0").unwrap().0, 0);
        for bad in [&b"+5"[..], b"-05", b"--1", b"-", b"x"] {
            assert!(Delta::parse(bad).is_err(), "{bad:?}");
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

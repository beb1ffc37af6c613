//! Redis's replies as the node pipes read them: where each reply ends, and
//! what a reply holds, read from its raw bytes.
//!
//! The pipes speak RESP2 to Redis (they never send HELLO), and every reply
//! they wait for is a script's array of integers and bulk strings, an
//! error, or an integer (WAIT), so this is all of RESP2 they need. A reply
//! is kept as the exact bytes Redis sent (a slice of the read buffer, no
//! copy) and read when its caller needs it; decoding it into a tree of
//! frames first cost about a tenth of stockgate's instructions per request
//! (measured with callgrind, `cargo bench --bench side_by_side --
//! instructions`).

use crate::error::{ErrorCode, ErrorReply};
use bytes::Bytes;

/// A reply from Redis that does not parse: the connection can't be trusted
/// to stay in step after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed reply from redis: {0}")]
pub struct Malformed(pub &'static str);

/// Most nested elements one reply may announce (a script's reply has five):
/// a bound, so a corrupt length can't make the scan count for ever.
const MAX_ELEMENTS: i64 = 1 << 20;

/// The length of the first complete reply in `buf`, or `None` when it is not
/// all there yet.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    match flat_len(buf) {
        FlatLen::Whole(len) => Ok(Some(len)),
        FlatLen::Partial => Ok(None),
        FlatLen::Unusual => frame_len_careful(buf),
    }
}

/// What [`flat_len`] found.
enum FlatLen {
    Whole(usize),
    Partial,
    /// Not a flat array of well-formed integers and strings: the careful
    /// reading says what it is.
    Unusual,
}

/// The length of a complete flat array reply (integers, bulk and simple
/// strings, nil) at the start of `buf`: what nearly every reply is, read
/// in one pass.
fn flat_len(buf: &[u8]) -> FlatLen {
    let mut at = 1;
    // A decimal ended by CRLF, at `at` (moved past it): `None` when it is
    // not all in `buf` yet, `Some(None)` when it is no such number.
    let number = |at: &mut usize| -> Option<Option<i64>> {
        let mut value: i64 = 0;
        let negative = buf.get(*at) == Some(&b'-');
        let start = *at + usize::from(negative);
        let mut i = start;
        loop {
            let &d = buf.get(i)?;
            if d == b'\r' {
                break;
            }
            if !d.is_ascii_digit() || i - start >= 18 {
                return Some(None);
            }
            value = value * 10 + i64::from(d - b'0');
            i += 1;
        }
        if i == start {
            return Some(None);
        }
        match buf.get(i + 1) {
            None => None,
            Some(b'\n') => {
                *at = i + 2;
                Some(Some(if negative { -value } else { value }))
            }
            Some(_) => Some(None),
        }
    };
    if buf.first() != Some(&b'*') {
        return FlatLen::Unusual;
    }
    let count = match number(&mut at) {
        None => return FlatLen::Partial,
        Some(Some(count)) if (0..=64).contains(&count) => count,
        Some(_) => return FlatLen::Unusual,
    };
    for _ in 0..count {
        let Some(&kind) = buf.get(at) else {
            return FlatLen::Partial;
        };
        at += 1;
        match kind {
            b':' => match number(&mut at) {
                None => return FlatLen::Partial,
                Some(None) => return FlatLen::Unusual,
                Some(Some(_)) => {}
            },
            b'$' => match number(&mut at) {
                None => return FlatLen::Partial,
                Some(Some(-1)) => {}
                Some(Some(len)) if len >= 0 => {
                    let end = at + len as usize;
                    match buf.get(end..end + 2) {
                        None => return FlatLen::Partial,
                        Some(b"\r\n") => at = end + 2,
                        Some(_) => return FlatLen::Unusual,
                    }
                }
                Some(_) => return FlatLen::Unusual,
            },
            _ => return FlatLen::Unusual,
        }
    }
    FlatLen::Whole(at)
}

/// [`frame_len`] of any reply, element by element.
fn frame_len_careful(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    let mut at = 0;
    // Elements still to read: nested arrays add theirs, so nesting needs
    // no recursion.
    let mut left: i64 = 1;
    while left > 0 {
        left -= 1;
        let Some((kind, value, after)) = line(buf, at)? else {
            return Ok(None);
        };
        at = after;
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let len = integer(value).ok_or(Malformed("bulk length"))?;
                if len >= 0 {
                    let end = at + len as usize;
                    if buf.len() < end + 2 {
                        return Ok(None);
                    }
                    if &buf[end..end + 2] != b"\r\n" {
                        return Err(Malformed("bulk string not ended by CRLF"));
                    }
                    at = end + 2;
                } else if len != -1 {
                    return Err(Malformed("bulk length"));
                }
            }
            b'*' => {
                let count = integer(value).ok_or(Malformed("array length"))?;
                if count > MAX_ELEMENTS {
                    return Err(Malformed("array length"));
                }
                if count > 0 {
                    left += count;
                }
            }
            _ => return Err(Malformed("unknown reply type")),
        }
    }
    Ok(Some(at))
}

/// One line of a reply: its type byte, the text after it, and where the
/// next line starts.
type Line<'a> = (u8, &'a [u8], usize);

/// The line at `at`; `None` when it is not complete.
fn line(buf: &[u8], at: usize) -> Result<Option<Line<'_>>, Malformed> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let rest = &buf[at + 1..];
    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if lf == 0 || rest[lf - 1] != b'\r' {
        return Err(Malformed("line not ended by CRLF"));
    }
    Ok(Some((kind, &rest[..lf - 1], at + 1 + lf + 1)))
}

/// A decimal integer as Redis writes one (an optional `-`, digits).
fn integer(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut value: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -value } else { value })
}

/// A flat array reply read element by element in one pass: what a
/// script's reply is (integers and strings). Each read expects a kind of
/// element and says `None` for anything else, leaving the caller to read
/// the reply the slow way (for the exact error). No slice is made but of
/// the strings asked for.
pub struct Flat<'a> {
    frame: &'a [u8],
    at: usize,
    /// Elements not read yet.
    pub left: usize,
}

/// `frame` as a [`Flat`] array, or `None` when it is not an array.
pub fn flat(frame: &[u8]) -> Option<Flat<'_>> {
    if frame.first() != Some(&b'*') {
        return None;
    }
    let mut flat = Flat {
        frame,
        at: 1,
        left: 0,
    };
    let count = flat.digits()?;
    flat.left = usize::try_from(count).ok()?;
    Some(flat)
}

impl Flat<'_> {
    /// A non-negative decimal ended by CRLF, at `at` (moved past it).
    #[inline(always)]
    fn digits(&mut self) -> Option<i64> {
        let mut value: i64 = 0;
        let mut at = self.at;
        let mut negative = false;
        if self.frame.get(at) == Some(&b'-') {
            negative = true;
            at += 1;
        }
        let start = at;
        while let Some(&d) = self.frame.get(at) {
            if d == b'\r' {
                break;
            }
            if !d.is_ascii_digit() || at - start >= 18 {
                return None;
            }
            value = value * 10 + i64::from(d - b'0');
            at += 1;
        }
        if at == start || self.frame.get(at + 1) != Some(&b'\n') {
            return None;
        }
        self.at = at + 2;
        Some(if negative { -value } else { value })
    }

    /// The next element, an integer.
    #[inline]
    pub fn int(&mut self) -> Option<i64> {
        if self.left == 0 || self.frame.get(self.at) != Some(&b':') {
            return None;
        }
        self.at += 1;
        self.left -= 1;
        self.digits()
    }

    /// The next element, a bulk or simple string: where it lies in the
    /// frame.
    #[inline]
    pub fn text(&mut self) -> Option<std::ops::Range<usize>> {
        if self.left == 0 {
            return None;
        }
        match self.frame.get(self.at) {
            Some(b'$') => {
                self.at += 1;
                let len = usize::try_from(self.digits()?).ok()?;
                let start = self.at;
                let end = start.checked_add(len)?;
                if self.frame.get(end..end + 2) != Some(b"\r\n") {
                    return None;
                }
                self.at = end + 2;
                self.left -= 1;
                Some(start..end)
            }
            Some(b'+') => {
                let start = self.at + 1;
                let cr = start + self.frame.get(start..)?.iter().position(|&b| b == b'\r')?;
                if self.frame.get(cr + 1) != Some(&b'\n') {
                    return None;
                }
                self.at = cr + 2;
                self.left -= 1;
                Some(start..cr)
            }
            _ => None,
        }
    }
}

impl<'a> Flat<'a> {
    /// The next element, a flat array itself, read as its own [`Flat`]
    /// over the same frame (this one moves past it as the nested one is
    /// read: read it whole before reading on here).
    pub fn array(&mut self) -> Option<Flat<'a>> {
        if self.left == 0 || self.frame.get(self.at) != Some(&b'*') {
            return None;
        }
        self.at += 1;
        let count = usize::try_from(self.digits()?).ok()?;
        self.left -= 1;
        Some(Flat {
            frame: self.frame,
            at: self.at,
            left: count,
        })
    }
}

/// One element of a reply, as [`Items`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Integer(i64),
    /// A bulk or simple string: a slice of the reply, not a copy.
    Text(Bytes),
    /// Anything else (nil, an error, a nested array).
    Other,
}

/// What a whole reply is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// `-<text>`: the error's text (its first word is the code).
    Error(Bytes),
    Integer(i64),
    /// An array; [`items`] reads its elements.
    Array(usize),
    Other,
}

/// What a complete reply (`frame`, as [`frame_len`] cut it) is.
pub fn shape(frame: &Bytes) -> Shape {
    let Ok(Some((kind, value, _))) = line(frame, 0) else {
        return Shape::Other;
    };
    match kind {
        b'-' => Shape::Error(frame.slice(1..1 + value.len())),
        b':' => integer(value).map_or(Shape::Other, Shape::Integer),
        b'*' => match integer(value) {
            Some(n) if n >= 0 => Shape::Array(n as usize),
            _ => Shape::Other,
        },
        _ => Shape::Other,
    }
}

/// An error reply's code ([`ErrorCode::read`]); `None` for any other
/// reply.
pub fn error_code(frame: &Bytes) -> Option<ErrorCode> {
    // Most replies are not errors: one byte tells (every answer is asked).
    if frame.first() != Some(&b'-') {
        return None;
    }
    let Shape::Error(text) = shape(frame) else {
        return None;
    };
    let text = String::from_utf8_lossy(&text);
    let (word, detail) = text.split_once(' ').unwrap_or((&text, ""));
    Some(ErrorCode::read(word, detail))
}

/// An error reply, read whole: its code and its words, for the fault it
/// becomes. `None` for any other reply.
pub fn error_reply(frame: &Bytes) -> Option<ErrorReply> {
    if frame.first() != Some(&b'-') {
        return None;
    }
    let Shape::Error(text) = shape(frame) else {
        return None;
    };
    Some(ErrorReply::parse(&String::from_utf8_lossy(&text)))
}

/// The top-level elements of an array reply, in order. Elements that are
/// arrays themselves are skipped whole and read as [`Item::Other`].
pub fn items(frame: &Bytes) -> Items<'_> {
    let (left, at) = match line(frame, 0) {
        Ok(Some((b'*', value, after))) => (integer(value).unwrap_or(0).max(0), after),
        _ => (0, frame.len()),
    };
    Items { frame, at, left }
}

pub struct Items<'a> {
    frame: &'a Bytes,
    at: usize,
    left: i64,
}

impl Iterator for Items<'_> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (kind, value, after) = line(self.frame, self.at).ok()??;
        let value_at = self.at + 1;
        self.at = after;
        Some(match kind {
            b':' => integer(value).map_or(Item::Other, Item::Integer),
            b'+' => Item::Text(self.frame.slice(value_at..value_at + value.len())),
            b'$' => match integer(value) {
                Some(len) if len >= 0 => {
                    let start = after;
                    let end = start + len as usize;
                    self.at = end + 2;
                    Item::Text(self.frame.slice(start..end))
                }
                _ => Item::Other,
            },
            b'*' => {
                // Skip the nested array whole.
                let len = frame_len(&self.frame[value_at - 1..]).ok().flatten();
                self.at = value_at - 1 + len.unwrap_or(self.frame.len() - value_at + 1);
                Item::Other
            }
            _ => Item::Other,
        })
    }
}

/// The `n` elements of an array reply of exactly `n` elements, each as the
/// complete reply it is (a slice of `frame`, no copy): a gathered call's
/// reply, split into its members' replies. `None` for anything else.
pub fn elements(frame: &Bytes, n: usize) -> Option<Elements<'_>> {
    match line(frame, 0) {
        Ok(Some((b'*', value, after))) if integer(value) == Some(n as i64) => Some(Elements {
            frame,
            at: after,
            left: n,
        }),
        _ => None,
    }
}

pub struct Elements<'a> {
    frame: &'a Bytes,
    at: usize,
    left: usize,
}

impl Iterator for Elements<'_> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let len = frame_len(&self.frame[self.at..]).ok().flatten()?;
        let element = self.frame.slice(self.at..self.at + len);
        self.at += len;
        Some(element)
    }
}

/// A complete reply (`frame`) as the redis crate's [`redis::Value`], for
/// the calls whose replies are read through it (an order's intent, the
/// orders in flight): integers, strings, nil and arrays of them, which is
/// all stockgate's scripts answer. `None` for anything else (an error
/// inside an array, a RESP3 type): the caller reads those with the redis
/// crate's own parser. Its parser costs about 16,000 instructions a reply
/// (a combinator chain, and a zeroed buffer per call: callgrind of an
/// ORDER load), a third of an ORDER's CPU in stockgate when it read them
/// all; this reads the same in about 3,500.
pub fn value(frame: &Bytes) -> Option<redis::Value> {
    use redis::Value;
    let (kind, text, after) = line(frame, 0).ok()??;
    Some(match kind {
        b':' => Value::Int(integer(text)?),
        // The redis crate reads `+OK` as its own `Okay`.
        b'+' if text == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8(text.to_vec()).ok()?),
        b'$' => match integer(text)? {
            -1 => Value::Nil,
            len if len >= 0 => {
                let end = after.checked_add(len as usize)?;
                Value::BulkString(frame.get(after..end)?.to_vec())
            }
            _ => return None,
        },
        b'*' => match integer(text)? {
            -1 => Value::Nil,
            n if n >= 0 => {
                let n = n as usize;
                let items: Vec<Value> = elements(frame, n)?
                    .map(|element| value(&element))
                    .collect::<Option<_>>()?;
                if items.len() != n {
                    return None;
                }
                Value::Array(items)
            }
            _ => return None,
        },
        b'_' => Value::Nil,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn element() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            any::<i64>().prop_map(|i| format!(":{i}\r\n").into_bytes()),
            prop::collection::vec(any::<u8>(), 0..12).prop_map(|b| {
                let mut e = format!("${}\r\n", b.len()).into_bytes();
                e.extend(b);
                e.extend(b"\r\n");
                e
            }),
            Just(b"$-1\r\n".to_vec()),
            Just(b"+OK\r\n".to_vec()),
            Just(b"*2\r\n:1\r\n:2\r\n".to_vec()),
        ]
    }

    proptest! {
        /// The one-pass length of a reply is the careful one whenever it
        /// answers, whatever the bytes (replies, then with a byte changed
        /// or cut short).
        #[test]
        fn the_flat_length_agrees_with_the_careful_one(
            elements in prop::collection::vec(element(), 0..12),
            flip in any::<Option<(usize, u8)>>(),
            cut in any::<Option<usize>>(),
        ) {
            let mut buf = format!("*{}\r\n", elements.len()).into_bytes();
            for e in &elements {
                buf.extend(e);
            }
            buf.extend(b":7\r\n");
            if let Some((at, byte)) = flip {
                let at = at % buf.len();
                buf[at] = byte;
            }
            if let Some(cut) = cut {
                buf.truncate(cut % (buf.len() + 1));
            }
            match flat_len(&buf) {
                FlatLen::Whole(len) => prop_assert_eq!(frame_len_careful(&buf), Ok(Some(len))),
                FlatLen::Partial => prop_assert_eq!(frame_len_careful(&buf), Ok(None)),
                FlatLen::Unusual => {}
            }
        }
    }

    #[test]
    fn an_error_reply_is_read_into_its_code() {
        let frame = |text: &'static [u8]| Bytes::from_static(text);
        assert_eq!(
            error_code(&frame(b"-NOSCRIPT No matching script.\r\n")),
            Some(ErrorCode::NoScript)
        );
        assert_eq!(
            error_code(&frame(b"-ERR Function not found\r\n")),
            Some(ErrorCode::FunctionNotFound)
        );
        assert_eq!(error_code(&frame(b":1\r\n")), None);
        assert_eq!(error_code(&frame(b"*1\r\n-ERR x\r\n")), None);
        let reply = error_reply(&frame(b"-MOVED 12 127.0.0.1:7001\r\n")).unwrap();
        assert_eq!(
            (reply.code, reply.word.as_str(), reply.detail.as_str()),
            (ErrorCode::Moved, "MOVED", "12 127.0.0.1:7001")
        );
    }

    #[test]
    fn a_reply_reads_as_the_redis_crate_reads_it() {
        for frame in [
            &b":42\r\n"[..],
            b":-7\r\n",
            b"+OK\r\n",
            b"$5\r\nhello\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            // An order's intent, as lua/order.lua answers it.
            b"*9\r\n:1\r\n$7\r\nHOLDING\r\n$1\r\nD\r\n$11\r\na 1 b 2 c 3\r\n:0\r\n:0\r\n$0\r\n\r\n:1796215160988\r\n:4\r\n",
            b"*3\r\n*2\r\n:1\r\n$1\r\nx\r\n$-1\r\n+PONG\r\n",
        ] {
            let ours = value(&Bytes::copy_from_slice(frame));
            let theirs = redis::parse_redis_value(frame).unwrap();
            assert_eq!(ours, Some(theirs), "{:?}", String::from_utf8_lossy(frame));
        }
        // What it leaves to the redis crate.
        for frame in [
            &b"*1\r\n-ERR x\r\n"[..],
            b"%1\r\n:1\r\n:2\r\n",
            b"*2\r\n:1\r\n",
        ] {
            assert_eq!(value(&Bytes::copy_from_slice(frame)), None);
        }
    }

    #[test]
    fn elements_split_an_array_into_whole_replies() {
        let frame = Bytes::from_static(b"*3\r\n*2\r\n:0\r\n$2\r\nab\r\n-BADRECORD x\r\n*0\r\n");
        let parts: Vec<Bytes> = elements(&frame, 3).unwrap().collect();
        assert_eq!(
            parts,
            [
                &b"*2\r\n:0\r\n$2\r\nab\r\n"[..],
                b"-BADRECORD x\r\n",
                b"*0\r\n"
            ]
        );
        assert!(elements(&frame, 2).is_none(), "a count that differs");
        assert!(elements(&Bytes::from_static(b"-NOSCRIPT x\r\n"), 1).is_none());
    }

    #[test]
    fn frames_end_where_redis_says() {
        let cases: &[(&[u8], Option<usize>)] = &[
            (b"+OK\r\n", Some(5)),
            (b":12\r\n:1", Some(5)),
            (b"$3\r\nabc\r\n+", Some(9)),
            (b"$-1\r\n", Some(5)),
            (b"*-1\r\n", Some(5)),
            (b"*0\r\n", Some(4)),
            (b"*4\r\n:0\r\n:98\r\n$8\r\nORD-1001\r\n:3\r\n", Some(31)),
            (b"*2\r\n*1\r\n:1\r\n$1\r\nx\r\n", Some(19)),
            (b"*4\r\n:0\r\n:98\r\n$8\r\nORD-10", None),
            (b"$3\r\nab", None),
            (b"", None),
            (b"-ERR x", None),
        ];
        for (buf, want) in cases {
            assert_eq!(
                frame_len(buf).unwrap(),
                *want,
                "{:?}",
                String::from_utf8_lossy(buf)
            );
        }
        for bad in [
            &b"?x\r\n"[..],
            b"$x\r\n",
            b"$3\r\nabcd\r\n",
            b"+OK\n",
            b"$-2\r\n",
        ] {
            assert!(
                frame_len(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_script_reply_reads_back_as_its_items() {
        let frame = Bytes::from_static(b"*5\r\n:3\r\n:-1\r\n$0\r\n\r\n:3\r\n$7\r\nqty bad\r\n");
        assert_eq!(shape(&frame), Shape::Array(5));
        let got: Vec<Item> = items(&frame).collect();
        assert_eq!(
            got,
            [
                Item::Integer(3),
                Item::Integer(-1),
                Item::Text(Bytes::new()),
                Item::Integer(3),
                Item::Text(Bytes::from_static(b"qty bad")),
            ]
        );
        let error = Bytes::from_static(b"-MOVED 12 127.0.0.1:7001\r\n");
        assert_eq!(
            shape(&error),
            Shape::Error(Bytes::from_static(b"MOVED 12 127.0.0.1:7001"))
        );
        assert_eq!(shape(&Bytes::from_static(b":2\r\n")), Shape::Integer(2));
        let nested = Bytes::from_static(b"*3\r\n*2\r\n:1\r\n:2\r\n$-1\r\n:7\r\n");
        let got: Vec<Item> = items(&nested).collect();
        assert_eq!(got, [Item::Other, Item::Other, Item::Integer(7)]);
    }

    proptest! {
        /// Any reply of integers, strings, nil and arrays of them (nested
        /// two deep) reads as the redis crate reads it.
        #[test]
        fn values_agree_with_the_redis_crate(
            elements in prop::collection::vec(
                prop_oneof![
                    any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
                    "[ -~]{0,12}".prop_map(|t| format!("+{t}\r\n").into_bytes()),
                    Just(b"$-1\r\n".to_vec()),
                    prop::collection::vec(any::<u8>(), 0..20).prop_map(|b| {
                        let mut out = format!("${}\r\n", b.len()).into_bytes();
                        out.extend(b);
                        out.extend_from_slice(b"\r\n");
                        out
                    }),
                    prop::collection::vec(any::<i64>(), 0..4).prop_map(|ns| {
                        let mut out = format!("*{}\r\n", ns.len()).into_bytes();
                        for n in ns {
                            out.extend(format!(":{n}\r\n").into_bytes());
                        }
                        out
                    }),
                ],
                0..10,
            ),
        ) {
            let mut frame = format!("*{}\r\n", elements.len()).into_bytes();
            frame.extend(elements.concat());
            let theirs = redis::parse_redis_value(&frame).unwrap();
            prop_assert_eq!(value(&Bytes::from(frame)), Some(theirs));
        }

        /// Whatever stockgate writes, and any split of it, frames exactly
        /// as redis-protocol's decoder does.
        #[test]
        fn agrees_with_redis_protocol(
            replies in prop::collection::vec(
                prop_oneof![
                    any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
                    "[ -~]{0,20}".prop_map(|t| format!("+{t}\r\n").into_bytes()),
                    "[ -~]{0,20}".prop_map(|t| format!("-ERR {t}\r\n").into_bytes()),
                    prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| {
                        let mut out = format!("${}\r\n", b.len()).into_bytes();
                        out.extend(b);
                        out.extend_from_slice(b"\r\n");
                        out
                    }),
                    (any::<i64>(), any::<i64>(), "[ -~]{0,30}").prop_map(|(a, b, t)| {
                        format!("*4\r\n:{a}\r\n:{b}\r\n${}\r\n{t}\r\n:3\r\n", t.len()).into_bytes()
                    }),
                ],
                1..6,
            ),
            cut in 0usize..200,
        ) {
            let wire: Vec<u8> = replies.concat();
            let mut at = 0;
            for reply in &replies {
                let len = frame_len(&wire[at..]).unwrap();
                prop_assert_eq!(len, Some(reply.len()));
                let theirs = redis_protocol::resp2::decode::decode(&wire[at..]).unwrap().unwrap().1;
                prop_assert_eq!(theirs, reply.len());
                at += reply.len();
            }
            let cut = cut.min(wire.len());
            let first = replies[0].len();
            let partial = frame_len(&wire[..cut]).unwrap();
            prop_assert_eq!(partial, (cut >= first).then_some(first));
        }
    }
}

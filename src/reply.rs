//! RESP on the way out: replies to clients, and the commands stockgate
//! sends to Redis, written byte for byte.
//!
//! Every header, length and integer is written with its exact decimal
//! spelling ([`itoa`]) straight into the output buffer, and the buffer
//! grows by exactly what was written. redis-protocol's encoders are not
//! used here: they size their output with `encode_len()`, whose digit count
//! comes from a floating-point `log10` and is one too high near powers of
//! ten (999999999999998 counts 16 digits). A buffer grown by that estimate
//! kept a NUL byte after the reply, and every later reply on the connection
//! was misread. `tests/reply_props.rs` parses every kind of reply
//! back with the redis crate's parser and checks no byte is left over.

use crate::outcome::StockReply;
use bytes::{BufMut, Bytes, BytesMut};

/// The protocol a connection speaks, chosen with `HELLO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Resp2,
    Resp3,
}

/// A reply, independent of the protocol it will be encoded in.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`, `+PONG`.
    Simple(&'static str),
    /// A simple string made at run time (the lines of `HELP`).
    Status(String),
    /// An error; the text has no leading `-`, and its first word is the code.
    Error(String),
    Integer(i64),
    Bulk(Bytes),
    /// Text for humans, as Redis answers INFO and CLIENT INFO: a RESP3
    /// verbatim string of format `txt` (`=<len>\r\ntxt:...`), and a bulk
    /// string in RESP2.
    Verbatim(Bytes),
    /// RESP2 null bulk string `$-1`, RESP3 `_`.
    Null,
    Array(Vec<Reply>),
    /// A RESP3 map; a flat key, value, key, value array in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// The reply to a stock command (DEDUCT, REVERT, ...).
    Stock(StockReply),
}

impl Reply {
    pub fn error(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    pub fn bulk(text: impl Into<Bytes>) -> Reply {
        Reply::Bulk(text.into())
    }

    /// Appends this reply to `dst`, encoded for `protocol`.
    pub fn encode(&self, protocol: Protocol, dst: &mut BytesMut) {
        match self {
            Reply::Simple(text) => line(dst, b'+', text.as_bytes()),
            Reply::Status(text) => line(dst, b'+', text.as_bytes()),
            Reply::Error(text) => line(dst, b'-', text.as_bytes()),
            Reply::Integer(n) => integer(dst, *n),
            Reply::Bulk(data) => bulk(dst, data),
            Reply::Verbatim(text) => match protocol {
                Protocol::Resp2 => bulk(dst, text),
                Protocol::Resp3 => {
                    header(dst, b'=', text.len() + 4);
                    dst.reserve(text.len() + 6);
                    dst.extend_from_slice(b"txt:");
                    dst.extend_from_slice(text);
                    dst.extend_from_slice(b"\r\n");
                }
            },
            Reply::Null => match protocol {
                Protocol::Resp2 => dst.extend_from_slice(b"$-1\r\n"),
                Protocol::Resp3 => dst.extend_from_slice(b"_\r\n"),
            },
            Reply::Array(items) => {
                header(dst, b'*', items.len());
                for item in items {
                    item.encode(protocol, dst);
                }
            }
            Reply::Map(pairs) => {
                match protocol {
                    Protocol::Resp2 => header(dst, b'*', pairs.len() * 2),
                    Protocol::Resp3 => header(dst, b'%', pairs.len()),
                }
                for (key, value) in pairs {
                    key.encode(protocol, dst);
                    value.encode(protocol, dst);
                }
            }
            // The hot path: no allocation, one pass; the same in both
            // protocols (an array of integers and bulk strings).
            Reply::Stock(reply) => stock(dst, reply),
        }
    }
}

fn stock(dst: &mut BytesMut, reply: &StockReply) {
    if let Some(allocation) = &reply.allocation {
        return allocated(dst, reply, allocation);
    }
    let reason = reply.reason.as_deref();
    let len = 4 + usize::from(reply.expires_at.is_some()) + usize::from(reason.is_some());
    let most = 6 * LINE_MOST + reply.order_no.len() + reason.map_or(0, <[u8]>::len) + 4;
    let mut out = Spare::new(dst, most);
    out.line(b'*', len as i64);
    out.line(b':', reply.code as i64);
    out.line(b':', reply.remain);
    out.bulk(&reply.order_no);
    out.line(b':', reply.version);
    if let Some(expires_at) = reply.expires_at {
        out.line(b':', expires_at);
    }
    if let Some(reason) = reason {
        out.bulk(reason);
    }
    out.done();
}

/// An allocation's reply (DEDUCT.AT, HOLD.AT): `[code, remain, order_no,
/// version, reason, expires_at_ms, [location, units, ...]]`, seven
/// elements always (an empty reason and 0 where there is none).
fn allocated(dst: &mut BytesMut, reply: &StockReply, allocation: &[(Bytes, i64)]) {
    let reason = reply.reason.as_deref().unwrap_or_default();
    let most = 8 * LINE_MOST
        + reply.order_no.len()
        + reason.len()
        + 4
        + allocation
            .iter()
            .map(|(location, _)| 2 * LINE_MOST + location.len() + 2)
            .sum::<usize>();
    let mut out = Spare::new(dst, most);
    out.line(b'*', 7);
    out.line(b':', reply.code as i64);
    out.line(b':', reply.remain);
    out.bulk(&reply.order_no);
    out.line(b':', reply.version);
    out.bulk(reason);
    out.line(b':', reply.expires_at.unwrap_or(0));
    out.line(b'*', 2 * allocation.len() as i64);
    for (location, units) in allocation {
        out.bulk(location);
        out.line(b':', *units);
    }
    out.done();
}

/// Copies `len` bytes from `from` to `to`: the few bytes of a key's part,
/// a length or a CRLF with two overlapping loads and stores, instead of a
/// `memcpy` call each (most of what the hot path writes is such pieces).
///
/// # Safety
///
/// `from` must be readable and `to` writable for `len` bytes, and they
/// must not overlap.
#[inline(always)]
unsafe fn copy_short(from: *const u8, to: *mut u8, len: usize) {
    use std::ptr::{read_unaligned as load, write_unaligned as store};
    // SAFETY (every branch): each load and store is within the first `len`
    // bytes of `from` and `to`, which the caller vouches for.
    unsafe {
        match len {
            0 => {}
            1 => *to = *from,
            2..=3 => {
                store(to.cast::<u16>(), load(from.cast::<u16>()));
                store(
                    to.add(len - 2).cast::<u16>(),
                    load(from.add(len - 2).cast::<u16>()),
                );
            }
            4..=7 => {
                store(to.cast::<u32>(), load(from.cast::<u32>()));
                store(
                    to.add(len - 4).cast::<u32>(),
                    load(from.add(len - 4).cast::<u32>()),
                );
            }
            8..=16 => {
                store(to.cast::<u64>(), load(from.cast::<u64>()));
                store(
                    to.add(len - 8).cast::<u64>(),
                    load(from.add(len - 8).cast::<u64>()),
                );
            }
            _ => std::ptr::copy_nonoverlapping(from, to, len),
        }
    }
}

/// The most one line of a type byte, an integer and CRLF takes.
const LINE_MOST: usize = 1 + 20 + 2;

/// Writes into a buffer's spare room after one `reserve` of the most it
/// may write, and grows the buffer by exactly what it wrote
/// ([`Spare::done`]): the hot path's replies and calls are a handful of
/// short lines and strings each, where a `reserve` and a `memcpy` call
/// per piece were most of their cost (callgrind).
pub struct Spare<'a> {
    dst: &'a mut BytesMut,
    /// Where the next byte goes, from the old end.
    at: usize,
    most: usize,
}

impl<'a> Spare<'a> {
    /// Room for `most` bytes at the end of `dst`.
    #[inline]
    pub fn new(dst: &'a mut BytesMut, most: usize) -> Spare<'a> {
        dst.reserve(most);
        Spare { dst, at: 0, most }
    }

    /// `bytes`, as they are.
    #[inline(always)]
    pub fn put(&mut self, bytes: &[u8]) {
        let len = bytes.len();
        assert!(self.at + len <= self.most, "more written than reserved");
        // SAFETY: `new` reserved `most` bytes of spare room, and
        // `at + len` is within them (just checked); `bytes` can't overlap
        // the buffer's spare room.
        unsafe {
            let to = self.dst.as_mut_ptr().add(self.dst.len() + self.at);
            copy_short(bytes.as_ptr(), to, len);
        }
        self.at += len;
    }

    /// A type byte, `n` in decimal, CRLF.
    #[inline(always)]
    pub fn line(&mut self, kind: u8, n: i64) {
        // Most are a length or a code under 100: one store each.
        match n {
            0..=9 => self.put(&[kind, b'0' + n as u8, b'\r', b'\n']),
            10..=99 => self.put(&[
                kind,
                b'0' + (n / 10) as u8,
                b'0' + (n % 10) as u8,
                b'\r',
                b'\n',
            ]),
            _ => {
                let mut digits = itoa::Buffer::new();
                self.put(&[kind]);
                self.put(digits.format(n).as_bytes());
                self.put(b"\r\n");
            }
        }
    }

    /// A bulk string of `data`.
    #[inline(always)]
    pub fn bulk(&mut self, data: &[u8]) {
        self.line(b'$', data.len() as i64);
        self.put(data);
        self.put(b"\r\n");
    }

    /// A bulk string of `parts`, one after the other.
    #[inline(always)]
    pub fn bulk_parts(&mut self, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.line(b'$', len as i64);
        for part in parts {
            self.put(part);
        }
        self.put(b"\r\n");
    }

    /// The most a [`Spare::bulk_parts`] of `parts` takes.
    pub fn bulk_parts_most(parts: &[&[u8]]) -> usize {
        LINE_MOST + parts.iter().map(|p| p.len()).sum::<usize>() + 2
    }

    /// How much was written so far.
    pub fn written(&self) -> usize {
        self.at
    }

    /// Grows the buffer by what was written.
    #[inline]
    pub fn done(self) {
        let len = self.dst.len() + self.at;
        // SAFETY: the `at` bytes after the old end were all written by
        // `put`, within the room `new` reserved.
        unsafe { self.dst.set_len(len) };
    }
}

/// `+text` or `-text`: one line, so CR and LF become spaces.
fn line(dst: &mut BytesMut, kind: u8, text: &[u8]) {
    dst.reserve(text.len() + 3);
    dst.put_u8(kind);
    for &byte in text {
        dst.put_u8(if byte == b'\r' || byte == b'\n' {
            b' '
        } else {
            byte
        });
    }
    dst.extend_from_slice(b"\r\n");
}

/// `:<n>`
fn integer(dst: &mut BytesMut, n: i64) {
    let mut digits = itoa::Buffer::new();
    put_line(dst, b':', digits.format(n).as_bytes());
}

/// `*<n>`, `%<n>`, `$<n>`: a type byte and a length.
fn header(dst: &mut BytesMut, kind: u8, len: usize) {
    let mut digits = itoa::Buffer::new();
    put_line(dst, kind, digits.format(len).as_bytes());
}

/// A type byte, at most 20 digits, CRLF: written into the buffer's spare
/// room in one go. The three `extend_from_slice`s it replaces were three
/// `memcpy` calls of a few bytes each, and these lines are most of what
/// the hot path writes (callgrind).
fn put_line(dst: &mut BytesMut, kind: u8, digits: &[u8]) {
    let len = digits.len() + 3;
    dst.reserve(len);
    let spare = dst.spare_capacity_mut();
    spare[0].write(kind);
    for (slot, &digit) in spare[1..].iter_mut().zip(digits) {
        slot.write(digit);
    }
    spare[len - 2].write(b'\r');
    spare[len - 1].write(b'\n');
    // SAFETY: the `len` bytes after the old end were all written above,
    // within the room `reserve` made.
    unsafe { dst.set_len(dst.len() + len) };
}

/// `$<len>` and the bytes.
fn bulk(dst: &mut BytesMut, data: &[u8]) {
    let mut out = Spare::new(dst, LINE_MOST + data.len() + 2);
    out.bulk(data);
    out.done();
}

/// Appends a command to `dst` as Redis wants it: an array of bulk strings.
/// Infallible: nothing a caller passes can make it write other bytes than
/// it counts, so the replies on a pipelined connection stay matched to
/// their requests.
pub fn command(dst: &mut BytesMut, args: &[&[u8]]) {
    header(dst, b'*', args.len());
    for arg in args {
        bulk(dst, arg);
    }
}

/// Appends `EVALSHA <sha> <numkeys> <keys...> <args...>` to `dst`, every
/// key and argument kept (no fixed-size copy in between).
pub fn evalsha(dst: &mut BytesMut, sha: &str, keys: &[&[u8]], args: &[&[u8]]) {
    evalsha_start(dst, sha, keys.len(), args.len());
    for part in keys.iter().chain(args) {
        bulk(dst, part);
    }
}

/// The head of an EVALSHA of `keys` keys and `args` arguments: the array
/// header, the verb, the SHA and the key count. The keys and arguments
/// follow, with [`bulk_of`] and [`bulk_parts`].
pub fn evalsha_start(dst: &mut BytesMut, sha: &str, keys: usize, args: usize) {
    script_call_start(dst, b"EVALSHA", sha, keys, args);
}

/// The head of a script call, EVALSHA or FCALL (`verb`), which share one
/// shape: `<verb> <sha or function> <numkeys>`, then keys and arguments.
/// [`crate::script::LuaScript::write_head`] says which.
pub fn script_call_start(dst: &mut BytesMut, verb: &[u8], name: &str, keys: usize, args: usize) {
    header(dst, b'*', 3 + keys + args);
    bulk(dst, verb);
    bulk(dst, name.as_bytes());
    let mut count = itoa::Buffer::new();
    bulk(dst, count.format(keys).as_bytes());
}

/// One bulk string of a command.
pub fn bulk_of(dst: &mut BytesMut, data: &[u8]) {
    bulk(dst, data);
}

/// One bulk string made of `parts`, written one after the other (a key
/// from its layout's parts, with no key built first).
pub fn bulk_parts(dst: &mut BytesMut, parts: &[&[u8]]) {
    let mut out = Spare::new(dst, Spare::bulk_parts_most(parts));
    out.bulk_parts(parts);
    out.done();
}

/// [`command`], as its own buffer.
pub fn encode_command(args: &[&[u8]]) -> Bytes {
    let mut dst = BytesMut::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    command(&mut dst, args);
    dst.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_is_its_number_in_decimal() {
        for n in [
            -1_000_000_007i64,
            -100,
            -99,
            -10,
            -9,
            -1,
            0,
            1,
            9,
            10,
            42,
            99,
            100,
            101,
            9_999,
            i64::MAX,
            i64::MIN,
        ] {
            let mut dst = BytesMut::new();
            let mut out = Spare::new(&mut dst, LINE_MOST);
            out.line(b':', n);
            out.done();
            assert_eq!(dst, format!(":{n}\r\n").as_bytes(), "{n}");
        }
    }

    #[test]
    fn every_length_is_written_as_it_is() {
        let source: Vec<u8> = (0..64u8)
            .map(|b| b.wrapping_mul(37).wrapping_add(11))
            .collect();
        for len in 0..source.len() {
            for before in [0usize, 1, 7] {
                let mut dst = BytesMut::from(&b"xxxxxxx"[..before]);
                let mut out = Spare::new(&mut dst, len + 2);
                out.put(&source[..len]);
                out.put(b"\r\n");
                out.done();
                assert_eq!(&dst[before..before + len], &source[..len], "len {len}");
                assert_eq!(&dst[before + len..], b"\r\n", "len {len}");
                assert_eq!(dst.len(), before + len + 2);
            }
        }
    }
    use crate::outcome::Code;

    fn encoded(reply: &Reply, protocol: Protocol) -> String {
        let mut buf = BytesMut::new();
        reply.encode(protocol, &mut buf);
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn replies_in_both_protocols() {
        let deduct = Reply::Stock(StockReply {
            code: Code::Ok,
            remain: 9,
            order_no: Bytes::from_static(b"ORD-1"),
            version: 1,
            expires_at: None,
            reason: None,
            allocation: None,
            effects: Default::default(),
        });
        let wire = "*4\r\n:0\r\n:9\r\n$5\r\nORD-1\r\n:1\r\n";
        assert_eq!(encoded(&deduct, Protocol::Resp2), wire);
        assert_eq!(encoded(&deduct, Protocol::Resp3), wire);
        let hold = Reply::Stock(StockReply {
            code: Code::Expired,
            remain: 9,
            order_no: Bytes::new(),
            version: 4,
            expires_at: Some(1_790_000_000_123),
            reason: None,
            allocation: None,
            effects: Default::default(),
        });
        assert_eq!(
            encoded(&hold, Protocol::Resp3),
            "*5\r\n:5\r\n:9\r\n$0\r\n\r\n:4\r\n:1790000000123\r\n"
        );
        let mut refused = StockReply::invalid("ttl");
        refused.show_expiry(true);
        let refused = Reply::Stock(refused);
        assert_eq!(
            encoded(&refused, Protocol::Resp2),
            format!(
                "*6\r\n:3\r\n:-1\r\n$0\r\n\r\n:{}\r\n:0\r\n$3\r\nttl\r\n",
                crate::outcome::SCRIPT_VERSION
            )
        );
        let invalid = Reply::Stock(StockReply::invalid("qty bad"));
        assert_eq!(
            encoded(&invalid, Protocol::Resp2),
            format!(
                "*5\r\n:3\r\n:-1\r\n$0\r\n\r\n:{}\r\n$7\r\nqty bad\r\n",
                crate::outcome::SCRIPT_VERSION
            )
        );
        let map = Reply::Map(vec![(Reply::bulk("proto"), Reply::Integer(3))]);
        assert_eq!(
            encoded(&map, Protocol::Resp2),
            "*2\r\n$5\r\nproto\r\n:3\r\n"
        );
        assert_eq!(
            encoded(&map, Protocol::Resp3),
            "%1\r\n$5\r\nproto\r\n:3\r\n"
        );
        let text = Reply::Verbatim(Bytes::from_static(b"id=7\n"));
        assert_eq!(encoded(&text, Protocol::Resp2), "$5\r\nid=7\n\r\n");
        assert_eq!(encoded(&text, Protocol::Resp3), "=9\r\ntxt:id=7\n\r\n");
        assert_eq!(
            encoded(&Reply::Status("HELP".into()), Protocol::Resp3),
            "+HELP\r\n"
        );
        assert_eq!(encoded(&Reply::Null, Protocol::Resp2), "$-1\r\n");
        assert_eq!(encoded(&Reply::Null, Protocol::Resp3), "_\r\n");
        assert_eq!(
            encoded(&Reply::error("ERR a\r\nb"), Protocol::Resp2),
            "-ERR a  b\r\n"
        );
    }

    #[test]
    fn integers_near_powers_of_ten_are_spelled_exactly() {
        // The integers whose digits redis-protocol's log10 estimate
        // miscounts: a NUL byte followed the first one.
        for n in [
            999_999_999_999_998_i64,
            999_999_999_999_999,
            9_999_999_999_999_999,
            -999_999_999_999_998,
            i64::MAX,
            i64::MIN,
            0,
        ] {
            let reply = Reply::Stock(StockReply {
                code: Code::Ok,
                remain: n,
                order_no: Bytes::new(),
                version: 2,
                expires_at: None,
                reason: None,
                allocation: None,
                effects: Default::default(),
            });
            assert_eq!(
                encoded(&reply, Protocol::Resp2),
                format!("*4\r\n:0\r\n:{n}\r\n$0\r\n\r\n:2\r\n")
            );
            assert_eq!(
                encoded(&Reply::Integer(n), Protocol::Resp3),
                format!(":{n}\r\n")
            );
        }
    }

    #[test]
    fn commands_encode_as_arrays_of_bulk_strings() {
        let bytes = encode_command(&[b"EVALSHA", b"abc", b"2", b"k1", b"k2"]);
        assert_eq!(
            &bytes[..],
            b"*5\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n2\r\n$2\r\nk1\r\n$2\r\nk2\r\n"
        );
        let long = vec![b'x'; 999_999];
        let bytes = encode_command(&[&long]);
        assert!(bytes.starts_with(b"*1\r\n$999999\r\nxxx"));
        assert_eq!(bytes.len(), 4 + 9 + 999_999 + 2);
        // Every argument is kept, however many there are.
        let args: Vec<Vec<u8>> = (0..20).map(|i| i.to_string().into_bytes()).collect();
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let mut dst = BytesMut::new();
        evalsha(&mut dst, "abc", &[b"k1", b"k2"], &args);
        let mut expected = vec![&b"EVALSHA"[..], b"abc", b"2", b"k1", b"k2"];
        expected.extend(&args);
        assert_eq!(dst.freeze(), encode_command(&expected));
    }
}

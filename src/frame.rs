//! RESP on the way in: framing client requests. (Replies, and the
//! commands sent to Redis, are written by [`crate::reply`].)
//!
//! # Requests
//!
//! Clients send a command as an array of bulk strings (`*N` then `N` times
//! `$len`), or as one inline line (`PING\r\n`, as telnet and `nc` do).
//! Redis itself accepts nothing else, and neither does stockgate: a nested
//! array or any other type is a protocol error. An inline line is split
//! into arguments by Redis's rules (`sdssplitargs`, see [`split_inline`]):
//! `ECHO "two words"` is two arguments, and an unbalanced quote is a
//! protocol error.
//!
//! Requests are framed here rather than with redis-protocol's decoder,
//! because that decoder is unsafe to point at an untrusted socket: it
//! recurses once per nesting level (64 KiB of `*1\r\n` overflows a 2 MiB
//! thread stack and aborts the process; measured with redis-protocol 6.0),
//! it has no size bounds, and it re-parses a partial frame from the start on
//! every read. The framer below is flat, bounded by `max_request` bytes, and
//! remembers how many bytes a partial frame still needs.

use bytes::{Buf, Bytes, BytesMut};
use std::ops::Range;
use tokio_util::codec::Decoder;

/// Longest line for a `*N` or `$len` header, digits and CRLF included.
const MAX_HEADER: usize = 32;

/// Most arguments in one request of at most `max_request` bytes. No
/// argument takes fewer than two bytes (inline `a `; a bulk takes six), so
/// the byte limit bounds the count, and is the one bound a client meets:
/// any request within it is framed, however many arguments it has (an
/// ORDER of more lines than `--max-order-lines` is answered code 3, on an
/// open connection), and a header promising more than could ever fit is
/// refused at once.
pub fn max_args(max_request: usize) -> usize {
    max_request / 2
}

/// Argument slots made ready for a multibulk request before its bulks
/// arrive: its header alone must not make the decoder allocate much.
const PREALLOCATED_ARGS: usize = 64;

/// A malformed request. The connection answers `-ERR Protocol error: ...`
/// once and closes, as Redis does: after a framing error the byte stream
/// can't be trusted to resynchronise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// The codec trait wants read errors to convert; the connection reads the
/// socket itself, so this only keeps the signature honest.
impl From<std::io::Error> for ProtocolError {
    fn from(err: std::io::Error) -> Self {
        ProtocolError(err.to_string())
    }
}

/// One command: its name and arguments, as slices of the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub args: Vec<Bytes>,
}

impl Request {
    /// The command name, as sent (case is the caller's).
    pub fn name(&self) -> &[u8] {
        &self.args[0]
    }
}

/// Frames requests out of a connection's read buffer.
#[derive(Debug)]
pub struct RequestDecoder {
    max_request: usize,
    /// Bytes the buffered partial frame needs at least before it can be
    /// complete; no point scanning again until then.
    need: usize,
    /// How far the buffered partial frame was scanned, so that the next
    /// read goes on from there instead of scanning it all again: a client
    /// trickling a frame one byte per read would otherwise cost time
    /// quadratic in its size (measured before this was kept: 0.6 s of CPU
    /// for one 64 KiB inline line, 160 s for 1 MiB).
    progress: Progress,
    /// The buffer's length when `progress` was saved; a shorter buffer is
    /// not the one it was saved for.
    scanned_len: usize,
    /// Bytes the scans have looked at so far: the work framing cost, which
    /// the tests bound (linear in the bytes received, however they arrive).
    scanned: u64,
}

/// What is known of the buffered partial frame.
#[derive(Debug, Default)]
enum Progress {
    #[default]
    None,
    /// An inline line: these first bytes hold no LF.
    Inline { searched: usize },
    /// A multibulk frame of `count` arguments: `ranges` were read, and the
    /// next bulk header starts at `at`.
    Multibulk {
        count: usize,
        ranges: Vec<Range<usize>>,
        at: usize,
    },
}

impl RequestDecoder {
    pub fn new(max_request: usize) -> Self {
        RequestDecoder {
            max_request,
            need: 0,
            progress: Progress::None,
            scanned_len: 0,
            scanned: 0,
        }
    }

    /// Bytes the scans have looked at so far, over every frame decoded.
    pub fn scanned(&self) -> u64 {
        self.scanned
    }

    /// Done with the frame at the front of the buffer.
    fn forget(&mut self) {
        self.need = 0;
        self.progress = Progress::None;
        self.scanned_len = 0;
    }
}

enum Scan {
    /// A complete request: its length and the ranges of its arguments.
    Complete(usize, Vec<Range<usize>>),
    /// A complete inline request: its length and its arguments.
    Inline(usize, Vec<InlineArg>),
    /// Not yet complete; the frame needs at least this many bytes.
    Partial(usize),
    /// Nothing but an empty line or an empty array; skip these bytes.
    Skip(usize),
}

impl Decoder for RequestDecoder {
    type Item = Request;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Request>, ProtocolError> {
        loop {
            if src.len() < self.scanned_len {
                self.forget();
            }
            if src.is_empty() || src.len() < self.need {
                return Ok(None);
            }
            if src[0] == b'*'
                && matches!(self.progress, Progress::None)
                && let Some(small) = scan_small(src, self.max_request)
            {
                self.scanned += small.len as u64;
                let frame = src.split_to(small.len).freeze();
                let args = small.args[..small.count]
                    .iter()
                    .map(|r| frame.slice(r.start as usize..r.end as usize))
                    .collect();
                return Ok(Some(Request { args }));
            }
            let scan = if src[0] == b'*' {
                scan_multibulk(src, self.max_request, &mut self.progress, &mut self.scanned)
            } else {
                scan_inline(src, self.max_request, &mut self.progress, &mut self.scanned)
            };
            let scan = scan.inspect_err(|_| self.forget())?;
            match scan {
                Scan::Complete(len, ranges) => {
                    self.forget();
                    let frame = src.split_to(len).freeze();
                    let args = ranges.into_iter().map(|r| frame.slice(r)).collect();
                    return Ok(Some(Request { args }));
                }
                Scan::Inline(len, inline) => {
                    self.forget();
                    let frame = src.split_to(len).freeze();
                    let args = inline
                        .into_iter()
                        .map(|arg| match arg {
                            InlineArg::Slice(range) => frame.slice(range),
                            InlineArg::Unquoted(bytes) => Bytes::from(bytes),
                        })
                        .collect();
                    return Ok(Some(Request { args }));
                }
                Scan::Partial(need) => {
                    self.need = need;
                    self.scanned_len = src.len();
                    return Ok(None);
                }
                Scan::Skip(len) => {
                    self.forget();
                    src.advance(len);
                }
            }
        }
    }
}

/// A small request (at most [`SMALL_ARGS`] arguments of short lengths)
/// that is all in the buffer.
struct Small {
    len: usize,
    count: usize,
    args: [std::ops::Range<u32>; SMALL_ARGS],
}

/// The most arguments a request framed by [`scan_small`] has: every stock
/// command but an order fits.
const SMALL_ARGS: usize = 8;

/// Frames a complete request of a few short arguments in one pass: what
/// nearly every request is. `None` for anything else (an incomplete or
/// larger request, a malformed one), which [`scan_multibulk`] then frames
/// or refuses with the reason; so this accepts only what that accepts,
/// and frames it alike.
fn scan_small(buf: &[u8], max_request: usize) -> Option<Small> {
    // `*N\r\n`, N one digit. (The decoder looks at the `*` first; this
    // frames only what it would, whoever calls it.)
    if *buf.first()? != b'*' {
        return None;
    }
    let count = usize::from(buf.get(1)?.wrapping_sub(b'0'));
    if !(1..=SMALL_ARGS).contains(&count) || buf.get(2..4)? != b"\r\n" {
        return None;
    }
    let mut small = Small {
        len: 0,
        count,
        args: std::array::from_fn(|_| 0..0),
    };
    let mut at = 4;
    for arg in &mut small.args[..count] {
        if *buf.get(at)? != b'$' {
            return None;
        }
        // `$len\r\n`, len at most four digits.
        let mut len = 0usize;
        let mut end = at + 1;
        loop {
            let d = *buf.get(end)?;
            if d == b'\r' {
                break;
            }
            if !d.is_ascii_digit() || end - at > 4 {
                return None;
            }
            len = len * 10 + usize::from(d - b'0');
            end += 1;
        }
        if end == at + 1 || *buf.get(end + 1)? != b'\n' {
            return None;
        }
        let start = end + 2;
        let stop = start + len;
        if buf.get(stop..stop + 2)? != b"\r\n" {
            return None;
        }
        *arg = start as u32..stop as u32;
        at = stop + 2;
    }
    (at <= max_request).then_some(())?;
    small.len = at;
    Some(small)
}

/// Reads a header line (`*3\r\n`, `$5\r\n`) at `at`: its integer and the
/// offset after its CRLF, or `None` when the line is not complete yet.
fn header(
    buf: &[u8],
    at: usize,
    what: &str,
    scanned: &mut u64,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[at..buf.len().min(at + MAX_HEADER)];
    let cr = window.iter().position(|&b| b == b'\r');
    *scanned += cr.map_or(window.len(), |cr| cr + 1) as u64;
    let Some(cr) = cr else {
        return if window.len() >= MAX_HEADER {
            Err(ProtocolError(format!("invalid {what} length")))
        } else {
            Ok(None)
        };
    };
    if cr + 1 >= window.len() {
        // The LF is still to come; unless the window is full, and then it
        // would be past MAX_HEADER: no later byte can make this a header.
        return if window.len() >= MAX_HEADER {
            Err(ProtocolError(format!("invalid {what} length")))
        } else {
            Ok(None)
        };
    }
    if window[cr + 1] != b'\n' {
        return Err(ProtocolError(format!("invalid {what} length")));
    }
    let digits = &window[1..cr];
    let value = match digits {
        // Every header a client sends in practice: a few plain digits.
        [_, ..] if digits.len() <= 18 && digits.iter().all(u8::is_ascii_digit) => digits
            .iter()
            .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0')),
        // Anything else as the standard library reads an i64 (a sign, more
        // digits), but never a leading '+', which Redis refuses.
        _ => std::str::from_utf8(digits)
            .ok()
            .filter(|s| !s.is_empty() && !s.starts_with('+'))
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| ProtocolError(format!("invalid {what} length")))?,
    };
    Ok(Some((value, at + cr + 2)))
}

fn scan_multibulk(
    buf: &[u8],
    max_request: usize,
    progress: &mut Progress,
    scanned: &mut u64,
) -> Result<Scan, ProtocolError> {
    if !matches!(progress, Progress::Multibulk { .. }) {
        let Some((count, at)) = header(buf, 0, "multibulk", scanned)? else {
            return Ok(Scan::Partial(buf.len() + 1));
        };
        if count <= 0 {
            // Redis ignores `*0` and `*-1` requests; so does stockgate.
            return Ok(Scan::Skip(at));
        }
        if count as usize > max_args(max_request) {
            return Err(ProtocolError("invalid multibulk length".into()));
        }
        *progress = Progress::Multibulk {
            count: count as usize,
            ranges: Vec::with_capacity((count as usize).min(PREALLOCATED_ARGS)),
            at,
        };
    }
    let Progress::Multibulk { count, ranges, at } = progress else {
        unreachable!("a multibulk scan was set up just above");
    };
    // Each bulk read is kept in `progress`: a partial frame is never
    // scanned twice, only its unfinished bulk header or bulk.
    while ranges.len() < *count {
        if *at >= buf.len() {
            return partial(*at + 1, max_request);
        }
        if buf[*at] != b'$' {
            return Err(ProtocolError(format!(
                "expected '$', got '{}'",
                printable(buf[*at])
            )));
        }
        let Some((len, start)) = header(buf, *at, "bulk", scanned)? else {
            return partial(buf.len() + 1, max_request);
        };
        if len < 0 || len as usize > max_request {
            return Err(ProtocolError("invalid bulk length".into()));
        }
        let end = start + len as usize;
        if end + 2 > max_request {
            return Err(ProtocolError(format!(
                "request larger than {max_request} bytes"
            )));
        }
        if buf.len() < end + 2 {
            return Ok(Scan::Partial(end + 2));
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not terminated by CRLF".into()));
        }
        ranges.push(start..end);
        *at = end + 2;
    }
    Ok(Scan::Complete(*at, std::mem::take(ranges)))
}

/// A frame that is not complete yet and needs at least `need` bytes: one
/// that can only end past `max_request` is refused now, not after more
/// bytes were buffered for it.
fn partial(need: usize, max_request: usize) -> Result<Scan, ProtocolError> {
    if need > max_request {
        return Err(ProtocolError(format!(
            "request larger than {max_request} bytes"
        )));
    }
    Ok(Scan::Partial(need))
}

fn scan_inline(
    buf: &[u8],
    max_request: usize,
    progress: &mut Progress,
    scanned: &mut u64,
) -> Result<Scan, ProtocolError> {
    let window = &buf[..buf.len().min(max_request)];
    // Bytes searched on an earlier read hold no LF; go on after them.
    let from = match *progress {
        Progress::Inline { searched } => searched.min(window.len()),
        _ => 0,
    };
    let nl = window[from..]
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| from + i);
    *scanned += (nl.map_or(window.len(), |nl| nl + 1) - from) as u64;
    let Some(nl) = nl else {
        return if window.len() >= max_request {
            Err(ProtocolError("too big inline request".into()))
        } else {
            *progress = Progress::Inline {
                searched: window.len(),
            };
            Ok(Scan::Partial(buf.len() + 1))
        };
    };
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    // The line is split once, when its end has arrived: a trickled line
    // is searched for its LF incrementally above, never split twice.
    *scanned += line_end as u64;
    let args = split_inline(&buf[..line_end], max_args(max_request))?;
    if args.is_empty() {
        return Ok(Scan::Skip(nl + 1));
    }
    Ok(Scan::Inline(nl + 1, args))
}

/// One argument of an inline request.
#[derive(Debug, PartialEq, Eq)]
enum InlineArg {
    /// Bytes of the line as they are (no quotes in the argument).
    Slice(Range<usize>),
    /// What quotes and escapes made of the bytes.
    Unquoted(Vec<u8>),
}

/// C's `isspace`: what Redis skips between arguments (Rust's
/// `is_ascii_whitespace` leaves out the vertical tab).
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Splits an inline line into arguments as Redis's `sdssplitargs` does:
///
/// - arguments are separated by blanks (C's `isspace`, skipped however
///   many); an unquoted argument ends at a space, tab, CR or LF (not at a
///   vertical tab or form feed, which stay in it);
/// - `"..."` may hold blanks and the escapes `\xHH` (two hex digits),
///   `\n`, `\r`, `\t`, `\b`, `\a`, and `\` before any other byte for
///   that byte;
/// - `'...'` may hold blanks, and `\'` for a quote; other bytes are as they
///   are;
/// - a quote may start in the middle of an argument (`a"b c"` is `ab c`),
///   but a closing quote must be followed by a blank or the end of the
///   line, and every quote must close: otherwise it is Redis's protocol
///   error, "unbalanced quotes in request".
///
/// One difference, on purpose: a NUL byte is an ordinary byte here. Redis
/// looks for the line's end with `strchr`, which stops at a NUL, so it
/// never finds the end of a line holding one and waits for more until the
/// line passes 64 KiB; stockgate takes the line as it is.
fn split_inline(line: &[u8], max_args: usize) -> Result<Vec<InlineArg>, ProtocolError> {
    let unbalanced = || ProtocolError("unbalanced quotes in request".into());
    let closes = |at: usize| at + 1 >= line.len() || is_c_space(line[at + 1]);
    let mut args = Vec::new();
    let mut at = 0;
    loop {
        while at < line.len() && is_c_space(line[at]) {
            at += 1;
        }
        if at == line.len() {
            return Ok(args);
        }
        if args.len() == max_args {
            return Err(ProtocolError("invalid multibulk length".into()));
        }
        let start = at;
        // Only an argument with quotes in it needs bytes of its own.
        let mut unquoted: Option<Vec<u8>> = None;
        while let Some(&b) = line.get(at) {
            match b {
                b' ' | b'\t' | b'\r' | b'\n' => break,
                b'"' | b'\'' => {
                    let word = unquoted.get_or_insert_with(|| line[start..at].to_vec());
                    at = if b == b'"' {
                        double_quoted(line, at + 1, word).ok_or_else(unbalanced)?
                    } else {
                        single_quoted(line, at + 1, word).ok_or_else(unbalanced)?
                    };
                    // `at` is the closing quote.
                    if !closes(at) {
                        return Err(unbalanced());
                    }
                    at += 1;
                    break;
                }
                _ => {
                    if let Some(word) = &mut unquoted {
                        word.push(b);
                    }
                    at += 1;
                }
            }
        }
        args.push(match unquoted {
            Some(word) => InlineArg::Unquoted(word),
            None => InlineArg::Slice(start..at),
        });
    }
}

/// Reads a `"..."` body from `at` into `word`; the closing quote's offset,
/// or `None` when the line ends first.
fn double_quoted(line: &[u8], mut at: usize, word: &mut Vec<u8>) -> Option<usize> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    loop {
        match *line.get(at)? {
            b'\\' if line.get(at + 1) == Some(&b'x') => {
                let digits = (
                    line.get(at + 2).and_then(|&b| hex(b)),
                    line.get(at + 3).and_then(|&b| hex(b)),
                );
                if let (Some(high), Some(low)) = digits {
                    word.push(high * 16 + low);
                    at += 4;
                } else {
                    // Not two hex digits: `\x` is an `x`, as any other.
                    word.push(b'x');
                    at += 2;
                }
            }
            b'\\' if at + 1 < line.len() => {
                word.push(match line[at + 1] {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'b' => 0x08,
                    b'a' => 0x07,
                    other => other,
                });
                at += 2;
            }
            b'"' => return Some(at),
            b => {
                word.push(b);
                at += 1;
            }
        }
    }
}

/// Reads a `'...'` body from `at` into `word`: only `\'` is an escape.
fn single_quoted(line: &[u8], mut at: usize, word: &mut Vec<u8>) -> Option<usize> {
    loop {
        match *line.get(at)? {
            b'\\' if line.get(at + 1) == Some(&b'\'') => {
                word.push(b'\'');
                at += 2;
            }
            b'\'' => return Some(at),
            b => {
                word.push(b);
                at += 1;
            }
        }
    }
}

fn printable(b: u8) -> char {
    if b.is_ascii_graphic() { b as char } else { '?' }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A request the one-pass framing takes is framed exactly as the
        /// careful framing frames it, whatever the bytes (well-formed
        /// requests, then the same with one byte changed or cut short).
        #[test]
        fn the_small_framing_agrees_with_the_careful_one(
            args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 1..10),
            flip in any::<Option<(usize, u8)>>(),
            cut in any::<Option<usize>>(),
            max_request in prop_oneof![Just(64usize), Just(65536)],
        ) {
            let mut buf = format!("*{}\r\n", args.len()).into_bytes();
            for arg in &args {
                buf.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                buf.extend_from_slice(arg);
                buf.extend_from_slice(b"\r\n");
            }
            if let Some((at, byte)) = flip {
                let at = at % buf.len();
                buf[at] = byte;
            }
            if let Some(cut) = cut {
                buf.truncate(cut % (buf.len() + 1));
            }
            if let Some(small) = scan_small(&buf, max_request) {
                let careful = scan_multibulk(&buf, max_request, &mut Progress::None, &mut 0);
                let Ok(Scan::Complete(len, ranges)) = careful else {
                    return Err(TestCaseError::fail(format!("careful framing refused {buf:?}")));
                };
                prop_assert_eq!(len, small.len);
                let small_ranges: Vec<Range<usize>> = small.args[..small.count]
                    .iter()
                    .map(|r| r.start as usize..r.end as usize)
                    .collect();
                prop_assert_eq!(ranges, small_ranges);
            }
        }
    }

    /// The case the property test once found: a well-formed request whose
    /// leading `*` is flipped is no multibulk to either framing.
    #[test]
    fn a_request_without_its_star_is_not_framed_small() {
        for lead in [b'\r', b'$', b'+', b'D'] {
            let mut buf = b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n".to_vec();
            buf[0] = lead;
            assert!(scan_small(&buf, 65536).is_none(), "{buf:?}");
        }
    }

    fn decode_all(input: &[u8]) -> Result<Vec<Vec<String>>, ProtocolError> {
        let mut decoder = RequestDecoder::new(64 * 1024);
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(req) = decoder.decode(&mut buf)? {
            out.push(
                req.args
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect(),
            );
        }
        Ok(out)
    }

    #[test]
    fn multibulk_and_inline_requests() {
        let got =
            decode_all(b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING\r\n  \r\nDEDUCT a 1  r\n").unwrap();
        assert_eq!(
            got,
            vec![
                vec!["ECHO", "hi"],
                vec!["PING"],
                vec!["DEDUCT", "a", "1", "r"]
            ]
        );
        assert_eq!(
            decode_all(b"*0\r\n*-1\r\n*1\r\n$0\r\n\r\n").unwrap(),
            vec![vec![""]]
        );
    }

    #[test]
    fn inline_quotes_split_as_redis_splits_them() {
        // Each reply checked against redis-server 7.0.15 (and, over a
        // socket, by tests/conformance.rs).
        let cases: &[(&[u8], &[&[u8]])] = &[
            (b"ECHO \"two words\"\r\n", &[b"ECHO", b"two words"]),
            (b"ECHO 'two words'\n", &[b"ECHO", b"two words"]),
            (b"ECHO a\"b c\"\r\n", &[b"ECHO", b"ab c"]),
            (
                b"ECHO \"\\x41\\x4g\\xZZ\\n\\r\\t\\b\\a\\q\\\\\\\"\"\r\n",
                &[b"ECHO", b"Ax4gxZZ\n\r\t\x08\x07q\\\""],
            ),
            (b"ECHO 'a\\'b\\n\"'\r\n", &[b"ECHO", b"a'b\\n\""]),
            (b"ECHO \"\"\r\n", &[b"ECHO", b""]),
            (b"\"\"\r\n", &[b""]),
            (b"ECHO a\x0bb\r\n", &[b"ECHO", b"a\x0bb"]),
            // A form feed ends no argument, though it is skipped before one.
            (b"ECHO \x0c\x0bx\x0c\r\n", &[b"ECHO", b"x\x0c"]),
            (b"ECHO \"a\"\x0b\r\n", &[b"ECHO", b"a"]),
            (b"ECHO a\rb\r\n", &[b"ECHO", b"a", b"b"]),
            (b"ECHO\ta  'b'\r\r\n", &[b"ECHO", b"a", b"b"]),
            (b"ECHO \"a\x00b\"\n", &[b"ECHO", b"a\x00b"]),
        ];
        for (line, args) in cases {
            let mut decoder = RequestDecoder::new(64 * 1024);
            let mut buf = BytesMut::from(*line);
            let request = decoder.decode(&mut buf).unwrap().expect("a request");
            let got: Vec<&[u8]> = request.args.iter().map(|a| &a[..]).collect();
            assert_eq!(&got, args, "{:?}", String::from_utf8_lossy(line));
            assert!(buf.is_empty());
        }
        for line in [
            &b"ECHO \"a\"b\r\n"[..],
            b"ECHO 'a'b\r\n",
            b"ECHO \"ab\r\n",
            b"ECHO 'ab\r\n",
            b"ECHO \"\\\r\n",
            b"ECHO \"a\"\"b\"\r\n",
        ] {
            assert_eq!(
                decode_all(line),
                Err(ProtocolError("unbalanced quotes in request".into())),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
        // A blank line of any of C's blanks is skipped, as Redis skips it.
        assert_eq!(
            decode_all(b" \t\x0b\x0c\r\nPING\r\n").unwrap(),
            vec![vec!["PING"]]
        );
    }

    #[test]
    fn an_unquoted_inline_argument_is_a_slice_of_the_frame() {
        let mut decoder = RequestDecoder::new(64 * 1024);
        let mut buf = BytesMut::from(&b"ECHO plain \"quoted\"\r\n"[..]);
        let request = decoder.decode(&mut buf).unwrap().unwrap();
        // The name and `plain` share one allocation, the frame's; only
        // the quoted argument needed bytes of its own.
        let frame = request.args[0].as_ptr() as usize;
        assert_eq!(request.args[1].as_ptr() as usize, frame + 5);
        assert_eq!(&request.args[2][..], b"quoted");
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let whole = b"*3\r\n$6\r\nDEDUCT\r\n$3\r\nsku\r\n$1\r\n1\r\n";
        for cut in 1..whole.len() {
            let mut decoder = RequestDecoder::new(64 * 1024);
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(decoder.decode(&mut buf).unwrap(), None, "cut at {cut}");
            buf.extend_from_slice(&whole[cut..]);
            let req = decoder.decode(&mut buf).unwrap().expect("complete");
            assert_eq!(req.args.len(), 3);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn malformed_requests_are_protocol_errors() {
        // From Redis's own protocol tests, and then some.
        let cases: &[&[u8]] = &[
            b"*3000000000\r\n",
            b"*1\r\n$-10\r\n",
            b"*1\r\n$2000000000\r\n",
            b"*1\r\n$blabla\r\n",
            b"*1\r\nfoo\r\n",
            b"*1\r\n*1\r\n$1\r\na\r\n",
            b"*1\r\n:1\r\n",
            b"*1\r\n$1\r\nabc\r\n",
            b"*+1\r\n$1\r\na\r\n",
            b"*1x\r\n",
        ];
        for case in cases {
            assert!(
                decode_all(case).is_err(),
                "{:?} should be refused",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let nested = b"*1\r\n".repeat(16 * 1024);
        let err = decode_all(&nested).unwrap_err();
        assert_eq!(err.0, "expected '$', got '*'");
    }

    #[test]
    fn unterminated_input_is_bounded() {
        let mut decoder = RequestDecoder::new(64 * 1024);
        let mut buf = BytesMut::from(&vec![0u8; 64 * 1024][..]);
        assert_eq!(
            decoder.decode(&mut buf).unwrap_err().0,
            "too big inline request"
        );
        let mut decoder = RequestDecoder::new(64 * 1024);
        let mut buf = BytesMut::from(&b"*1\r\n$65530\r\n"[..]);
        buf.extend_from_slice(&[b'a'; 100]);
        assert!(decoder.decode(&mut buf).is_err(), "over the request limit");
    }

    #[test]
    fn a_frame_that_can_only_end_past_the_limit_is_refused_at_once() {
        // Found by the fuzzer (tests/fuzz): 512 bytes of a 3-argument
        // request whose second bulk ends exactly at the limit. The frame
        // can't complete within 512 bytes, so waiting for the third is
        // buffering past --max-request-bytes.
        let mut whole = b"*3\r\n$4\r\nECHO\r\n$490\r\n".to_vec();
        whole.extend_from_slice(&[b'z'; 490]);
        whole.extend_from_slice(b"\r\n");
        assert_eq!(whole.len(), 512);
        for tail in [&b""[..], b"$", b"$1", b"$1\r"] {
            let mut decoder = RequestDecoder::new(512);
            let mut buf = BytesMut::from(&whole[..]);
            buf.extend_from_slice(tail);
            assert_eq!(
                decoder.decode(&mut buf),
                Err(ProtocolError("request larger than 512 bytes".into())),
                "with {:?} after the second bulk",
                String::from_utf8_lossy(tail)
            );
        }
        // One byte less is a frame that may still fit: it waits.
        let mut decoder = RequestDecoder::new(513);
        let mut buf = BytesMut::from(&whole[..]);
        assert_eq!(decoder.decode(&mut buf), Ok(None));
        // And a request of exactly the limit is served.
        let mut exact = b"*2\r\n$4\r\nECHO\r\n$490\r\n".to_vec();
        exact.extend_from_slice(&[b'z'; 490]);
        exact.extend_from_slice(b"\r\n");
        let limit = exact.len();
        let mut decoder = RequestDecoder::new(limit);
        let mut buf = BytesMut::from(&exact[..]);
        assert_eq!(decoder.decode(&mut buf).unwrap().unwrap().args.len(), 2);
    }

    #[test]
    fn the_byte_limit_bounds_the_arguments_too() {
        // Any request within the byte limit is framed, however many
        // arguments it has (an ORDER of many lines is answered, not cut).
        let max = 64 * 1024;
        let count = 5000;
        let mut request = format!("*{count}\r\n").into_bytes();
        for _ in 0..count {
            request.extend_from_slice(b"$1\r\na\r\n");
        }
        assert!(request.len() <= max);
        let mut buf = BytesMut::from(&request[..]);
        let framed = RequestDecoder::new(max).decode(&mut buf).unwrap().unwrap();
        assert_eq!(framed.args.len(), count);
        // A count that could never fit is refused at its header.
        let mut buf = BytesMut::from(format!("*{}\r\n", max_args(max) + 1).as_bytes());
        assert_eq!(
            RequestDecoder::new(max).decode(&mut buf),
            Err(ProtocolError("invalid multibulk length".into()))
        );
    }

    #[test]
    fn a_header_line_past_its_limit_is_refused_whatever_follows() {
        // Found by the fuzzer (tests/fuzz): a header whose CR is its 32nd
        // byte looked unfinished for ever (its LF would be the 33rd), so the
        // decoder waited, buffering whatever came next without bound.
        for (head, what) in [("*", "multibulk"), ("*1\r\n$", "bulk")] {
            let mut stream = head.as_bytes().to_vec();
            stream.extend_from_slice(&[b'1'; 30]);
            stream.extend_from_slice(b"\r\n");
            stream.extend_from_slice(&[b'x'; 100 * 1024]);
            let mut decoder = RequestDecoder::new(64 * 1024);
            let mut buf = BytesMut::new();
            let mut result = Ok(None);
            for chunk in stream.chunks(7) {
                buf.extend_from_slice(chunk);
                result = decoder.decode(&mut buf);
                if result.is_err() {
                    break;
                }
                assert!(buf.len() < 64, "{} bytes buffered for a header", buf.len());
            }
            assert_eq!(
                result,
                Err(ProtocolError(format!("invalid {what} length"))),
                "{head:?}"
            );
        }
        // 29 digits still fit: `*`, the digits and CRLF are 32 bytes.
        let mut decoder = RequestDecoder::new(64 * 1024);
        let mut buf = BytesMut::from(&b"*00000000000000000000000000001\r\n$4\r\nPING\r\n"[..]);
        assert_eq!(decoder.decode(&mut buf).unwrap().unwrap().args.len(), 1);
    }

    #[test]
    fn a_request_trickled_byte_by_byte_costs_linear_work() {
        // A client may send one byte per read. Scanning the whole partial
        // frame again on every read made that quadratic: 6 s of CPU (debug
        // build; 0.6 s release) for one 64 KiB inline line, or for a 32 KiB
        // multibulk frame of long bulk headers, and minutes past 1 MiB.
        // Counted in bytes looked at, not timed: a busy machine can't fail
        // it and a fast one can't hide a quadratic scan. Quadratic would be
        // about n²/2 bytes (2·10⁹ here); linear is at most a header's
        // length per byte received.
        let max = 64 * 1024;
        let mut multibulk = b"*1024\r\n".to_vec();
        for _ in 0..1023 {
            multibulk.extend_from_slice(b"$00000000000000000000000001\r\na\r\n");
        }
        let line = vec![b'a'; max - 1];
        // The stream, what completes it, its arguments' count and last, and
        // how many bytes framing it may look at per byte received: an
        // inline line is searched once for its end and split once; a bulk
        // header, at most MAX_HEADER long, is looked at again as each of
        // its bytes arrives, and bulk bodies are not looked at.
        let cases = [
            (line.clone(), &b"\n"[..], 1, line, 2),
            (multibulk, b"$1\r\nb\r\n", 1024, b"b".to_vec(), MAX_HEADER),
        ];
        for (stream, end, args, last, per_byte) in cases {
            let mut decoder = RequestDecoder::new(max);
            let mut buf = BytesMut::new();
            for &byte in &stream {
                buf.extend_from_slice(&[byte]);
                assert_eq!(decoder.decode(&mut buf), Ok(None));
            }
            buf.extend_from_slice(end);
            let request = decoder.decode(&mut buf).unwrap().expect("complete");
            assert_eq!(request.args.len(), args);
            assert_eq!(request.args[args - 1], last);
            let received = (stream.len() + end.len()) as u64;
            assert!(
                decoder.scanned() <= per_byte as u64 * received,
                "{received} bytes one at a time cost {} bytes of scanning",
                decoder.scanned()
            );
            // The same frame in one read is looked at about once.
            let mut whole = RequestDecoder::new(max);
            let mut buf = BytesMut::from(&[&stream[..], end].concat()[..]);
            whole.decode(&mut buf).unwrap().expect("complete");
            assert!(whole.scanned() <= 2 * received, "{}", whole.scanned());
        }
    }
}

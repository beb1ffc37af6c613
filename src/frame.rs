//! RESP on the way in: framing client requests. (Replies, and the
//! commands sent to Redis, are written by [`crate::reply`].)
//!
//! # Requests
//!
//! Clients send a command as an array of bulk strings (`*N` then `N` times
//! `$len`), or as one inline line (`PING\r\n`, as telnet and `nc` do).
//! Redis itself accepts nothing else, and neither does stockgate: a nested
//! array or any other type is a protocol error.
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
/// Most arguments in one request. stockgate's commands take a handful.
pub const MAX_ARGS: usize = 1024;

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
        }
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
            let scan = if src[0] == b'*' {
                scan_multibulk(src, self.max_request, &mut self.progress)
            } else {
                scan_inline(src, self.max_request, &mut self.progress)
            };
            let scan = scan.inspect_err(|_| self.forget())?;
            match scan {
                Scan::Complete(len, ranges) => {
                    self.forget();
                    let frame = src.split_to(len).freeze();
                    let args = ranges.into_iter().map(|r| frame.slice(r)).collect();
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

/// Reads a header line (`*3\r\n`, `$5\r\n`) at `at`: its integer and the
/// offset after its CRLF, or `None` when the line is not complete yet.
fn header(buf: &[u8], at: usize, what: &str) -> Result<Option<(i64, usize)>, ProtocolError> {
    let window = &buf[at..buf.len().min(at + MAX_HEADER)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
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
    let value = std::str::from_utf8(digits)
        .ok()
        .filter(|s| !s.is_empty() && !s.starts_with('+'))
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| ProtocolError(format!("invalid {what} length")))?;
    Ok(Some((value, at + cr + 2)))
}

fn scan_multibulk(
    buf: &[u8],
    max_request: usize,
    progress: &mut Progress,
) -> Result<Scan, ProtocolError> {
    if !matches!(progress, Progress::Multibulk { .. }) {
        let Some((count, at)) = header(buf, 0, "multibulk")? else {
            return Ok(Scan::Partial(buf.len() + 1));
        };
        if count <= 0 {
            // Redis ignores `*0` and `*-1` requests; so does stockgate.
            return Ok(Scan::Skip(at));
        }
        if count as usize > MAX_ARGS {
            return Err(ProtocolError("invalid multibulk length".into()));
        }
        *progress = Progress::Multibulk {
            count: count as usize,
            ranges: Vec::with_capacity(count as usize),
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
        let Some((len, start)) = header(buf, *at, "bulk")? else {
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
) -> Result<Scan, ProtocolError> {
    let window = &buf[..buf.len().min(max_request)];
    // Bytes searched on an earlier read hold no LF; go on after them.
    let from = match *progress {
        Progress::Inline { searched } => searched.min(window.len()),
        _ => 0,
    };
    let Some(nl) = window[from..]
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| from + i)
    else {
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
    let mut ranges = Vec::new();
    let mut start = None;
    for (i, &b) in buf[..line_end].iter().enumerate() {
        match (b.is_ascii_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                ranges.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        ranges.push(s..line_end);
    }
    if ranges.len() > MAX_ARGS {
        return Err(ProtocolError("invalid multibulk length".into()));
    }
    if ranges.is_empty() {
        return Ok(Scan::Skip(nl + 1));
    }
    Ok(Scan::Complete(nl + 1, ranges))
}

fn printable(b: u8) -> char {
    if b.is_ascii_graphic() { b as char } else { '?' }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_request_trickled_byte_by_byte_costs_linear_time() {
        // A client may send one byte per read. Scanning the whole partial
        // frame again on every read made that quadratic: 6 s of CPU (debug
        // build; 0.6 s release) for one 64 KiB inline line, or for a 32 KiB
        // multibulk frame of long bulk headers, and minutes past 1 MiB.
        let max = 64 * 1024;
        let mut multibulk = b"*1024\r\n".to_vec();
        for _ in 0..1023 {
            multibulk.extend_from_slice(b"$00000000000000000000000001\r\na\r\n");
        }
        let line = vec![b'a'; max - 1];
        // The stream, what completes it, and its arguments' count and last.
        let cases = [
            (line.clone(), &b"\n"[..], 1, line),
            (multibulk, b"$1\r\nb\r\n", 1024, b"b".to_vec()),
        ];
        for (stream, end, args, last) in cases {
            let started = std::time::Instant::now();
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
            let took = started.elapsed();
            assert!(
                took < std::time::Duration::from_secs(1),
                "{} bytes one at a time took {took:?}",
                stream.len()
            );
        }
    }
}

//! The request path under hostile input, and the invariants it must keep.
//!
//! One implementation for both drivers: the coverage-guided fuzz target
//! (`tests/fuzz/fuzz_targets/resp.rs`, see `tests/fuzz/README.md`) and the
//! proptest pass in the normal suite (`tests/fuzz_props.rs`), which include
//! this file with `#[path]`.
//!
//! [`check`] plays one connection as `connection::run` does: the bytes
//! arrive in the given chunks, each read is followed by `decode` until it
//! answers `None`, every request goes through `command::execute`, stock
//! commands through the stock service (against an upstream that never
//! connects, so they are answered at once: code 3 for bad arguments, a
//! not-ready error otherwise), and every reply is encoded in the protocol
//! the session speaks then. It panics, with the reason, when an invariant
//! breaks:
//!
//! - nothing panics, and no stock command waits (its future is ready on the
//!   first poll: nothing may hang without an upstream);
//! - after `decode` answers `None`, fewer than `max_request` bytes are
//!   buffered: a frame that could only complete past the limit is refused;
//! - a malformed stream ends in one `Protocol error: ...`, answered as
//!   `-ERR Protocol error: ...`, and nothing after it is read;
//! - every request has a name, and its arguments are, in order, slices of
//!   the bytes the decoder consumed for it; an inline request's are its
//!   line split as Redis's `sdssplitargs` splits it (ported here as the
//!   reference), and a line refused for its quotes is one Redis refuses;
//! - how the stream is split into reads changes nothing: the requests and
//!   the error are those of decoding it whole;
//! - every reply decodes back with redis-protocol's own decoder of the
//!   session's protocol, to exactly its bytes, and encodes again to the same
//!   bytes; error replies are one line; and the redis crate's parser, an
//!   independent one, reads it as one value with no byte left over;
//! - the same holds for replies built from the input itself
//!   ([`check_reply_program`]), which reach integers the request path
//!   can't (every i64 a remain or a version may hold);
//! - the parameter parsers accept exactly their documented rules, and what
//!   they accept spells back to the bytes sent (canonical integers).

#![allow(dead_code)] // each driver uses its own part

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use stockgate::auth::Password;
use stockgate::command::Session;
use stockgate::config::{AccessLog, Config};
use stockgate::dispatch::{self, Action};
use stockgate::frame::{ProtocolError, Request, RequestDecoder};
use stockgate::outcome::Code;
use stockgate::params::{
    Delta, MAX_FIELD_LEN, MAX_STOCK, OrderNo, Qty, RequestId, Sku, StockLevel,
};
use stockgate::reply::{Protocol, Reply};
use stockgate::state::Shared;
use stockgate::stock::{Limits, OneRequest, StockCommand};
use tokio_util::codec::Decoder;

/// The password of the locked-down server.
pub const PASSWORD: &[u8] = b"fuzz-secret";
/// The locked-down server's `--max-qty`, small enough to reach.
pub const LOCKED_MAX_QTY: u64 = 1000;

/// The state of two servers, built once per process, never connected:
/// the defaults, and a locked-down one (password, admin commands, stale-id
/// rejection, the full access log, a small max qty).
pub fn shared(locked: bool) -> &'static Shared {
    static OPEN: OnceLock<Shared> = OnceLock::new();
    static LOCKED: OnceLock<Shared> = OnceLock::new();
    let cell = if locked { &LOCKED } else { &OPEN };
    cell.get_or_init(|| {
        // Port 1 on loopback: nothing is ever sent there, the upstream task
        // is not started.
        let mut config = Config::for_upstream(vec!["redis://127.0.0.1:1".into()]);
        if locked {
            config.password = Password::new(PASSWORD);
            config.admin_commands = true;
            config.reject_stale_ids = true;
            config.access_log = AccessLog::All;
            config.max_qty = LOCKED_MAX_QTY;
        }
        Shared::new(config, 6380)
    })
}

/// One connection's worth of input.
pub struct Case<'a> {
    pub stream: &'a [u8],
    pub max_request: usize,
    /// Lengths of the reads; the rest of the stream arrives in one last read.
    pub reads: Vec<usize>,
    pub locked: bool,
}

/// What one case came to, for the drivers' statistics.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The requests decoded, as their arguments.
    pub decoded: Vec<Vec<Bytes>>,
    pub requests: usize,
    pub replies: usize,
    pub protocol_error: bool,
    pub quit: bool,
}

/// Decodes `stream` as one read: the reference the split reads must match.
pub fn decode_whole(stream: &[u8], max_request: usize) -> (Vec<Request>, Option<ProtocolError>) {
    let mut decoder = RequestDecoder::new(max_request);
    let mut buf = BytesMut::from(stream);
    let mut requests = Vec::new();
    loop {
        match decoder.decode(&mut buf) {
            Ok(Some(request)) => requests.push(request),
            Ok(None) => return (requests, None),
            Err(err) => return (requests, Some(err)),
        }
    }
}

/// Runs one case and checks every invariant (see the module docs).
pub fn check(case: &Case<'_>) -> Outcome {
    let shared = shared(case.locked);
    let (whole, whole_err) = decode_whole(case.stream, case.max_request);

    let mut decoder = RequestDecoder::new(case.max_request);
    let mut session = Session::new(7, shared.users.open_account());
    let mut input = BytesMut::new();
    let mut output = BytesMut::new();
    let mut outcome = Outcome::default();
    let mut fed = 0;
    let mut reads = case
        .reads
        .iter()
        .copied()
        .chain(std::iter::once(usize::MAX));

    'connection: while fed < case.stream.len() {
        let len = reads.next().unwrap_or(usize::MAX).max(1);
        let chunk = &case.stream[fed..fed.saturating_add(len).min(case.stream.len())];
        input.extend_from_slice(chunk);
        fed += chunk.len();
        loop {
            let before = fed - input.len();
            match decoder.decode(&mut input) {
                Ok(Some(request)) => {
                    let after = fed - input.len();
                    check_request(&request, &case.stream[before..after], case.max_request);
                    assert!(
                        outcome.requests < whole.len() && whole[outcome.requests] == request,
                        "request {} differs from decoding the stream whole: {request:?}",
                        outcome.requests
                    );
                    outcome.requests += 1;
                    outcome.decoded.push(request.args.clone());
                    match run_request(request, &mut session, shared) {
                        (reply, true) => {
                            emit(&reply, session.protocol, &mut output, &mut outcome);
                            outcome.quit = true;
                            break 'connection;
                        }
                        (reply, false) => emit(&reply, session.protocol, &mut output, &mut outcome),
                    }
                }
                Ok(None) => {
                    assert!(
                        input.len() < case.max_request,
                        "{} bytes buffered for an incomplete request, max_request is {}",
                        input.len(),
                        case.max_request
                    );
                    break;
                }
                Err(err) => {
                    assert!(
                        err.to_string().starts_with("Protocol error: "),
                        "decode error {err:?} is not a protocol error"
                    );
                    check_refusal(&err, &input);
                    assert_eq!(
                        Some(&err),
                        whole_err.as_ref(),
                        "the error differs from decoding the stream whole"
                    );
                    assert_eq!(outcome.requests, whole.len(), "requests before the error");
                    let reply = Reply::Error(format!("ERR {err}"));
                    emit(&reply, session.protocol, &mut output, &mut outcome);
                    outcome.protocol_error = true;
                    break 'connection;
                }
            }
        }
    }
    // The server folds latency samples into buckets every few seconds;
    // without it they pile up over millions of cases.
    static CASES: AtomicUsize = AtomicUsize::new(0);
    if CASES.fetch_add(1, Ordering::Relaxed).is_multiple_of(64) {
        shared.metrics.run_upkeep();
    }
    if !outcome.quit && !outcome.protocol_error {
        assert!(
            whole_err.is_none() && outcome.requests == whole.len(),
            "split reads ended with {} requests and no error; whole: {} requests, error {whole_err:?}",
            outcome.requests,
            whole.len()
        );
    }
    outcome
}

/// A request's shape, against the bytes consumed to frame it.
fn check_request(request: &Request, consumed: &[u8], max_request: usize) {
    assert!(!request.args.is_empty(), "a request without a name");
    assert!(
        request.args.len() <= stockgate::frame::max_args(max_request),
        "{} arguments",
        request.args.len()
    );
    let shown = || String::from_utf8_lossy(consumed).into_owned();
    // Blank lines and empty arrays (`*0`, `*-1`) are skipped before it.
    let mut at = 0;
    let frame = loop {
        let rest = &consumed[at..];
        let line = find(rest, b"\n").unwrap_or_else(|| panic!("no line in {:?}", shown()));
        if rest[0] == b'*' {
            let count = std::str::from_utf8(&rest[1..line.saturating_sub(1)])
                .ok()
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("bad multibulk header in {:?}", shown()));
            if count > 0 {
                break rest;
            }
        } else if sdssplitargs(inline_line(rest)) != Some(Vec::new()) {
            break rest;
        }
        at += line + 1;
    };
    if frame[0] == b'*' {
        // A multibulk request: the arguments are its bulk strings, in
        // order, each `$len` giving its length, and nothing after them.
        let mut at = find(frame, b"\r\n").expect("header") + 2;
        for arg in &request.args {
            assert_eq!(frame[at], b'$', "bulk header expected in {:?}", shown());
            let header = at + find(&frame[at..], b"\r\n").expect("bulk header");
            // Spelled as Rust reads an i64: `$01` and `$-0` are taken
            // (Redis refuses them; harmless, the length is still exact).
            let len = std::str::from_utf8(&frame[at + 1..header])
                .ok()
                .and_then(|n| n.parse::<i64>().ok());
            assert_eq!(len, Some(arg.len() as i64), "bulk length in {:?}", shown());
            at = header + 2;
            assert_eq!(&frame[at..at + arg.len()], &arg[..], "argument bytes");
            at += arg.len();
            assert_eq!(&frame[at..at + 2], b"\r\n", "argument not followed by CRLF");
            at += 2;
        }
        assert_eq!(
            at,
            frame.len(),
            "bytes consumed past the request in {:?}",
            shown()
        );
    } else {
        // An inline request: the arguments are its line, split by Redis's
        // rules (quotes, escapes), as the reference port reads them.
        assert_eq!(
            frame.last(),
            Some(&b'\n'),
            "unterminated line {:?}",
            shown()
        );
        let args: Vec<&[u8]> = request.args.iter().map(|a| &a[..]).collect();
        let reference = sdssplitargs(inline_line(frame));
        let reference: Option<Vec<&[u8]>> = reference
            .as_ref()
            .map(|words| words.iter().map(Vec::as_slice).collect());
        assert_eq!(Some(args), reference, "inline request from {:?}", shown());
    }
}

/// The text of the inline line at the start of `bytes`: up to its LF,
/// without the CR before it.
fn inline_line(bytes: &[u8]) -> &[u8] {
    let end = find(bytes, b"\n").unwrap_or(bytes.len());
    let line = &bytes[..end];
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A refusal is Redis's: an inline line refused for its quotes is one
/// Redis's `sdssplitargs` refuses too.
fn check_refusal(err: &ProtocolError, input: &[u8]) {
    if err.0 == "unbalanced quotes in request" {
        assert_ne!(
            input.first(),
            Some(&b'*'),
            "quotes refused in a multibulk frame"
        );
        assert_eq!(
            sdssplitargs(inline_line(input)),
            None,
            "{:?} refused for its quotes",
            String::from_utf8_lossy(inline_line(input))
        );
    }
}

/// Redis's `sdssplitargs` (`src/sds.c`), ported statement for statement:
/// the reference for how an inline line splits into arguments, or `None`
/// for unbalanced quotes. `at(p)` reads `None` where C reads the string's
/// terminating NUL; a NUL byte inside the line is an ordinary byte here,
/// as it is for stockgate (see `frame::split_inline`: Redis never gets to
/// split such a line).
pub fn sdssplitargs(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let at = |p: usize| line.get(p).copied();
    let isspace = |c: Option<u8>| matches!(c, Some(b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'));
    let is_hex_digit = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_hexdigit());
    let hex_digit_to_int = |c: Option<u8>| (c.unwrap() as char).to_digit(16).unwrap() as u8;
    let mut p = 0;
    let mut vector = Vec::new();
    loop {
        // skip blanks
        while isspace(at(p)) {
            p += 1;
        }
        if at(p).is_none() {
            return Some(vector);
        }
        // get a token
        let (mut inq, mut insq, mut done) = (false, false, false);
        let mut current = Vec::new();
        while !done {
            if inq {
                if at(p) == Some(b'\\')
                    && at(p + 1) == Some(b'x')
                    && is_hex_digit(at(p + 2))
                    && is_hex_digit(at(p + 3))
                {
                    current.push(hex_digit_to_int(at(p + 2)) * 16 + hex_digit_to_int(at(p + 3)));
                    p += 3;
                } else if at(p) == Some(b'\\') && at(p + 1).is_some() {
                    p += 1;
                    current.push(match at(p).unwrap() {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        c => c,
                    });
                } else if at(p) == Some(b'"') {
                    // closing quote must be followed by a space or
                    // nothing at all.
                    if at(p + 1).is_some() && !isspace(at(p + 1)) {
                        return None;
                    }
                    done = true;
                } else if at(p).is_none() {
                    // unterminated quotes
                    return None;
                } else {
                    current.push(at(p).unwrap());
                }
            } else if insq {
                if at(p) == Some(b'\\') && at(p + 1) == Some(b'\'') {
                    p += 1;
                    current.push(b'\'');
                } else if at(p) == Some(b'\'') {
                    if at(p + 1).is_some() && !isspace(at(p + 1)) {
                        return None;
                    }
                    done = true;
                } else if at(p).is_none() {
                    return None;
                } else {
                    current.push(at(p).unwrap());
                }
            } else {
                match at(p) {
                    Some(b' ' | b'\n' | b'\r' | b'\t') | None => done = true,
                    Some(b'"') => inq = true,
                    Some(b'\'') => insq = true,
                    Some(c) => current.push(c),
                }
            }
            if at(p).is_some() {
                p += 1;
            }
        }
        vector.push(current);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Runs one request as the connection does: the reply, and whether the
/// connection closes after it.
fn run_request(request: Request, session: &mut Session, shared: &Shared) -> (Reply, bool) {
    check_params(&request.args[1..], shared.config.max_qty);
    match dispatch::execute(request, session, shared) {
        Action::Reply(reply) => (reply, false),
        Action::Close(reply) => (reply, true),
        Action::Stock(command, args) => {
            let reply = shared
                .service
                .serve(command, &args, Instant::now(), &Default::default())
                .now_or_never()
                .unwrap_or_else(|| {
                    panic!("{command:?} waited with no upstream; it must answer at once")
                });
            check_stock_reply(command, &args, &reply, shared);
            (reply, false)
        }
    }
}

/// Without an upstream, a stock command is refused for its arguments
/// (code 3, or an `ERR` for the admin commands) exactly when they break
/// the rules, and otherwise fails as not ready. Never a success.
fn check_stock_reply(command: StockCommand, args: &[Bytes], reply: &Reply, shared: &Shared) {
    let config = &shared.config;
    let invalid_reason = match command {
        command if let Some(single) = command.single() => {
            let limits = Limits {
                max_qty: config.max_qty,
                max_hold_ms: config.max_hold.as_millis() as u64,
            };
            OneRequest::parse(command, single, args, &limits).err()
        }
        // The order stockgate checks them in: the amount, the sku, the op_id.
        StockCommand::Set | StockCommand::Add if config.admin_commands => {
            let amount = if command == StockCommand::Set {
                StockLevel::parse(&args[1]).err()
            } else {
                Delta::parse(&args[1]).err()
            };
            amount
                .or_else(|| Sku::parse(args[0].clone()).err())
                .or_else(|| stockgate::params::OpId::parse(args[2].clone()).err())
        }
        _ => None,
    };
    match (command, reply) {
        (StockCommand::Set | StockCommand::Add, Reply::Stock(stock)) => {
            assert_eq!(stock.code, Code::Invalid, "{command:?} {args:?}: {stock:?}");
            let reason = stock.reason.as_deref().expect("code 3 says why");
            let invalid = invalid_reason.unwrap_or_else(|| {
                panic!("{command:?} {args:?} refused with valid arguments: {stock:?}")
            });
            assert_eq!(reason, invalid.0.as_bytes());
        }
        (StockCommand::Set | StockCommand::Add, Reply::Error(text)) => {
            assert!(
                invalid_reason.is_none(),
                "{command:?} {args:?} has bad arguments ({invalid_reason:?}) but got {text}"
            );
        }
        (
            StockCommand::Deduct
            | StockCommand::Revert
            | StockCommand::Hold
            | StockCommand::Confirm,
            Reply::Stock(stock),
        ) => {
            assert_eq!(stock.code, Code::Invalid, "{command:?} {args:?}: {stock:?}");
            let shows_expiry = matches!(command, StockCommand::Hold | StockCommand::Confirm);
            assert_eq!(
                stock.expires_at,
                shows_expiry.then_some(0),
                "{command:?}: the expiry is HOLD's and CONFIRM's"
            );
            assert_eq!(stock.remain, -1);
            assert!(stock.order_no.is_empty());
            let reason = stock.reason.as_deref().expect("code 3 says why");
            match invalid_reason {
                Some(invalid) => assert_eq!(reason, invalid.0.as_bytes()),
                // Valid arguments are refused only for a stale id.
                None => assert!(
                    config.reject_stale_ids
                        && reason.starts_with(b"request_id is a time-ordered id"),
                    "{command:?} {args:?} refused: {}",
                    String::from_utf8_lossy(reason)
                ),
            }
        }
        (
            StockCommand::Deduct
            | StockCommand::Revert
            | StockCommand::Hold
            | StockCommand::Confirm,
            Reply::Error(text),
        ) => {
            assert!(
                invalid_reason.is_none(),
                "{command:?} {args:?} has bad arguments ({invalid_reason:?}) but got {text}"
            );
        }
        (
            StockCommand::Deduct
            | StockCommand::Revert
            | StockCommand::Hold
            | StockCommand::Confirm,
            other,
        ) => {
            panic!("{command:?} answered {other:?} without an upstream")
        }
        (_, Reply::Error(_)) => {}
        (_, other) => panic!("{command:?} answered {other:?} without an upstream"),
    }
}

/// Encodes one reply as the connection does, and checks it decodes back.
fn emit(reply: &Reply, protocol: Protocol, output: &mut BytesMut, outcome: &mut Outcome) {
    let start = output.len();
    reply.encode(protocol, output);
    check_encoded(reply, protocol, &output[start..]);
    check_parsed_independently(reply, protocol, &output[start..]);
    outcome.replies += 1;
    // A real connection writes these out; keep the buffer from growing
    // across a long case.
    if output.len() > 1 << 20 {
        output.clear();
    }
}

/// `wire` is one reply: it decodes, with the decoder of `protocol`, to a
/// frame of exactly its length, and that frame is the reply's meaning
/// (errors on one line). RESP3 maps are compared as maps: redis-protocol's
/// decoder does not keep their order.
pub fn check_encoded(reply: &Reply, protocol: Protocol, wire: &[u8]) {
    let shown = || String::from_utf8_lossy(wire).into_owned();
    match protocol {
        Protocol::Resp2 => {
            let (frame, len) = redis_protocol::resp2::decode::decode(wire)
                .unwrap_or_else(|e| panic!("{reply:?} encoded to invalid RESP2 {:?}: {e}", shown()))
                .unwrap_or_else(|| {
                    panic!("{reply:?} encoded to an incomplete frame {:?}", shown())
                });
            assert_eq!(
                len,
                wire.len(),
                "{reply:?} encoded to more than one frame: {:?}",
                shown()
            );
            assert_eq!(
                frame,
                resp2_frame(reply),
                "{reply:?} encoded as {:?}",
                shown()
            );
        }
        Protocol::Resp3 => {
            let (frame, len) = redis_protocol::resp3::decode::complete::decode(wire)
                .unwrap_or_else(|e| panic!("{reply:?} encoded to invalid RESP3 {:?}: {e}", shown()))
                .unwrap_or_else(|| {
                    panic!("{reply:?} encoded to an incomplete frame {:?}", shown())
                });
            assert_eq!(
                len,
                wire.len(),
                "{reply:?} encoded to more than one frame: {:?}",
                shown()
            );
            assert_eq!(
                frame,
                resp3_frame(reply),
                "{reply:?} encoded as {:?}",
                shown()
            );
        }
    }
}

/// The same reply, parsed by a second, independent parser (the redis
/// crate's): one value that takes exactly the reply's bytes, and has the
/// reply's shape.
pub fn check_parsed_independently(reply: &Reply, protocol: Protocol, wire: &[u8]) {
    use tokio_util::codec::Decoder as _;
    let shown = || String::from_utf8_lossy(wire).into_owned();
    let mut buf = BytesMut::from(wire);
    let value = redis::ValueCodec::default()
        .decode(&mut buf)
        .unwrap_or_else(|e| {
            panic!(
                "{reply:?} does not parse with the redis crate ({e}): {:?}",
                shown()
            )
        })
        .unwrap_or_else(|| panic!("{reply:?} is incomplete for the redis crate: {:?}", shown()));
    assert!(
        buf.is_empty(),
        "{reply:?} left {} bytes over for the redis crate: {:?}",
        buf.len(),
        shown()
    );
    assert_same_shape(reply, protocol, &value);
}

fn assert_same_shape(reply: &Reply, protocol: Protocol, value: &redis::Value) {
    use redis::Value as V;
    match (reply, value) {
        (Reply::Simple("OK"), V::Okay) => {}
        (Reply::Simple(s), V::SimpleString(v)) => assert_eq!(s, v),
        (Reply::Status(s), V::Okay) => assert_eq!(s, "OK"),
        (Reply::Status(s), V::SimpleString(v)) => assert_eq!(&one_line(s), v),
        (Reply::Verbatim(b), V::BulkString(v)) if protocol == Protocol::Resp2 => {
            assert_eq!(&b[..], &v[..])
        }
        (Reply::Verbatim(b), V::VerbatimString { format, text }) if protocol == Protocol::Resp3 => {
            assert_eq!(*format, redis::VerbatimFormat::Text);
            assert_eq!(String::from_utf8_lossy(b), *text);
        }
        (Reply::Error(_), V::ServerError(_)) => {}
        (Reply::Integer(n), V::Int(v)) => assert_eq!(n, v, "{reply:?}"),
        (Reply::Bulk(b), V::BulkString(v)) => assert_eq!(&b[..], &v[..]),
        (Reply::Null, V::Nil) => {}
        (Reply::Array(items), V::Array(values)) => {
            assert_eq!(items.len(), values.len(), "{reply:?}");
            for (item, value) in items.iter().zip(values) {
                assert_same_shape(item, protocol, value);
            }
        }
        (Reply::Map(pairs), V::Map(values)) if protocol == Protocol::Resp3 => {
            assert_eq!(pairs.len(), values.len(), "{reply:?}");
            for ((k, v), (pk, pv)) in pairs.iter().zip(values) {
                assert_same_shape(k, protocol, pk);
                assert_same_shape(v, protocol, pv);
            }
        }
        (Reply::Map(pairs), V::Array(values)) if protocol == Protocol::Resp2 => {
            assert_eq!(pairs.len() * 2, values.len(), "{reply:?}");
        }
        (Reply::Stock(stock), V::Array(values)) => {
            let items = stock_items(stock);
            assert_eq!(items.len(), values.len(), "{reply:?}");
            for (item, value) in items.iter().zip(values) {
                assert_same_shape(item, protocol, value);
            }
        }
        _ => panic!("{reply:?} parsed by the redis crate as {value:?}"),
    }
}

/// Builds replies out of `program` and checks that what stockgate writes
/// for each, in both protocols, parses exactly (with redis-protocol's
/// decoder and the redis crate's). The request path alone never reaches
/// most integers (without Redis, a remain is always -1); this does, so the
/// fuzzer searches the encoder over every value a reply can hold.
///
/// The program is read a byte at a time: `b % 8` picks an integer (the next
/// 8 bytes, little-endian), a bulk (a length byte, then bytes; verbatim text
/// when the byte's top bit is set), a null, a simple string (of run-time
/// text, a length byte and bytes, when the top bit is set), an error (a
/// length byte, then text), a stock reply (code,
/// remain, order_no, version, reason), an array or a map (a count byte, then
/// that many replies, or values under distinct bulk keys, at most 4 levels
/// deep).
pub fn check_reply_program(program: &[u8]) {
    let mut at = 0;
    while at < program.len() {
        let reply = build_reply(program, &mut at, 0);
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let mut wire = BytesMut::new();
            reply.encode(protocol, &mut wire);
            check_encoded(&reply, protocol, &wire);
            check_parsed_independently(&reply, protocol, &wire);
        }
    }
}

fn take<'a>(program: &'a [u8], at: &mut usize, len: usize) -> &'a [u8] {
    let start = (*at).min(program.len());
    let end = start.saturating_add(len).min(program.len());
    *at = end;
    &program[start..end]
}

fn take_i64(program: &[u8], at: &mut usize) -> i64 {
    let mut raw = [0u8; 8];
    let got = take(program, at, 8);
    raw[..got.len()].copy_from_slice(got);
    i64::from_le_bytes(raw)
}

fn take_byte(program: &[u8], at: &mut usize) -> u8 {
    take(program, at, 1).first().copied().unwrap_or(0)
}

fn build_reply(program: &[u8], at: &mut usize, depth: usize) -> Reply {
    let op = take_byte(program, at);
    match op % 8 {
        0 => Reply::Integer(take_i64(program, at)),
        1 => {
            let len = usize::from(take_byte(program, at));
            let data = Bytes::copy_from_slice(take(program, at, len));
            if op & 0x80 != 0 {
                Reply::Verbatim(data)
            } else {
                Reply::Bulk(data)
            }
        }
        2 => Reply::Null,
        3 if op & 0x80 != 0 => {
            let len = usize::from(take_byte(program, at) % 64);
            Reply::Status(String::from_utf8_lossy(take(program, at, len)).into_owned())
        }
        3 => Reply::Simple(["OK", "PONG", "optional"][usize::from(op / 8) % 3]),
        4 => {
            let len = usize::from(take_byte(program, at) % 64);
            let text = String::from_utf8_lossy(take(program, at, len)).into_owned();
            Reply::Error(format!("ERR {text}"))
        }
        5 => {
            let code = Code::ALL[usize::from(take_byte(program, at)) % Code::ALL.len()];
            let remain = take_i64(program, at);
            let len = usize::from(take_byte(program, at) % 130);
            let order_no = Bytes::copy_from_slice(take(program, at, len));
            let version = take_i64(program, at);
            let reason = (op & 0x80 != 0).then(|| {
                let len = usize::from(take_byte(program, at));
                Bytes::copy_from_slice(take(program, at, len))
            });
            let expires_at = (op & 0x40 != 0).then(|| take_i64(program, at));
            Reply::Stock(stockgate::outcome::StockReply {
                code,
                remain,
                order_no,
                version,
                expires_at,
                reason,
                allocation: None,
                effects: Default::default(),
            })
        }
        kind => {
            let count = if depth >= 4 {
                0
            } else {
                usize::from(take_byte(program, at) % 8)
            };
            let mut next = || build_reply(program, at, depth + 1);
            if kind == 6 {
                Reply::Array((0..count).map(|_| next()).collect())
            } else {
                // Keys as stockgate writes them: distinct bulk strings
                // (redis-protocol's RESP3 decoder keeps maps in a hash map).
                Reply::Map(
                    (0..count)
                        .map(|i| (Reply::bulk(format!("key-{i}")), next()))
                        .collect(),
                )
            }
        }
    }
}

/// What an error reply says on the wire: one line.
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// `[code, remain, order_no, version]`, and the reason when there is one.
fn stock_items(stock: &stockgate::outcome::StockReply) -> Vec<Reply> {
    let mut items = vec![
        Reply::Integer(stock.code as i64),
        Reply::Integer(stock.remain),
        Reply::Bulk(stock.order_no.clone()),
        Reply::Integer(stock.version),
    ];
    items.extend(stock.expires_at.map(Reply::Integer));
    items.extend(stock.reason.clone().map(Reply::Bulk));
    items
}

/// The RESP2 frame a reply means (maps are flat arrays).
pub fn resp2_frame(reply: &Reply) -> redis_protocol::resp2::types::OwnedFrame {
    use redis_protocol::resp2::types::OwnedFrame as F;
    match reply {
        Reply::Simple(s) => F::SimpleString(s.as_bytes().to_vec()),
        Reply::Status(s) => F::SimpleString(one_line(s).into_bytes()),
        Reply::Error(e) => F::Error(one_line(e)),
        Reply::Integer(i) => F::Integer(*i),
        Reply::Bulk(b) | Reply::Verbatim(b) => F::BulkString(b.to_vec()),
        Reply::Null => F::Null,
        Reply::Array(items) => F::Array(items.iter().map(resp2_frame).collect()),
        Reply::Map(pairs) => F::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [resp2_frame(k), resp2_frame(v)])
                .collect(),
        ),
        Reply::Stock(stock) => F::Array(stock_items(stock).iter().map(resp2_frame).collect()),
    }
}

/// The RESP3 frame a reply means.
pub fn resp3_frame(reply: &Reply) -> redis_protocol::resp3::types::OwnedFrame {
    use redis_protocol::resp3::types::OwnedFrame as F;
    match reply {
        Reply::Simple(s) => F::SimpleString {
            data: s.as_bytes().to_vec(),
            attributes: None,
        },
        Reply::Status(s) => F::SimpleString {
            data: one_line(s).into_bytes(),
            attributes: None,
        },
        Reply::Verbatim(b) => F::VerbatimString {
            data: b.to_vec(),
            format: redis_protocol::resp3::types::VerbatimStringFormat::Text,
            attributes: None,
        },
        Reply::Error(e) => F::SimpleError {
            data: one_line(e),
            attributes: None,
        },
        Reply::Integer(i) => F::Number {
            data: *i,
            attributes: None,
        },
        Reply::Bulk(b) => F::BlobString {
            data: b.to_vec(),
            attributes: None,
        },
        Reply::Null => F::Null,
        Reply::Array(items) => F::Array {
            data: items.iter().map(resp3_frame).collect(),
            attributes: None,
        },
        Reply::Map(pairs) => F::Map {
            data: pairs
                .iter()
                .map(|(k, v)| (resp3_frame(k), resp3_frame(v)))
                .collect(),
            attributes: None,
        },
        Reply::Stock(stock) => F::Array {
            data: stock_items(stock).iter().map(resp3_frame).collect(),
            attributes: None,
        },
    }
}

/// Every parameter parser over every argument: accepted exactly by its
/// rules, and what is accepted spells back to the bytes sent.
pub fn check_params(args: &[Bytes], max_qty: u64) {
    for arg in args {
        let token = (1..=MAX_FIELD_LEN).contains(&arg.len())
            && arg
                .iter()
                .all(|&b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        match Sku::parse(arg.clone()) {
            Ok(sku) => {
                assert!(token, "sku {arg:?} accepted");
                assert_eq!(sku.as_bytes(), &arg[..]);
            }
            Err(_) => assert!(!token, "sku {arg:?} refused"),
        }
        match RequestId::parse(arg.clone()) {
            Ok(id) => {
                assert!(token, "request_id {arg:?} accepted");
                assert_eq!(id.as_bytes(), &arg[..]);
                let _ = id.embedded_time();
            }
            Err(_) => assert!(!token, "request_id {arg:?} refused"),
        }
        let printable =
            arg.len() <= MAX_FIELD_LEN && arg.iter().all(|&b| (b' '..=b'~').contains(&b));
        match OrderNo::parse(arg.clone()) {
            Ok(order_no) => {
                assert!(printable, "order_no {arg:?} accepted");
                assert_eq!(order_no.as_bytes(), &arg[..]);
            }
            Err(_) => assert!(!printable, "order_no {arg:?} refused"),
        }
        // What the standard library reads, spelled canonically.
        let canonical = std::str::from_utf8(arg)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|v| v.to_string().as_bytes() == &arg[..]);
        let qty_ok = canonical.filter(|&v| v >= 1 && (v as u64) <= max_qty);
        match Qty::parse(arg.clone(), max_qty) {
            Ok(qty) => {
                assert_eq!(Some(qty.get() as i64), qty_ok, "qty {arg:?} accepted");
                assert_eq!(qty.as_bytes(), &arg[..]);
            }
            Err(_) => assert_eq!(qty_ok, None, "qty {arg:?} refused"),
        }
        let level_ok = canonical.filter(|v| (0..=MAX_STOCK).contains(v));
        match StockLevel::parse(arg) {
            Ok(level) => assert_eq!(Some(level.0), level_ok, "stock {arg:?} accepted"),
            Err(_) => assert_eq!(level_ok, None, "stock {arg:?} refused"),
        }
        let delta_ok = canonical.filter(|v| (-MAX_STOCK..=MAX_STOCK).contains(v));
        match Delta::parse(arg) {
            Ok(delta) => assert_eq!(Some(delta.0), delta_ok, "delta {arg:?} accepted"),
            Err(_) => assert_eq!(delta_ok, None, "delta {arg:?} refused"),
        }
    }
}

/// The fuzz target's input: four control bytes, then the stream.
///
/// - byte 0: bit 0 picks the locked-down server; bits 1-2 how reads are
///   split (0 one read, 1 one byte at a time, 2 reads of 1-16 bytes,
///   3 reads of 1-512 bytes);
/// - byte 1: `max_request` is 512 + 8 × byte 1 (512 to 2552; 512 is the
///   smallest `--max-request-bytes`);
/// - bytes 2-3: the seed of the read lengths.
pub fn case_from_bytes(data: &[u8]) -> Option<Case<'_>> {
    let (&[flags, size, s0, s1], stream) = data.split_first_chunk::<4>()?;
    let mut state = u32::from(u16::from_le_bytes([s0, s1])) | 0x1_0000;
    let mut next = move || {
        // xorshift32: cheap, and the same reads for the same input.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state as usize
    };
    let reads = match (flags >> 1) & 3 {
        0 => Vec::new(),
        1 => vec![1; stream.len()],
        mode => {
            let most = if mode == 2 { 16 } else { 512 };
            let mut reads = Vec::new();
            let mut total = 0;
            while total < stream.len() {
                let len = 1 + next() % most;
                reads.push(len);
                total += len;
            }
            reads
        }
    };
    Some(Case {
        stream,
        max_request: 512 + 8 * usize::from(size),
        reads,
        locked: flags & 1 == 1,
    })
}

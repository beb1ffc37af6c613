//! The fuzz target's invariants, as a short proptest pass in the normal
//! suite: random byte streams, and random valid requests, split into reads
//! at random points, through the decoder, `dispatch::execute`, the stock
//! service's argument parsing, and reply encoding in both protocols.
//!
//! The checks themselves are in `tests/fuzz/harness.rs`, shared with the
//! coverage-guided target (`tests/fuzz/README.md` says how to run that).
//! No Redis is needed: the upstream is never connected, so every stock
//! command is answered at once.

#[path = "fuzz/harness.rs"]
mod harness;

use bytes::Bytes;
use proptest::prelude::*;
use stockgate::outcome::{Code, StockReply};
use stockgate::reply::{Protocol, Reply};

/// Command names, the real ones most of the time.
fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "DEDUCT", "deduct", "REVERT", "revert", "HOLD", "hold", "CONFIRM", "HELLO", "AUTH",
            "PING", "ECHO", "SELECT", "QUIT", "INFO", "CLIENT", "COMMAND", "STOCK.GET",
            "STOCK.SET", "STOCK.ADD", "stock.status",
        ])
        .prop_map(|n| n.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ]
}

/// Arguments that mean something to some command, and some that don't.
fn arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "sku-1", "req-1", "1", "2", "0", "01", "-1", "-0", "1000", "1001", "3", "2", "999",
            "86400000", "86400001",
            "9007199254740991", "9007199254740992", "-9007199254740991", "default",
            "fuzz-secret", "AUTH", "SETNAME", "SETINFO", "LIB-NAME", "LIB-VER", "GETNAME",
            "ID", "COUNT", "DOCS", "INFO", "LIST", "all", "server", "stats",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV", "017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
            "7ZZZZZZZZZZZZZZZZZZZZZZZZZ", "s{k}u", "ORD 1", "",
        ])
        .prop_map(|a| a.as_bytes().to_vec()),
        2 => "[!-~]{1,20}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..40),
        1 => (1usize..200).prop_map(|n| vec![b'x'; n]),
    ]
}

fn command() -> impl Strategy<Value = Vec<Vec<u8>>> {
    (name(), prop::collection::vec(arg(), 0..6)).prop_map(|(name, mut args)| {
        args.insert(0, name);
        args
    })
}

fn multibulk(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A piece of a hostile stream: requests, RESP fragments, garbage.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => command().prop_map(|args| multibulk(&args)),
        2 => command().prop_map(|args| {
            let mut line = args.join(&b' ');
            line.extend_from_slice(b"\r\n");
            line
        }),
        3 => prop::sample::select(vec![
            "*", "$", "\r\n", "\n", "\r", " ", "*1\r\n", "*2\r\n", "*0\r\n", "*-1\r\n",
            "$0\r\n", "$1\r\n", "$-1\r\n", "$-10\r\n", "*3000000000\r\n", "$2000000000\r\n",
            "$blabla\r\n", "*1\r\nfoo\r\n", "*1\r\n*1\r\n", ":1\r\n", "+OK\r\n", "*+1\r\n",
            "*1x\r\n", "0", "9", "-", "\0", "*00000000000000000000000000000001\r\n",
            // Headers whose CR is the 32nd byte: the LF can't fit.
            "*111111111111111111111111111111\r\n", "$111111111111111111111111111111\r\n",
        ])
        .prop_map(|p| p.as_bytes().to_vec()),
        2 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (1usize..3000, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
    ]
}

/// Read lengths: one read, byte by byte, or random.
fn reads(len: usize) -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        Just(Vec::new()),
        Just(vec![1; len]),
        prop::collection::vec(1usize..32, 0..len.max(1)),
        prop::collection::vec(1usize..600, 0..16),
    ]
}

fn hostile_case() -> impl Strategy<Value = (Vec<u8>, Vec<usize>, usize, bool)> {
    prop::collection::vec(piece(), 0..12)
        .prop_map(|pieces| pieces.concat())
        .prop_flat_map(|stream| {
            let len = stream.len();
            (Just(stream), reads(len), 512usize..2600, any::<bool>())
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Replies built from random bytes (every integer a reply can hold)
    /// parse back exactly with both decoders.
    #[test]
    fn replies_built_from_any_bytes_parse_back_exactly(program in prop::collection::vec(any::<u8>(), 0..512)) {
        harness::check_reply_program(&program);
    }

    /// Hostile streams: every invariant of the harness holds.
    #[test]
    fn hostile_streams_keep_every_invariant((stream, reads, max_request, locked) in hostile_case()) {
        harness::check(&harness::Case { stream: &stream, max_request, reads, locked });
    }
}

/// A request of two or three bulks whose first two end near
/// `max_request` (at it, or a few bytes either side), then some of a third.
fn near_the_limit() -> impl Strategy<Value = (Vec<u8>, usize)> {
    (
        512usize..2600,
        0usize..12,
        prop::sample::select(vec!["", "$", "$1", "$1\r", "$1\r\n", "$1\r\na\r\n"]),
        any::<bool>(),
    )
        .prop_map(|(max_request, short, tail, three)| {
            let head = if three { "*3\r\n" } else { "*2\r\n" };
            // Header, `$4 ECHO`, and the second bulk's `$NNNN` + CRLFs.
            let fixed = head.len() + 10 + 6 + 2 + 2;
            let len = max_request.saturating_sub(fixed + short) + 4;
            let mut frame = format!("{head}$4\r\nECHO\r\n${len}\r\n").into_bytes();
            frame.extend(std::iter::repeat_n(b'z', len));
            frame.extend_from_slice(b"\r\n");
            frame.extend_from_slice(tail.as_bytes());
            (frame, max_request)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Frames that end at the request limit, or can only end past it, read
    /// whole or byte by byte: never more than the limit is buffered.
    #[test]
    fn frames_at_the_limit_are_bounded(
        (stream, max_request) in near_the_limit(),
        byte_by_byte in any::<bool>(),
    ) {
        let reads = if byte_by_byte { vec![1; stream.len()] } else { Vec::new() };
        harness::check(&harness::Case { stream: &stream, max_request, reads, locked: false });
    }
}

/// A valid request whose name is never QUIT (which stops the connection);
/// sent inline, any bytes are arguments, quoted where they need it.
fn valid_request() -> impl Strategy<Value = (Vec<Vec<u8>>, bool)> {
    let inline_arg = prop_oneof![
        2 => "[!-~]{1,24}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..24),
    ];
    prop_oneof![
        (command(), Just(false)),
        (prop::collection::vec(inline_arg, 1..6), Just(true)),
    ]
    .prop_filter("QUIT closes the connection", |(args, _)| {
        !args[0].eq_ignore_ascii_case(b"quit")
    })
}

/// An argument as an inline line spells it, as redis-cli's `sdscatrepr`
/// does: as it is when that reads back the same, otherwise in double
/// quotes with escapes. (Never starting with `*`, which would make the
/// line a multibulk frame.)
fn inline_spelling(arg: &[u8]) -> Vec<u8> {
    let plain = arg.first().is_some_and(|&b| b != b'*')
        && arg
            .iter()
            .all(|&b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\'));
    if plain {
        return arg.to_vec();
    }
    let mut out = vec![b'"'];
    for &b in arg {
        match b {
            b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            b' '..=b'~' => out.push(b),
            _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
    out.push(b'"');
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Valid requests, multibulk or inline (quoted where an argument needs
    /// it), pipelined and split anywhere: each decodes to exactly its
    /// arguments, and each gets one reply.
    #[test]
    fn valid_requests_split_anywhere_decode_exactly(
        requests in prop::collection::vec(valid_request(), 1..16),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
        locked in any::<bool>(),
    ) {
        let mut stream = Vec::new();
        for (args, inline) in &requests {
            if *inline {
                let words: Vec<Vec<u8>> = args.iter().map(|a| inline_spelling(a)).collect();
                stream.extend_from_slice(&words.join(&b' '));
                stream.extend_from_slice(b"\r\n");
            } else {
                stream.extend_from_slice(&multibulk(args));
            }
        }
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.sort_unstable();
        points.dedup();
        let mut reads = Vec::new();
        let mut last = 0;
        for point in points {
            if point > last {
                reads.push(point - last);
                last = point;
            }
        }
        let outcome = harness::check(&harness::Case {
            stream: &stream,
            max_request: 64 * 1024,
            reads,
            locked,
        });
        prop_assert!(!outcome.protocol_error);
        let sent: Vec<Vec<Bytes>> = requests
            .iter()
            .map(|(args, _)| args.iter().map(|a| Bytes::copy_from_slice(a)).collect())
            .collect();
        prop_assert_eq!(outcome.decoded, sent);
        prop_assert_eq!(outcome.replies, requests.len());
    }
}

/// Any reply stockgate could build, nested a few levels.
fn reply() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        prop::sample::select(vec!["OK", "PONG", "QUEUED", "", "optional"]).prop_map(Reply::Simple),
        any::<String>().prop_map(Reply::Error),
        "(ERR|NOAUTH|WRONGPASS)[ -~\r\n]{0,40}".prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Integer),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| Reply::Bulk(b.into())),
        Just(Reply::Null),
        (
            prop::sample::select(Code::ALL.to_vec()),
            any::<i64>(),
            prop::collection::vec(any::<u8>(), 0..40),
            any::<i64>(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
            prop::option::of(any::<i64>()),
        )
            .prop_map(|(code, remain, order_no, version, reason, expires_at)| {
                Reply::Stock(StockReply {
                    code,
                    remain,
                    order_no: order_no.into(),
                    version,
                    expires_at,
                    reason: reason.map(Bytes::from),
                    allocation: None,
                    effects: Default::default(),
                })
            }),
    ];
    leaf.prop_recursive(3, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Reply::Array),
            // Keys are distinct: a RESP3 map has no duplicate keys.
            prop::collection::vec(inner, 0..6).prop_map(|values| {
                Reply::Map(
                    values
                        .into_iter()
                        .enumerate()
                        .map(|(i, v)| (Reply::bulk(format!("key-{i}")), v))
                        .collect(),
                )
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// Every reply encodes, in both protocols, to one frame that
    /// redis-protocol decodes back to what it means.
    #[test]
    fn replies_encode_to_valid_resp(reply in reply()) {
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let mut wire = bytes::BytesMut::new();
            reply.encode(protocol, &mut wire);
            harness::check_encoded(&reply, protocol, &wire);
        }
    }

    /// The parameter parsers, on anything.
    #[test]
    fn parameter_parsers_follow_their_rules(
        args in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..140),
                "-?[0-9]{1,20}".prop_map(String::into_bytes),
                "[!-~]{120,130}".prop_map(String::into_bytes),
            ],
            1..8,
        ),
        max_qty in 1u64..=1_000_000_000_000_000,
    ) {
        let args: Vec<Bytes> = args.into_iter().map(Bytes::from).collect();
        harness::check_params(&args, max_qty);
    }
}

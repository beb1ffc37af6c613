//! Every byte stockgate writes parses, exactly: each kind of reply, in RESP2
//! and RESP3, is parsed back by an independent parser (the redis crate's
//! `ValueCodec`, not redis-protocol, whose encoder once miscounted digits),
//! to the value it means, with no byte left over.
//!
//! Integers cover the whole i64 range, weighted towards where digit counts
//! go wrong: 10^k − d, 10^k, ±2^53 and the i64 limits. The connection-level
//! replies (HELLO maps, INFO, COMMAND DOCS, errors) come from the command
//! table itself, run against a server state that is never connected.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use redis::Value;
use std::sync::OnceLock;
use stockgate::command::Session;
use stockgate::config::Config;
use stockgate::dispatch::{self, Action};
use stockgate::frame::Request;
use stockgate::outcome::{Code, StockReply};
use stockgate::reply::{Protocol, Reply};
use stockgate::state::Shared;
use tokio_util::codec::Decoder;

/// Integers, mostly the ones whose decimal length is easy to get wrong.
fn integer() -> impl Strategy<Value = i64> {
    let near_powers = (1u32..=18, 0i64..=3, any::<bool>()).prop_map(|(k, d, negative)| {
        let n = 10i64.pow(k) - d;
        if negative { -n } else { n }
    });
    let limits = prop::sample::select(vec![
        i64::MIN,
        i64::MIN + 1,
        i64::MAX,
        i64::MAX - 1,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        -(1 << 53) + 1,
        -(1 << 53),
        -(1 << 53) - 1,
        0,
        -1,
    ]);
    prop_oneof![4 => near_powers, 2 => limits, 3 => any::<i64>()]
}

fn bytes() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => "[ -~]{0,40}".prop_map(Bytes::from),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from),
    ]
}

fn stock_reply() -> impl Strategy<Value = StockReply> {
    (
        prop::sample::select(Code::ALL.to_vec()),
        integer(),
        bytes(),
        integer(),
        prop::option::of(bytes()),
        prop::option::of(integer()),
        // An allocation's reply (DEDUCT.AT, HOLD.AT): what each location
        // gave, some of the time.
        prop::option::of(prop::collection::vec((bytes(), integer()), 0..5)),
    )
        .prop_map(
            |(code, remain, order_no, version, reason, expires_at, allocation)| StockReply {
                code,
                remain,
                order_no,
                version,
                expires_at,
                reason,
                allocation: allocation.map(Box::new),
                effects: Default::default(),
            },
        )
}

/// Any reply tree stockgate's types can express.
fn reply() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        prop::sample::select(vec!["OK", "PONG", "QUEUED", "optional"]).prop_map(Reply::Simple),
        "[ -~]{0,40}".prop_map(Reply::Status),
        // Error texts start with a code word; CR and LF in them must still
        // make one line.
        ("[A-Z]{1,12}", "[ -~\r\n]{0,60}")
            .prop_map(|(code, rest)| Reply::Error(format!("{code} {rest}"))),
        integer().prop_map(Reply::Integer),
        bytes().prop_map(Reply::Bulk),
        "[ -~\n]{0,60}".prop_map(|text| Reply::Verbatim(text.into())),
        Just(Reply::Null),
        stock_reply().prop_map(Reply::Stock),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Reply::Array),
            prop::collection::vec((inner.clone(), inner), 0..6).prop_map(Reply::Map),
        ]
    })
}

/// What `reply` means once parsed, in `protocol`.
fn meaning(reply: &Reply, protocol: Protocol) -> Value {
    match reply {
        Reply::Simple("OK") => Value::Okay,
        Reply::Simple(text) => Value::SimpleString((*text).to_owned()),
        Reply::Status(text) if text == "OK" => Value::Okay,
        Reply::Status(text) => Value::SimpleString(text.clone()),
        Reply::Verbatim(text) => match protocol {
            Protocol::Resp2 => Value::BulkString(text.to_vec()),
            Protocol::Resp3 => Value::VerbatimString {
                format: redis::VerbatimFormat::Text,
                text: String::from_utf8(text.to_vec()).expect("verbatim text"),
            },
        },
        Reply::Error(_) => unreachable!("errors are compared by their text"),
        Reply::Integer(n) => Value::Int(*n),
        Reply::Bulk(data) => Value::BulkString(data.to_vec()),
        Reply::Null => Value::Nil,
        Reply::Array(items) => Value::Array(items.iter().map(|i| meaning(i, protocol)).collect()),
        Reply::Map(pairs) => match protocol {
            Protocol::Resp2 => Value::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [meaning(k, protocol), meaning(v, protocol)])
                    .collect(),
            ),
            Protocol::Resp3 => Value::Map(
                pairs
                    .iter()
                    .map(|(k, v)| (meaning(k, protocol), meaning(v, protocol)))
                    .collect(),
            ),
        },
        Reply::Stock(stock) => {
            let mut items = vec![
                Value::Int(stock.code as i64),
                Value::Int(stock.remain),
                Value::BulkString(stock.order_no.to_vec()),
                Value::Int(stock.version),
            ];
            if let Some(allocation) = &stock.allocation {
                // Seven elements always: the reason (empty when none) and
                // the expiry (0 when none) before the allocation.
                items.push(Value::BulkString(
                    stock.reason.as_ref().map_or(Vec::new(), |r| r.to_vec()),
                ));
                items.push(Value::Int(stock.expires_at.unwrap_or(0)));
                items.push(Value::Array(
                    allocation
                        .iter()
                        .flat_map(|(location, units)| {
                            [Value::BulkString(location.to_vec()), Value::Int(*units)]
                        })
                        .collect(),
                ));
                return Value::Array(items);
            }
            items.extend(stock.expires_at.map(Value::Int));
            items.extend(stock.reason.as_ref().map(|r| Value::BulkString(r.to_vec())));
            Value::Array(items)
        }
    }
}

/// Checks a parsed value against its reply, errors by their one-line text.
fn assert_means(parsed: &Value, reply: &Reply, protocol: Protocol) {
    match (reply, parsed) {
        (Reply::Error(text), Value::ServerError(err)) => {
            let mut wire = err.code().to_owned();
            if let Some(detail) = err.details() {
                wire.push(' ');
                wire.push_str(detail);
            }
            assert_eq!(wire, text.replace(['\r', '\n'], " "), "{reply:?}");
        }
        (Reply::Error(_), other) => panic!("{reply:?} parsed as {other:?}"),
        (Reply::Array(items), Value::Array(values)) => {
            assert_eq!(items.len(), values.len(), "{reply:?}");
            for (item, value) in items.iter().zip(values) {
                assert_means(value, item, protocol);
            }
        }
        (Reply::Map(pairs), Value::Map(values)) if protocol == Protocol::Resp3 => {
            assert_eq!(pairs.len(), values.len(), "{reply:?}");
            for ((k, v), (pk, pv)) in pairs.iter().zip(values) {
                assert_means(pk, k, protocol);
                assert_means(pv, v, protocol);
            }
        }
        (Reply::Map(pairs), Value::Array(values)) if protocol == Protocol::Resp2 => {
            assert_eq!(pairs.len() * 2, values.len(), "{reply:?}");
            for ((k, v), pair) in pairs.iter().zip(values.chunks(2)) {
                assert_means(&pair[0], k, protocol);
                assert_means(&pair[1], v, protocol);
            }
        }
        _ => assert_eq!(parsed, &meaning(reply, protocol), "{reply:?}"),
    }
}

/// Encodes `replies` back to back, as a connection does, and parses them
/// one by one: each to its meaning, and nothing left at the end.
fn round_trip(replies: &[Reply], protocol: Protocol) {
    let mut wire = BytesMut::new();
    for reply in replies {
        reply.encode(protocol, &mut wire);
    }
    let shown = String::from_utf8_lossy(&wire).into_owned();
    let mut codec = redis::ValueCodec::default();
    for reply in replies {
        let parsed = codec
            .decode(&mut wire)
            .unwrap_or_else(|e| panic!("{reply:?} does not parse ({e}): {shown:?}"))
            .unwrap_or_else(|| panic!("{reply:?} is incomplete: {shown:?}"));
        assert_means(&parsed, reply, protocol);
    }
    assert!(
        wire.is_empty(),
        "{} bytes left over after {} replies: {:?}",
        wire.len(),
        replies.len(),
        String::from_utf8_lossy(&wire)
    );
}

/// A server's state, never connected: what the command table answers with.
fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let config = Config::for_upstream(vec!["redis://127.0.0.1:1".into()]);
        Shared::new(config, 6390)
    })
}

/// The reply the command table gives `args` on a fresh connection that
/// has already sent `before`.
fn table_reply(before: &[&[&str]], args: &[&str]) -> (Reply, Protocol) {
    let mut session = Session::new(1, shared().users.open_account());
    let request = |args: &[&str]| Request {
        args: args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect(),
    };
    for earlier in before {
        let _ = dispatch::execute(request(earlier), &mut session, shared());
    }
    let protocol = session.protocol;
    match dispatch::execute(request(args), &mut session, shared()) {
        Action::Reply(reply) | Action::Close(reply) => (reply, protocol),
        Action::Stock(..) => panic!("{args:?} is not a connection-level command"),
    }
}

/// Every connection-level reply, and the errors the table gives.
const TABLE_REQUESTS: &[&[&str]] = &[
    &["HELLO"],
    &["HELLO", "2"],
    &["HELLO", "3"],
    &["HELLO", "3", "SETNAME", "app-1"],
    &["HELLO", "3", "AUTH", "default", "x"],
    &["HELLO", "4"],
    &["HELLO", "x"],
    &["PING"],
    &["PING", "hello"],
    &["ECHO", "two words"],
    &["INFO"],
    &["INFO", "all"],
    &["INFO", "server"],
    &["INFO", "stats"],
    &["INFO", "stockgate"],
    &["COMMAND"],
    &["COMMAND", "COUNT"],
    &["COMMAND", "LIST"],
    &["COMMAND", "DOCS"],
    &["COMMAND", "DOCS", "deduct", "client"],
    &["COMMAND", "INFO", "deduct", "nosuch"],
    &["COMMAND", "NOSUCH"],
    &["CLIENT", "ID"],
    &["CLIENT", "GETNAME"],
    &["CLIENT", "SETNAME", "app"],
    &["CLIENT", "SETINFO", "LIB-NAME", "go-redis"],
    &["CLIENT", "NOSUCH"],
    &["SELECT", "0"],
    &["SELECT", "1"],
    &["AUTH", "x"],
    &["AUTH", "default", "x"],
    &["DEDUCT"],
    &["NOSUCH", "a", "b\r\nc"],
    &["QUIT"],
];

#[test]
fn every_connection_level_reply_parses_exactly_in_both_protocols() {
    for protocol_switch in [&[][..], &[&["HELLO", "3"][..]][..]] {
        let replies: Vec<(Reply, Protocol)> = TABLE_REQUESTS
            .iter()
            .map(|args| table_reply(protocol_switch, args))
            .collect();
        let protocol = replies[0].1;
        let replies: Vec<Reply> = replies.into_iter().map(|(r, _)| r).collect();
        round_trip(&replies, protocol);
    }
}

#[test]
fn the_issue_11_reply_parses_and_leaves_nothing_behind() {
    // Two pipelined DEDUCT replies with the remains from the bug report.
    let replies: Vec<Reply> = [999_999_999_999_998, 999_999_999_999_997]
        .into_iter()
        .map(|remain| {
            Reply::Stock(StockReply {
                code: Code::Ok,
                remain,
                order_no: Bytes::new(),
                version: 3,
                expires_at: None,
                reason: None,
                allocation: None,
                effects: Default::default(),
            })
        })
        .collect();
    round_trip(&replies, Protocol::Resp2);
    round_trip(&replies, Protocol::Resp3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_reply_parses_back_exactly(replies in prop::collection::vec(reply(), 1..6)) {
        round_trip(&replies, Protocol::Resp2);
        round_trip(&replies, Protocol::Resp3);
    }

    #[test]
    fn stock_replies_with_any_integers_parse_back_exactly(stock in stock_reply()) {
        let replies = [Reply::Stock(stock.clone()), Reply::Integer(stock.remain), Reply::Stock(stock)];
        round_trip(&replies, Protocol::Resp2);
        round_trip(&replies, Protocol::Resp3);
    }
}

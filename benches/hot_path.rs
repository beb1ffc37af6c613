//! The CPU stockgate spends on one DEDUCT besides the network and Redis:
//! framing the request, validating it, building the keys and their slot,
//! and encoding the reply, each on its own and all four in a row.
//!
//! ```sh
//! cargo bench --bench hot_path                 # all of them
//! cargo bench --bench hot_path -- encode       # those whose name matches
//! ```
//!
//! Under `cargo test --all-targets` criterion runs each function once, as a
//! smoke test, and measures nothing.

use bytes::{Bytes, BytesMut};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use stockgate::frame::RequestDecoder;
use stockgate::keys::{self, KeyLayout};
use stockgate::outcome::{Code, SCRIPT_VERSION, StockReply};
use stockgate::reply::{Protocol, Reply};
use stockgate::stock::{Limits, OneRequest, StockCommand};
use tokio_util::codec::Decoder;

/// The decoder's bound, as stockgate's default `--max-request-bytes`.
const MAX_REQUEST: usize = 64 * 1024;
/// The default `--max-qty` and `--max-hold`.
const LIMITS: Limits = Limits {
    max_qty: 1_000_000,
    max_hold_ms: 24 * 3600 * 1000,
};

/// A DEDUCT's arguments (after its name) checked, as the service checks
/// them.
fn check(args: &[Bytes]) -> OneRequest {
    let command = StockCommand::Deduct;
    let single = command.single().expect("DEDUCT is a call on one request");
    OneRequest::parse(command, single, args, &LIMITS).expect("the sample DEDUCT is valid")
}

/// One DEDUCT as a client library sends it, with realistic field sizes.
const REQUEST: &[u8] = b"*5\r\n$6\r\nDEDUCT\r\n$12\r\nSKU-10086-XL\r\n$1\r\n1\r\n\
$36\r\n7f9c2ba4-e88f-4d2b-9a6e-0c1d2e3f4a5b\r\n$20\r\nORD-20261129-0000042\r\n";

/// How many requests arrive in one read in the pipelined case (the side
/// by side benchmark's depth).
const PIPELINE: usize = 16;

fn args() -> Vec<Bytes> {
    let mut decoder = RequestDecoder::new(MAX_REQUEST);
    let request = decoder
        .decode(&mut BytesMut::from(REQUEST))
        .expect("the sample request is valid RESP")
        .expect("the sample request is complete");
    request.args[1..].to_vec()
}

fn ok_reply() -> StockReply {
    StockReply {
        code: Code::Ok,
        remain: 999_958,
        order_no: Bytes::from_static(b"ORD-20261129-0000042"),
        version: SCRIPT_VERSION,
        expires_at: None,
        reason: None,
        allocation: None,
        effects: Default::default(),
    }
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(1));
    group.bench_function("one DEDUCT", |b| {
        let mut decoder = RequestDecoder::new(MAX_REQUEST);
        b.iter_batched_ref(
            || BytesMut::from(REQUEST),
            |buf| black_box(decoder.decode(buf).unwrap()),
            BatchSize::SmallInput,
        )
    });
    group.throughput(Throughput::Elements(PIPELINE as u64));
    group.bench_function("16 pipelined DEDUCTs in one buffer", |b| {
        let pipelined = REQUEST.repeat(PIPELINE);
        let mut decoder = RequestDecoder::new(MAX_REQUEST);
        b.iter_batched_ref(
            || BytesMut::from(&pipelined[..]),
            |buf| {
                while let Some(request) = decoder.decode(buf).unwrap() {
                    black_box(request);
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn validate(c: &mut Criterion) {
    let args = args();
    c.bench_function("validate/OneRequest::parse", |b| {
        b.iter(|| black_box(check(black_box(&args))))
    });
}

fn keys_and_slot(c: &mut Criterion) {
    let layout = KeyLayout::new("stock").unwrap();
    let deduct = check(&args());
    c.bench_function("keys/request_keys + slot", |b| {
        b.iter(|| {
            let keys = layout.request_keys(black_box(&deduct.sku), black_box(&deduct.request_id));
            black_box(keys::slot(&keys.stock));
            black_box(keys)
        })
    });
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    for (name, protocol) in [("RESP2", Protocol::Resp2), ("RESP3", Protocol::Resp3)] {
        let reply = Reply::Stock(ok_reply());
        let mut buf = BytesMut::with_capacity(256);
        group.bench_function(format!("deduct reply {name}"), |b| {
            b.iter(|| {
                buf.clear();
                black_box(&reply).encode(protocol, &mut buf);
                black_box(buf.len())
            })
        });
    }
    group.finish();
}

/// All four steps for one request, as the connection runs them (minus the
/// upstream call and the metrics).
fn whole_path(c: &mut Criterion) {
    let layout = KeyLayout::new("stock").unwrap();
    let mut decoder = RequestDecoder::new(MAX_REQUEST);
    let mut out = BytesMut::with_capacity(256);
    c.bench_function("whole path/decode+validate+keys+slot+encode", |b| {
        b.iter_batched_ref(
            || BytesMut::from(REQUEST),
            |buf| {
                let request = decoder.decode(buf).unwrap().unwrap();
                let deduct = check(&request.args[1..]);
                let keys = layout.request_keys(&deduct.sku, &deduct.request_id);
                black_box(keys::slot(&keys.stock));
                black_box(&keys);
                out.clear();
                let reply = StockReply {
                    order_no: deduct.order_no.into_bytes(),
                    ..ok_reply()
                };
                Reply::Stock(reply).encode(Protocol::Resp2, &mut out);
                black_box(out.len())
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(
    hot_path,
    decode,
    validate,
    keys_and_slot,
    encode,
    whole_path
);
criterion_main!(hot_path);

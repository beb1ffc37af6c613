//! Fuzz target `resp`: bytes from a client, through the whole request path.
//!
//! Bytes → `RequestDecoder` (in the reads the input asks for, as a
//! connection gets them) → `dispatch::execute` → the stock service (DEDUCT,
//! REVERT, STOCK.*: argument parsing, against an upstream that never
//! connects) → `Reply::encode` in the session's protocol → redis-protocol's
//! decoder. The invariants are in `../harness.rs`; the input format is
//! `harness::case_from_bytes` (4 control bytes, then the stream).
//!
//! # Running it (from the repository root, stable Rust)
//!
//! ```text
//! cargo install cargo-fuzz --locked         # once
//! tests/fuzz/run.sh 600                     # 10 minutes; or, by hand:
//! RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tests/fuzz resp \
//!     tests/fuzz/corpus/resp tests/fuzz/seeds/resp -- \
//!     -dict=tests/fuzz/resp.dict -max_len=8192 -timeout=10 -max_total_time=600
//! ```
//!
//! `RUSTC_BOOTSTRAP=1` lets stable rustc take the `-Z` flags cargo-fuzz
//! passes (`-Zsanitizer=address` and friends); no nightly is needed. A
//! crash leaves its input in `tests/fuzz/artifacts/resp/`; replay it with
//! `RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tests/fuzz resp <file>`.
//! See `tests/fuzz/README.md`.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    if let Some(case) = harness::case_from_bytes(data) {
        harness::check(&case);
    }
    // The same bytes, read as replies to write: the encoder over every value.
    harness::check_reply_program(data);
});

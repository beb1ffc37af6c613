#!/usr/bin/env bash
# Runs the `resp` fuzz target on stable Rust for SECONDS (default 600).
#
#   tests/fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
#
# New corpus entries go to tests/fuzz/corpus/resp (not committed), crashes
# to tests/fuzz/artifacts/resp. See tests/fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-600}
shift || true
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p tests/fuzz/corpus/resp tests/fuzz/artifacts/resp
# RUSTC_BOOTSTRAP=1: stable rustc accepts the -Z flags cargo-fuzz passes
# (-Zsanitizer=address); no nightly toolchain is needed.
RUSTC_BOOTSTRAP=1 exec cargo fuzz run --fuzz-dir tests/fuzz resp \
    tests/fuzz/corpus/resp tests/fuzz/seeds/resp -- \
    -dict=tests/fuzz/resp.dict -max_len=8192 -timeout=10 -rss_limit_mb=3072 \
    -detect_leaks=0 -print_final_stats=1 -max_total_time="$secs" "$@"

#!/usr/bin/env bash
# One command for the side-by-side benchmark: installs Redis and
# nutcracker if missing, then runs `cargo bench --bench side_by_side`.
# Arguments go to the benchmark (`throughput`, `memory`); knobs are
# environment variables, listed at the top of benches/side_by_side/main.rs.
#
#   deploy/bench.sh                    # everything (several minutes)
#   BENCH_REQUESTS=20000 BENCH_REPEATS=1 deploy/bench.sh throughput
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh dev  # Redis only; the benchmark needs no test tools
deploy/install-bench-deps.sh
# nutcracker lives in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin"
exec cargo bench --bench side_by_side -- "$@"

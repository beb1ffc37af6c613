#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, unit tests, and the
# integration tests against real Redis servers they start on loopback.
#
# The same checks and tests as `cargo fmt --check`, `cargo clippy
# --all-targets -D warnings` and `cargo test --all-targets`, in an order
# that fits CI's budget on 2 cores. Most integration tests wait (for
# timers, failovers, retry windows) far more than they compute, and
# `cargo test` runs its test executables one after another; so here:
#
# - the fault suite (tests/faults/), which measures recovery times and is
#   the longest by far, is built first and runs in a lane of its own as
#   soon as it is built;
# - meanwhile the rest is built, then its test executables run,
#   STOCKGATE_TEST_LANES (2) at a time, the slowest first;
# - the rest's build and clippy run at the lowest CPU priority (nice 19),
#   in the time the tests leave idle. (tests/examples.rs builds its
#   examples with cargo, which waits for clippy's lock on target/ if it
#   must: they are built already, so that is all it costs.)
#
# Each executable's output goes to target/test-logs/<name>.log; a line per
# executable says how it ended, the output of each that failed is printed
# at the end, and the exit status is 1 if any check or test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh test

for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component"
    fi
done

cargo fmt --all -- --check

lanes="${STOCKGATE_TEST_LANES:-2}"
logs=target/test-logs
rm -rf "$logs"
mkdir -p "$logs"

# Started first in the other lanes, in this order: they run longest, so
# the lanes end about together.
slowest=(tests/clients.rs tests/holds.rs tests/orders.rs tests/revert.rs)

# Runs a `cargo test --no-run` command, showing cargo's progress, and
# writes "<target>|<path>" for each test executable it lists into <list>.
build() {
    local list="$1"
    shift
    "$@" 2>&1 | tee "$list.txt" | { grep --line-buffered -v '^ *Executable' || true; }
    sed -n 's/^ *Executable \(.*\) (\(.*\))$/\1|\2/p' "$list.txt" >"$list"
}

# Runs one test executable as `cargo test` does (from the package root, no
# arguments) into its log; prints one line when it ends; leaves "<exit
# status> <ms> <target>" in <log>.status.
run_one() {
    local target="$1" path="$2"
    local log="$logs/${target//[ \/]/-}.log"
    local start status=0
    start="$(date +%s%N)"
    "$path" >"$log" 2>&1 &
    echo $! >"$log.pid"
    wait $! || status=$?
    local ms=$((($(date +%s%N) - start) / 1000000))
    echo "$status $ms $target" >"$log.status"
    local took result
    took="$(printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100)))"
    result="$(sed -n 's/^test result: \(.*\); finished in.*/\1/p' "$log" | tail -1)"
    if [ "$status" -eq 0 ]; then
        printf 'ok      %8s  %s  %s\n' "$took" "$target" "$result"
    else
        printf 'FAILED  %8s  %s  %s (exit status %d, output below)\n' "$took" "$target" "$result" "$status"
    fi
}

# Runs "<target>|<path>" lines from stdin, at most $lanes at a time.
run_lanes() {
    local running=0 target path
    while IFS='|' read -r target path; do
        if [ "$running" -ge "$lanes" ]; then
            wait -n || true
            running=$((running - 1))
        fi
        run_one "$target" "$path" &
        running=$((running + 1))
    done
    wait
}

# A test executable still running when this script stops is stopped too
# (and the servers it started with it).
stop_tests() {
    local pid
    for pid in "$logs"/*.pid; do
        if [ -e "$pid" ] && [ ! -e "${pid%.pid}.status" ]; then
            kill "$(cat "$pid")" 2>/dev/null || true
        fi
    done
}
trap stop_tests EXIT
trap 'exit 130' INT TERM

echo "building the fault suite..."
build "$logs/faults" cargo test --locked --no-run --test faults
[ -s "$logs/faults" ] || { echo "cargo listed no fault suite executable" >&2; exit 1; }
echo "running the fault suite in a lane of its own; building the rest meanwhile (nice 19)"
IFS='|' read -r target path <"$logs/faults"
run_one "$target" "$path" &
faults_lane=$!

build "$logs/all" nice -n 19 cargo test --locked --no-run --all-targets
grep -v '^tests/faults/main.rs|' "$logs/all" | while IFS='|' read -r target path; do
    rank=99
    for i in "${!slowest[@]}"; do
        [ "$target" = "${slowest[$i]}" ] && rank="$i"
    done
    echo "$rank|$target|$path"
done | sort -s -n -t'|' -k1,1 | cut -d'|' -f2- >"$logs/rest"
echo "running the other tests, $lanes at a time; clippy meanwhile (nice 19)"
run_lanes <"$logs/rest" &
other_lanes=$!

checks_failed=()
nice -n 19 cargo clippy --all-targets --locked -- -D warnings || checks_failed+=("cargo clippy")
wait "$other_lanes" "$faults_lane" || true

failed=()
ran="$(find "$logs" -name '*.status' | wc -l)"
listed="$(($(wc -l <"$logs/rest") + 1))"
if [ "$ran" -ne "$listed" ]; then
    failed+=("(only $ran of the $listed test executables ran to an end)")
fi
for status in "$logs"/*.status; do
    read -r code _ target <"$status"
    if [ "$code" -ne 0 ]; then
        failed+=("$target")
        echo
        echo "---- $target (exit status $code): ${status%.status} ----"
        cat "${status%.status}"
    fi
done
if [ "${#failed[@]}" -gt 0 ] || [ "${#checks_failed[@]}" -gt 0 ]; then
    echo
    echo "failed: ${checks_failed[*]}${checks_failed[*]:+; }${failed[*]}" >&2
    exit 1
fi
echo "every check and test passed"

#!/usr/bin/env bash
# Measures what the Kubernetes resource requests and limits in
# deploy/kubernetes/ are sized from: stockgate's memory (peak RSS, VmHWM)
# and CPU (utime+stime) per DEDUCT, under redis-benchmark load, in front
# of a throwaway local Redis Cluster (`stockgate dev`). Only loopback
# traffic; everything it starts is stopped when it ends.
#
#   deploy/measure.sh            # the scenarios in deploy/README.md
#   REQUESTS=50000 deploy/measure.sh
#
# The load generator, the three Redis primaries and stockgate share this
# machine's cores, so the req/s column says more about the machine than
# about stockgate; CPU per request and memory are the numbers to size from.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh dev  # redis-cli, redis-benchmark: Redis only
requests="${REQUESTS:-200000}"

cargo build --release --locked --quiet
bin=target/release/stockgate
work="$(mktemp -d)"
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        wait "$pid" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Port 0: free ports; `stockgate dev` prints where it listens.
"$bin" dev --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 >"$work/out" 2>"$work/err" </dev/null &
pid=$!
for _ in $(seq 100); do
    grep -q "serving DEDUCT on" "$work/out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/err" >&2; exit 1; }
    sleep 0.2
done
port="$(sed -n 's/.*serving DEDUCT on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/out")"
seed="$(sed -n 's/.*local cluster (redis:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/out")"
[ -n "$port" ] && [ -n "$seed" ] || { cat "$work/out" "$work/err" >&2; exit 1; }

# Enough stock that every DEDUCT is a real deduction (code 0) or, for a
# repeated random request_id, a duplicate (code 1): the full script path.
redis-cli -c -p "$seed" SET 'stock:{demo-1}' 1000000000000 >/dev/null

ticks_per_second="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
status_kib() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$pid/status"; }

echo "stockgate $("$bin" --version | cut -d' ' -f2), pid $pid, $(nproc) cores, $requests requests per run"
echo
echo "| load | req/s (shared cores) | CPU µs per request | peak RSS (VmHWM) MiB | open fds at peak |"
echo "|---|---|---|---|---|"
before="$(cpu_ticks)"
sleep 30
idle_ticks=$(($(cpu_ticks) - before))
printf '| idle, 30 s | - | %s ms CPU in 30 s | %.1f | %s |\n' \
    "$((idle_ticks * 1000 / ticks_per_second))" "$(echo "$(status_kib VmHWM) / 1024" | bc -l)" \
    "$(find "/proc/$pid/fd" -mindepth 1 | wc -l)"

run() {
    local label="$1"
    shift
    local before after rps fds sampler
    before="$(cpu_ticks)"
    # Sample the fd count while the load runs (connections are open then).
    (sleep 2; find "/proc/$pid/fd" -mindepth 1 | wc -l >"$work/fds") &
    sampler=$!
    # stderr: redis-benchmark's note that stockgate has no CONFIG command.
    rps="$(redis-benchmark -h 127.0.0.1 -p "$port" -n "$requests" -r 1000000000 "$@" -q \
        DEDUCT demo-1 1 req-__rand_int__ 2>"$work/benchmark.err" | tr '\r' '\n' |
        grep 'requests per second' | tail -1 | sed 's/.*: \([0-9.]*\) requests per second.*/\1/')"
    wait "$sampler"
    after="$(cpu_ticks)"
    fds="$(cat "$work/fds")"
    printf '| %s | %.0f | %.1f | %.1f | %s |\n' "$label" "$rps" \
        "$(echo "($after - $before) * 1000000 / $ticks_per_second / $requests" | bc -l)" \
        "$(echo "$(status_kib VmHWM) / 1024" | bc -l)" "$fds"
}
run "50 connections" -c 50
run "50 connections, pipeline 16" -c 50 -P 16
run "1000 connections" -c 1000

echo
echo "results: $(curl -s "http://$(sed -n 's/.*Metrics: http:\/\/\([0-9.:]*\)\/metrics.*/\1/p' "$work/out")/metrics" |
    grep '^stockgate_requests_total' | sed 's/.*result="\([a-z]*\)"} /\1=/' | tr '\n' ' ')"

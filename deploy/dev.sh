#!/usr/bin/env bash
# Starts stockgate in front of a throwaway 3-primary Redis Cluster on
# loopback, with demo stock. Ctrl-C stops everything it started.
# Extra arguments go to `stockgate dev` as they are (try --help, or
# --http-listen for the HTTP/JSON API on 127.0.0.1:8390).
set -euo pipefail
cd "$(dirname "$0")/.."
# Redis only: the test tools (Prometheus, Node.js, ...) are test.sh's.
deploy/install-deps.sh dev
# Not --quiet: the first build compiles a few hundred crates, a minute or
# two on 2 cores, and cargo's progress shows it is under way.
echo "building stockgate (debug; the first build takes a minute or two)..." >&2
exec cargo run --bin stockgate -- dev "$@"

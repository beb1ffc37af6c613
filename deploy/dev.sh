#!/usr/bin/env bash
# Starts stockgate in front of a throwaway 3-primary Redis Cluster on
# loopback, with demo stock. Ctrl-C stops everything it started.
# Extra arguments go to `stockgate dev` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
exec cargo run --quiet -- dev "$@"

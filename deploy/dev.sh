#!/usr/bin/env bash
# Starts stockgate in front of a throwaway 3-primary Redis Cluster on
# loopback, with demo stock. Ctrl-C stops everything it started.
# Extra arguments go to `stockgate dev` as they are (try --help, or
# --http-listen for the HTTP/JSON API on 127.0.0.1:8390), except
# --postgres, which this script takes: it also starts a throwaway
# PostgreSQL on 127.0.0.1:5439 for the books (`stockgate journal sink`,
# `stockgate reconcile`; docs/books.md), prints its URL, and turns the
# journal on (`--journal true`).
set -euo pipefail
cd "$(dirname "$0")/.."

postgres=false
args=()
for arg in "$@"; do
    if [ "$arg" = --postgres ]; then
        postgres=true
    else
        args+=("$arg")
    fi
done

if [ "$postgres" = false ]; then
    # Redis only: the test tools (Prometheus, Node.js, ...) are test.sh's.
    deploy/install-deps.sh dev
    # Not --quiet: the first build compiles a few hundred crates, a minute or
    # two on 2 cores, and cargo's progress shows it is under way.
    echo "building stockgate (debug; the first build takes a minute or two)..." >&2
    exec cargo run --bin stockgate -- dev "${args[@]}"
fi

deploy/install-deps.sh dev-postgres
# The books need the journal, off by default (docs/books.md).
journal_set=false
for arg in "${args[@]}"; do
    case "$arg" in --journal | --journal=*) journal_set=true ;; esac
done
[ "$journal_set" = true ] || args+=(--journal true)
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
port="${STOCKGATE_DEV_POSTGRES_PORT:-5439}"
dir="$(mktemp -d -t stockgate-dev-pg-XXXXXX)"
# PostgreSQL refuses to run as root: as root, run it as Debian's postgres user.
as=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$dir"
    as=(runuser -u postgres --)
fi
stop_postgres() {
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    echo "PostgreSQL stopped" >&2
}
trap stop_postgres EXIT
"${as[@]}" "$bin/initdb" -D "$dir/data" -U stockgate --auth=trust -E UTF8 --no-sync >/dev/null
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir" start >/dev/null
echo "PostgreSQL for the books on 127.0.0.1:$port (a throwaway in $dir). In another terminal:" >&2
echo "  export STOCKGATE_DATABASE=postgres://stockgate@127.0.0.1:$port/postgres?sslmode=disable" >&2
echo "building stockgate (debug; the first build takes a minute or two)..." >&2
# Not exec: the trap stops PostgreSQL when stockgate dev ends.
cargo run --bin stockgate -- dev "${args[@]}"

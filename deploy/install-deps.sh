#!/usr/bin/env bash
# Installs what stockgate's dev mode and tests need beyond the Rust
# toolchain: Redis 7+ (redis-server, redis-cli) from Debian's packages.
# Idempotent: does nothing when a recent enough Redis is already there.
set -euo pipefail

redis_major() {
    redis-server --version 2>/dev/null | sed -n 's/.*v=\([0-9]*\)\..*/\1/p'
}

if command -v redis-cli >/dev/null && [ "$(redis_major || echo 0)" -ge 7 ] 2>/dev/null; then
    exit 0
fi

echo "installing redis-server and redis-tools (Redis 7+) from Debian's packages..." >&2
if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null; then
    sudo="sudo"
else
    echo "need root or sudo to run: apt-get install -y redis-server redis-tools" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq redis-server redis-tools >/dev/null

major="$(redis_major || echo 0)"
if [ "${major:-0}" -lt 7 ]; then
    echo "this distribution ships Redis ${major}; stockgate needs 7.0 or newer (Debian 12+)" >&2
    exit 1
fi

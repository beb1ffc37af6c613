#!/usr/bin/env bash
# Installs what the side-by-side benchmark needs beyond deploy/install-deps.sh:
# twemproxy (Debian package nutcracker), the proxy stockgate is compared with.
# Optional: only `cargo bench --bench side_by_side` uses it. Idempotent.
set -euo pipefail

if command -v nutcracker >/dev/null || [ -x /usr/sbin/nutcracker ]; then
    exit 0
fi

echo "installing nutcracker (twemproxy) from Debian's packages..." >&2
if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null; then
    sudo="sudo"
else
    echo "need root or sudo to run: apt-get install -y nutcracker" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq nutcracker >/dev/null
# The package may start a system nutcracker on its default ports; the
# benchmark runs its own.
if command -v systemctl >/dev/null && systemctl is-active --quiet nutcracker 2>/dev/null; then
    $sudo systemctl stop nutcracker || true
fi

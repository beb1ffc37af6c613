#!/usr/bin/env bash
# Runs every check and test: formatting, clippy, unit tests, and the
# integration tests against real Redis servers they start on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh test

for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        rustup component add "$component"
    fi
done

cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked

#!/usr/bin/env bash
# The cargo-built tools only the tests use: cargo-fuzz (scripts/test.sh runs every fuzz target
# briefly; fuzz/ and docs/testing.md) and cargo-deny (deny.toml: licences, sources, duplicate
# crates). Both compile from crates.io for minutes, so scripts/test.sh starts this alongside
# setup's own build; scripts/setup-test.sh runs it too (a no-op once they are installed).
set -euo pipefail
export PATH="$HOME/.cargo/bin:$PATH"

# The fuzz targets need nightly compiler flags, which RUSTC_BOOTSTRAP=1 lets the stable
# toolchain accept.
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install --quiet cargo-fuzz
fi
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "==> installing cargo-deny"
  cargo install --quiet --locked cargo-deny
fi

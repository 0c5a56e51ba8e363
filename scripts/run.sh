#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine (as root), then starts the Warren server: the
# E2B-compatible API and sandbox proxy on 127.0.0.1:3000, with the namespace runtime and the
# `base` template (built on the first start, which takes a few minutes).
#
# WARREN_API_KEY=<key> seeds a known API key; otherwise the first start prints a new one.
# WARREN_LISTEN and WARREN_DATA_DIR override the address and the data directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

started=$(date +%s)
./scripts/setup.sh
listen="${WARREN_LISTEN:-127.0.0.1:3000}"
data_dir="${WARREN_DATA_DIR:-/var/lib/warren}"
printf '\033[1m==> set up in %ss; starting warren serve on %s (it logs when it serves; the first start builds the base template first)\033[0m\n' \
  "$(($(date +%s) - started))" "$listen"
exec ./target/release/warren serve --listen "$listen" --data-dir "$data_dir" "$@"

#!/usr/bin/env bash
# Installs what only the tests need, on top of scripts/setup.sh (run as root, after it):
# the benchmark baseline, a real registry, a browser, the fuzzing and dependency-policy tools,
# and the `user` account the agent's tests on
# the host run commands as. Idempotent like setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

started=$(date +%s)
log() { printf '\033[1m==> [%4ss] %s\033[0m\n' "$(($(date +%s) - started))" "$*"; }

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v useradd >/dev/null 2>&1 || need_apt+=(passwd)
# The benchmarks' baseline sandbox.
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
# Tests of templates from registry images: a real registry on loopback (with htpasswd for its
# auth), and busybox-static (setup.sh) for a tiny image with no bash, sudo or glibc.
command -v docker-registry >/dev/null 2>&1 || need_apt+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || need_apt+=(apache2-utils)
# The dashboard is tested in Debian's chromium.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

# cargo-fuzz and cargo-deny (scripts/test-tools.sh; scripts/test.sh may have built them
# already, alongside setup's build).
if ! command -v cargo-fuzz >/dev/null 2>&1 || ! command -v cargo-deny >/dev/null 2>&1; then
  log "installing cargo-fuzz and cargo-deny"
  ./scripts/test-tools.sh
fi

# The agent's tests on the host run commands as `user`, as sandboxes do by default.
if ! id user >/dev/null 2>&1; then
  log "creating the account 'user' for the agent's tests"
  useradd --create-home --shell /bin/bash user
fi
log "test tools ready"

#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine (as root) and runs every test: Rust unit and
# integration tests (including real sandboxes and network slots), the agent conformance suite,
# the control-plane end-to-end suite with the official E2B Python SDK and the code-interpreter
# suite with the official e2b-code-interpreter SDKs, then one smoke run
# of each benchmark (which only checks that numbers come out).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# The test-only cargo tools compile for minutes: where cargo is already here they build
# alongside setup's own build (whose serial stretches, the last crates and the links, leave a
# core idle) and are waited for before the rest of the test tools.
tools_log=$(mktemp /tmp/warren-test-tools.XXXXXX)
tools=""
if command -v cargo >/dev/null 2>&1; then
  ./scripts/test-tools.sh >"$tools_log" 2>&1 &
  tools=$!
fi
./scripts/setup.sh
if [ -n "$tools" ] && ! wait "$tools"; then
  cat "$tools_log"
  exit 1
fi
./scripts/setup-test.sh

# Each stage's line shows the time since the script started (setup included), so a slow stage
# shows in any log.
log() { printf '\033[1m==> [%d:%02d] %s\033[0m\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
# Free space where the build and the sandboxes' data go: the suite needs about 25 GB (a fresh
# target/ and the microVM stage's disks); a stage that fails for room shows the cause here.
disk() { df -h --output=avail,target . /var/lib 2>/dev/null | sed 's/^/    free: /'; }
disk

# setup.sh just installed everything the tests need, so a test that would skip for want of
# something (root, QEMU, nft, mkfs.erofs, ...) fails here instead (docs/testing.md).
export WARREN_REQUIRE_ALL=1

log "cargo fmt --check"
cargo fmt --all -- --check

# The fuzz targets build (a sanitizer build of the whole server, minutes of compiling) in the
# background at the lowest CPU and I/O priority: it takes what the stages below leave idle
# (the serial ends of each build, the suites' waits) and the targets run near the end. Its own
# process group, so an early exit of this script stops it too.
fuzz_flags=(--dev)
fuzz_log="$PWD/target/fuzz-build.log"
mkdir -p target
(cd fuzz && RUSTC_BOOTSTRAP=1 exec setsid nice -n 19 ionice -c 3 cargo fuzz build "${fuzz_flags[@]}") \
  >"$fuzz_log" 2>&1 &
fuzz_build=$!
trap 'kill -- -"$fuzz_build" 2>/dev/null || true' EXIT

log "cargo deny (deny.toml: licences, sources, bans; advisories need the network: docs/testing.md)"
cargo deny --offline check licenses bans sources

log "Rust tests"
# WARREN_REQUIRE_ALL=1 (above) keeps every test from skipping: QEMU, nft, root were just set up.
cargo test --release --locked --workspace

log "cargo clippy -D warnings (the lints Cargo.toml declares, on every target), in the background"
# After the tests, so it shares target/ (its build scripts and proc macros) without waiting on
# cargo's lock; at the lowest priority, so the suites below keep the CPU they want. Waited for
# before the fuzz runs at the end.
clippy_log="$PWD/target/clippy.log"
setsid nice -n 19 ionice -c 3 cargo clippy --release --locked --workspace --all-targets -- -D warnings \
  >"$clippy_log" 2>&1 &
clippy=$!
trap 'kill -- -"$fuzz_build" 2>/dev/null || true; kill -- -"$clippy" 2>/dev/null || true' EXIT

log "Python environment for the SDK suites"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -r tests/agent/requirements.txt -r tests/e2e/requirements.txt \
  -r tests/interpreter/requirements.txt -r tests/security/requirements.txt -r tests/dashboard/requirements.txt -r benches/requirements.txt \
  -r crates/warren-template/services/code-interpreter/requirements-test.txt

log "code-interpreter service unit tests (crates/warren-template/services/code-interpreter)"
.venv/bin/python -m pytest crates/warren-template/services/code-interpreter/tests -q

log "agent conformance suite (e2b SDK)"
WARREN_AGENT_BIN="$PWD/target/release/warren-agent" .venv/bin/python -m pytest tests/agent -q

log "agent conformance suite against agents inside microVMs (TCG on hosts without usable KVM)"
# The examples are the ones `cargo test` just built (with its features: no second build).
./target/release/examples/vm_agents .venv/bin/python -m pytest tests/agent -q

log "the e2b CLI (@e2b/cli@2.19.0) for the end-to-end suite"
# setup.sh made sure of Node.js >= 20.18.1 (from the npm registry where Debian's is older).
(cd tests/e2e/e2b-cli && npm ci --no-audit --no-fund --loglevel=error)

log "control-plane end-to-end suite (e2b SDK against warren serve with the namespace runtime)"
# Reuses the base image the Rust tests built in /var/lib/warren.
# Pinned to ns (not auto): on a KVM host auto would pick vm, and ns would go untested.
WARREN_E2E_RUNTIME=ns WARREN_BIN="$PWD/target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren \
  .venv/bin/python -m pytest tests/e2e -q --durations=15

log "control-plane end-to-end suite with the vm runtime (every sandbox a QEMU microVM fork)"
disk
WARREN_E2E_RUNTIME=vm WARREN_BIN="$PWD/target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren \
  .venv/bin/python -m pytest tests/e2e -q --durations=25

log "security suite (threat model findings, SDK and raw HTTP against warren serve, both runtimes)"
WARREN_E2E_RUNTIME=ns WARREN_BIN="$PWD/target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren \
  .venv/bin/python -m pytest tests/security -q
WARREN_E2E_RUNTIME=vm WARREN_BIN="$PWD/target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren \
  .venv/bin/python -m pytest tests/security -q

log "SDK version matrix (tests/compat with pinned e2b Python releases, each in its own venv)"
./scripts/sdk-matrix.sh

log "web dashboard in headless chromium (Playwright): log in, terminal, upload, pause and resume"
# Screenshots go to target/dashboard-screenshots (docs/dashboard.md shows a few).
WARREN_E2E_RUNTIME=ns WARREN_BIN="$PWD/target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren \
  .venv/bin/python -m pytest tests/dashboard -q

log "control-plane smoke test with the official E2B JS SDK (e2b@2.51.0)"
# e2b 2.51.0 needs Node >= 20.18.1 (setup.sh installs it where Debian's is older).
(cd tests/e2e/js && npm ci --no-audit --no-fund --loglevel=error \
  && WARREN_BIN="$PWD/../../../target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren node --test)

log "code interpreter: build the code-interpreter-v1 and code-interpreter-full images (minutes the first time; cached after)"
# Side by side: both are mostly downloads and unpacking. The full image's log goes to a file
# and is shown only if it fails.
./target/release/warren template build code-interpreter-full --data-dir /var/lib/warren \
  >target/code-interpreter-full-build.log 2>&1 &
full_build=$!
./target/release/warren template build code-interpreter-v1 --data-dir /var/lib/warren
if ! wait "$full_build"; then
  cat target/code-interpreter-full-build.log
  exit 1
fi

log "code-interpreter suite (e2b-code-interpreter SDK against warren serve)"
WARREN_E2E_RUNTIME=ns WARREN_BIN="$PWD/target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren \
  .venv/bin/python -m pytest tests/interpreter -q

log "code-interpreter smoke test with the official JS SDK (@e2b/code-interpreter@2.8.0)"
(cd tests/interpreter/js && npm ci --no-audit --no-fund --loglevel=error \
  && WARREN_BIN="$PWD/../../../target/release/warren" WARREN_E2E_DATA_DIR=/var/lib/warren node --test)

log "benchmark smoke run (and the unit tests of benches/run.py --compare)"
.venv/bin/python -m pytest tests/benches -q
WARREN_AGENT_BIN="$PWD/target/release/warren-agent" .venv/bin/python benches/agent_bench.py --smoke
./target/release/examples/ns_bench --smoke
WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/run.py --smoke --data-dir /var/lib/warren \
  --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/network.py --smoke --data-dir /var/lib/warren \
  --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/volumes.py --smoke --data-dir /var/lib/warren \
  --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/disk.py --smoke --data-dir /var/lib/warren \
  --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/brokering.py --smoke --data-dir /var/lib/warren \
  --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/observability.py --smoke --data-dir /var/lib/warren \
  --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
# The slow tier (WARREN_SLOW=1): the microVM smoke runs of benchmarks whose paths the vm
# end-to-end suite already covers (the runtime's own bench, pause, fork, volumes); a full run
# stays well under CI's limit.
if [ "${WARREN_SLOW:-0}" = 1 ]; then
  ./target/release/examples/vm_bench --smoke
  WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/run.py --smoke --data-dir /var/lib/warren \
    --runtime vm --scenario pause --scenario fork --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
  WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/volumes.py --smoke --data-dir /var/lib/warren \
    --runtime vm --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
fi
# The soak's smoke run fails if a sandbox lost a file or its counter across pauses, if a server
# SIGKILLed during an operation restarts without something it acknowledged, or if the host
# holds more after its sandboxes than before (zombies, descriptors, mounts, cgroups, disks, ...).
for runtime in ns vm; do
  WARREN_BIN="$PWD/target/release/warren" .venv/bin/python benches/soak.py --smoke --runtime "$runtime" \
    --data-dir /var/lib/warren --out "$(mktemp -d /tmp/warren-bench-smoke.XXXXXX)"
done

log "cargo clippy (started in the background after the Rust tests)"
if ! wait "$clippy"; then
  cat "$clippy_log"
  exit 1
fi
tail -n 1 "$clippy_log"

log "fuzz targets, ${WARREN_FUZZ_SECONDS:-10} s each (longer runs and findings: docs/testing.md)"
if ! wait "$fuzz_build"; then
  cat "$fuzz_log"
  exit 1
fi
# Each target starts from its committed seeds plus whatever earlier runs left in fuzz/corpus;
# the flags are the background build's, so nothing compiles again here.
(
  cd fuzz
  for target in $(cargo fuzz list); do
    mkdir -p "corpus/$target"
    RUSTC_BOOTSTRAP=1 cargo fuzz run "${fuzz_flags[@]}" "$target" "corpus/$target" "seeds/$target" -- \
      -max_total_time="${WARREN_FUZZ_SECONDS:-10}"
  done
)

log "all tests passed"

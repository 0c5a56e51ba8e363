#!/usr/bin/env bash
# Runs an upstream SDK project's own test suite, unmodified, against a local `warren serve`
# (namespace runtime), as the measure of compatibility that docs/compatibility.md reports.
# The suites are not part of this repository: point the script at a checkout of theirs.
#
#   scripts/upstream-suite.sh code-interpreter CHECKOUT [TEMPLATE] [PYTEST ARGS (default: tests)]
#       CHECKOUT: a clone of github.com/e2b-dev/code-interpreter; runs python/tests with
#       E2B_TESTS_TEMPLATE=TEMPLATE (default code-interpreter-v1; code-interpreter-full has R
#       and Java). Build the template first: warren template build TEMPLATE.
#   scripts/upstream-suite.sh python-sdk CHECKOUT [PYTEST ARGS (default: tests)]
#       CHECKOUT: a clone of github.com/e2b-dev/E2B at the tag of the SDK release under test
#       (@e2b/python-sdk@$E2B_SDK_VERSION, default 2.45.1: the suite tests that release's
#       code); runs packages/python-sdk/tests. Pass --ignore/--deselect for the tests that
#       reach public addresses (this host has no internet; docs/compatibility.md lists them).
#   scripts/upstream-suite.sh js-sdk CHECKOUT [VITEST ARGS]
#       CHECKOUT: a clone of github.com/e2b-dev/E2B at tag e2b@<release> (the suite tests that
#       release's source, which it imports directly); runs packages/js-sdk/tests/sandbox with
#       vitest, without the tests that reach public addresses (network, internet access,
#       egress proxy). Its dependencies (the SDK's own, vitest, msw, dotenv,
#       error-stack-parser-es) are installed into target/upstream/js-sdk, and
#       CHECKOUT/packages/js-sdk/node_modules is linked there.
#
# Needs root (the server's runtime), the data dir /var/lib/warren (WARREN_E2E_DATA_DIR) with
# its images, and target/release/warren (WARREN_BIN). The client venv lives in
# target/upstream/<suite>. Prints pytest's summary; exits with its status.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

suite=${1:?usage: scripts/upstream-suite.sh code-interpreter|python-sdk CHECKOUT ...}
checkout=$(cd "${2:?the upstream checkout}" && pwd)
shift 2

KEY=e2b_0123456789abcdef0123456789abcdef01234567
BIN=${WARREN_BIN:-$ROOT/target/release/warren}
DATA_DIR=${WARREN_E2E_DATA_DIR:-/var/lib/warren}
venv=$ROOT/target/upstream/$suite
export E2B_TESTS_TEMPLATE=""

case "$suite" in
code-interpreter)
  E2B_TESTS_TEMPLATE=${1:-code-interpreter-v1}
  [ $# -gt 0 ] && shift
  tests_dir=$checkout/python
  packages=(e2b-code-interpreter==2.11.5 "pytest>=9" "pytest-asyncio>=1.3" pytest-xdist matplotlib)
  ;;
python-sdk)
  tests_dir=$checkout/packages/python-sdk
  packages=("e2b==${E2B_SDK_VERSION:-2.45.1}" "pytest>=9" "pytest-asyncio>=1.3" pytest-xdist pytest-timeout
    python-dotenv pytest-dotenv attrs httpx)
  ;;
js-sdk)
  tests_dir=$checkout/packages/js-sdk
  deps=$ROOT/target/upstream/js-sdk
  mkdir -p "$deps"
  node -e '
    const [src, out] = process.argv.slice(1)
    const p = require(src)
    const dev = Object.fromEntries(Object.entries(p.devDependencies || {})
      .filter(([k]) => ["vitest", "msw", "dotenv", "@types/node", "error-stack-parser-es"].includes(k)))
    require("fs").writeFileSync(out, JSON.stringify({ private: true, type: "module",
      dependencies: { ...p.dependencies, ...dev } }, null, 2))
  ' "$tests_dir/package.json" "$deps/package.json"
  (cd "$deps" && npm install --no-audit --no-fund --loglevel=error)
  [ -e "$tests_dir/node_modules" ] || ln -s "$deps/node_modules" "$tests_dir/node_modules"
  cat >"$deps/vitest.config.mts" <<CONFIG
import { defineConfig } from 'vitest/config'
export default defineConfig({
  test: {
    root: '$tests_dir',
    include: ['tests/sandbox/**/*.test.ts'],
    exclude: ['tests/sandbox/network.test.ts', 'tests/sandbox/internetAccess.test.ts',
      'tests/sandbox/egressProxy.test.ts'],
    isolate: true, globals: false, testTimeout: 60_000, environment: 'node',
    setupFiles: ['tests/globalFetchFallback.setup.ts'],
    deps: { interopDefault: true },
  },
})
CONFIG
  ;;
*)
  echo "unknown suite $suite (code-interpreter, python-sdk or js-sdk)" >&2
  exit 2
  ;;
esac

if [ "$suite" != js-sdk ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
mkdir -p "$ROOT/target/upstream"
WARREN_API_KEY=$KEY "$BIN" serve --listen "127.0.0.1:$port" --data-dir "$DATA_DIR" --runtime ns \
  --max-sandboxes 40 >"$ROOT/target/upstream/serve-$suite.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 900); do
  curl -sf "$url/health" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { echo "warren serve exited; see target/upstream/serve-$suite.log" >&2; exit 1; }
  sleep 1
done

# The suites reach some sandbox ports at public host names (getHost(): <port>-<id>.e2b.app in
# URL mode). Name lookups other than loopback are refused in the client processes themselves,
# so no such name is ever resolved: those tests fail at once instead.
guard=$ROOT/target/upstream/guard
mkdir -p "$guard"
cat >"$guard/sitecustomize.py" <<'PY'
import socket

_getaddrinfo = socket.getaddrinfo


def _loopback_only(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name in (None, "localhost", "::1") or str(name).startswith("127."):
        return _getaddrinfo(host, *args, **kwargs)
    raise socket.gaierror(socket.EAI_NONAME, f"{name}: not resolved (this run reaches loopback only)")


socket.getaddrinfo = _loopback_only
PY
cat >"$guard/loopback-only.cjs" <<'JS'
const dns = require('node:dns')
const allowed = (h) => h === 'localhost' || h === '::1' || /^127\./.test(h)
const refuse = (h) => Object.assign(new Error(`getaddrinfo ENOTFOUND ${h} (this run reaches loopback only)`),
  { code: 'ENOTFOUND', hostname: h })
const lookup = dns.lookup
dns.lookup = function (host, options, callback) {
  if (typeof options === 'function') { callback = options; options = {} }
  if (allowed(host)) return lookup.call(dns, host, options, callback)
  process.nextTick(callback, refuse(host))
}
const plookup = dns.promises.lookup
dns.promises.lookup = (host, options) => allowed(host) ? plookup(host, options) : Promise.reject(refuse(host))
JS
export PYTHONPATH=$guard${PYTHONPATH:+:$PYTHONPATH}
export NODE_OPTIONS="--require $guard/loopback-only.cjs${NODE_OPTIONS:+ $NODE_OPTIONS}"

cd "$tests_dir"
export E2B_API_KEY=$KEY E2B_API_URL=$url E2B_SANDBOX_URL=$url
if [ "$suite" = js-sdk ]; then
  "$deps/node_modules/.bin/vitest" run --config "$deps/vitest.config.mts" "$@"
else
  "$venv/bin/python" -m pytest -p no:cacheprovider -q "${@:-tests}"
fi

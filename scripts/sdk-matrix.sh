#!/usr/bin/env bash
# The SDK version matrix: tests/compat (create, commands, files, terminal, list, pause,
# connect, timeout, kill) run by each pinned `e2b` Python release, each in its own venv under
# target/sdk-matrix, against one `warren serve` with the namespace runtime. Prints one line per
# release and fails if any release fails.
#
#   scripts/sdk-matrix.sh                  # the releases below
#   scripts/sdk-matrix.sh 2.45.1 1.11.1@domain   # just these
#
# Releases before 2.21 reach sandboxes only by host name (`<port>-<id>.<domain>`): `@domain`
# runs them against the server in domain mode (HTTPS on 127.0.0.1:443, E2B_DOMAIN and the
# server's CA only; tests/compat/conftest.py), see docs/compatibility.md.
set -euo pipefail
cd "$(dirname "$0")/.."

RELEASES=("$@")
if [ ${#RELEASES[@]} -eq 0 ]; then
  RELEASES=(2.63.0 2.45.1 2.20.3@domain 2.0.2@domain 1.11.1@domain)
fi

failed=()
for release in "${RELEASES[@]}"; do
  v=${release%@domain}
  domain=0
  [ "$v" != "$release" ] && domain=1
  venv="target/sdk-matrix/e2b-$v"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "e2b==$v" -r tests/compat/requirements.txt
  echo "--- e2b $release"
  if WARREN_COMPAT_DOMAIN=$domain WARREN_E2E_RUNTIME=ns WARREN_BIN="${WARREN_BIN:-$PWD/target/release/warren}" \
      WARREN_E2E_DATA_DIR="${WARREN_E2E_DATA_DIR:-/var/lib/warren}" \
      "$venv/bin/python" -m pytest tests/compat -q -p no:cacheprovider; then
    echo "e2b $release: passed"
  else
    echo "e2b $release: FAILED"
    failed+=("$release")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed releases: ${failed[*]}"
  exit 1
fi

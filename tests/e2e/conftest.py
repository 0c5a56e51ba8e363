"""The end-to-end suite: one `warren serve` (namespace runtime unless WARREN_E2E_RUNTIME says
otherwise; needs root) for the session, the unmodified E2B SDK pointed at it.

The harness and its environment (WARREN_BIN, WARREN_E2E_DATA_DIR, WARREN_E2E_RUNTIME,
WARREN_REQUIRE_ALL, ...) are in tests/support/warren.py; tests import what they need from
`support.warren` (pytest.ini puts tests/ on the import path).
"""

from support.fixtures import _registry, api, outcome_within, registry, server  # noqa: F401 (fixtures)

"""The SDK version matrix: one flow (create, commands, files, terminal, list, pause, connect,
timeout, kill) run by each pinned `e2b` Python release against one `warren serve` (the e2e
suite's harness). `scripts/sdk-matrix.sh` makes a venv per release and runs this suite in it.

WARREN_BIN, WARREN_E2E_DATA_DIR and WARREN_E2E_RUNTIME (default `ns`) as in tests/e2e.
"""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_spec = importlib.util.spec_from_file_location(
    "warren_e2e_conftest", os.path.join(ROOT, "tests", "e2e", "conftest.py")
)
_e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_e2e)

# The e2e suite's session-wide server, reused as it is.
server = _e2e.server
_registry = _e2e._registry
api = _e2e.api

"""Starts one `warren serve` for the session (the e2e suite's `Server`), makes sure the
code-interpreter-v1 image is built (with visible progress: the first build takes minutes), and
points the unmodified e2b-code-interpreter SDK at it through E2B_API_URL / E2B_SANDBOX_URL.

WARREN_BIN: the `warren` binary (default target/release/warren).
WARREN_E2E_DATA_DIR: data dir to reuse (keeps built template images between runs).
WARREN_E2E_RUNTIME, WARREN_REQUIRE_ALL: as in tests/e2e (default runtime `ns`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEMPLATE = "code-interpreter-v1"

# Reuse the e2e suite's server harness rather than a second copy of it.
_spec = importlib.util.spec_from_file_location(
    "warren_e2e_conftest", os.path.join(ROOT, "tests", "e2e", "conftest.py")
)
_e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_e2e)
API_KEY = _e2e.API_KEY
# The e2e suite's bounded wait for "X cuts a stream" tests, reused as it is.
outcome_within = _e2e.outcome_within


def _build_template(data_dir: str, name: str = TEMPLATE) -> None:
    """`warren template build`, its progress on the terminal."""
    binary = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
    # Written to the real stderr, past pytest's capture, so a first build shows its progress.
    out = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")
    out.write(f"\nbuilding (or finding) template {name} in {data_dir} ...\n")
    out.flush()
    subprocess.run(
        [binary, "template", "build", name, "--data-dir", data_dir],
        check=True, stdout=out, stderr=out,
    )
    out.close()


@pytest.fixture(scope="session")
def server():
    _e2e.require("root (the server's runtimes create namespaces, cgroups and network slots)", os.geteuid() == 0)
    keep = os.environ.get("WARREN_E2E_DATA_DIR")
    data_dir = keep or tempfile.mkdtemp(prefix="warren-interp-")
    os.makedirs(data_dir, exist_ok=True)
    _build_template(data_dir)
    srv = _e2e.Server(data_dir)
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url)
    srv.start()
    yield srv
    try:
        for s in requests.get(srv.url + "/v2/sandboxes", headers={"X-API-KEY": API_KEY}, timeout=10).json():
            requests.delete(f"{srv.url}/sandboxes/{s['sandboxID']}", headers={"X-API-KEY": API_KEY}, timeout=30)
    finally:
        srv.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def build_template(server):
    """Builds (or finds) another catalog template in the server's data dir; the server
    finds the image there at the first create."""
    return lambda name: _build_template(server.data_dir, name)


def _create():
    from e2b_code_interpreter import Sandbox

    # No template argument: the SDK's default alias is code-interpreter-v1.
    return Sandbox.create(timeout=300, request_timeout=300)


@pytest.fixture(scope="module")
def shared(server):
    """One sandbox for the tests that do not break anything."""
    sbx = _create()
    yield sbx
    sbx.kill()


@pytest.fixture
def fresh(server):
    """A sandbox of its own, for tests that kill kernels or the server."""
    sbx = _create()
    yield sbx
    sbx.kill()

"""Starts one `warren serve` for the session (the shared harness's `Server`, tests/support),
makes sure the code-interpreter-v1 image is built (with visible progress: the first build takes
minutes), and points the unmodified e2b-code-interpreter SDK at it through E2B_API_URL /
E2B_SANDBOX_URL.

WARREN_BIN: the `warren` binary (default target/release/warren).
WARREN_E2E_DATA_DIR: data dir to reuse (keeps built template images between runs).
WARREN_E2E_RUNTIME, WARREN_REQUIRE_ALL: as in tests/e2e (default runtime `ns`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import requests

# The bounded wait for "X cuts a stream" tests, shared with tests/e2e.
from support.fixtures import outcome_within  # noqa: F401 (fixture)
from support.warren import API_KEY, Server, point_sdk_at, require_root, session_data_dir, warren_bin

TEMPLATE = "code-interpreter-v1"


def _build_template(data_dir: str, name: str = TEMPLATE) -> None:
    """`warren template build`, its progress on the terminal."""
    # Written to the real stderr, past pytest's capture, so a first build shows its progress.
    out = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")
    out.write(f"\nbuilding (or finding) template {name} in {data_dir} ...\n")
    out.flush()
    subprocess.run(
        [warren_bin(), "template", "build", name, "--data-dir", data_dir],
        check=True, stdout=out, stderr=out,
    )
    out.close()


@pytest.fixture(scope="session")
def server():
    require_root()
    path, temporary = session_data_dir("warren-interp-")
    _build_template(path)
    srv = Server(path)
    point_sdk_at(srv)
    srv.start()
    yield srv
    try:
        for s in requests.get(srv.url + "/v2/sandboxes", headers={"X-API-KEY": API_KEY}, timeout=10).json():
            requests.delete(f"{srv.url}/sandboxes/{s['sandboxID']}", headers={"X-API-KEY": API_KEY}, timeout=30)
    finally:
        srv.stop()
        if temporary:
            shutil.rmtree(path, ignore_errors=True)


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

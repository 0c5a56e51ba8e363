"""The security suite: one test per threat-model finding that can be shown from outside, with
the official E2B SDK and raw HTTP against one `warren serve` (the shared harness,
tests/support).

WARREN_BIN, WARREN_E2E_DATA_DIR, WARREN_E2E_RUNTIME (default `ns`) and WARREN_REQUIRE_ALL as in
tests/e2e. Every network request goes to the server on loopback or stays inside the sandbox.
"""

from __future__ import annotations

import contextlib
import shlex

import pytest
import requests

from support.fixtures import _registry, api, registry, server  # noqa: F401 (fixtures)
from support.warren import Server


@pytest.fixture
def sbx(server):
    from e2b import Sandbox

    s = Sandbox.create(timeout=300, request_timeout=300)
    yield s
    s.kill()


def sh(sbx, cmd: str, root: bool = False, timeout: int = 60) -> str:
    """stdout of `cmd` in the sandbox (stderr folded in); never raises on a non-zero exit."""
    from e2b import CommandExitException

    try:
        r = sbx.commands.run(f"{cmd} 2>&1", user="root" if root else "user", timeout=timeout)
        return r.stdout
    except CommandExitException as e:
        return e.stdout


def serve_in_sandbox(sbx, port: int) -> None:
    """Starts a web server on `port` inside the sandbox and waits until it answers there."""
    sbx.commands.run(
        f"cd /tmp && python3 -m http.server {port} --bind 0.0.0.0 >/dev/null 2>&1",
        background=True,
    )
    sbx.commands.run(
        "for i in $(seq 100); do python3 -c "
        + shlex.quote(
            f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')"
        )
        + " 2>/dev/null && exit 0; sleep 0.1; done; exit 1",
        timeout=30,
    )


def proxy_get(server, sbx_id: str, port: int, headers: dict | None = None) -> requests.Response:
    h = {"E2b-Sandbox-Id": sbx_id, "E2b-Sandbox-Port": str(port)}
    h.update(headers or {})
    return requests.get(server.url + "/", headers=h, timeout=30)


@contextlib.contextmanager
def restarted_with(server, *flags: str):
    """The shared server's data dir and port, served for a while by a server started with
    `flags` on top of the defaults; the shared server is back afterwards."""
    server.stop()
    srv = Server(server.data_dir, flags)
    srv.port, srv.url = server.port, server.url
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()
        server.start()

"""Starts one `warren serve` (namespace runtime, needs root) for the session and points the
unmodified E2B SDK at it through E2B_API_URL and E2B_SANDBOX_URL (both the one listener).

WARREN_BIN: the `warren` binary (default target/release/warren).
WARREN_E2E_DATA_DIR: data dir to reuse (keeps built template images between runs).
WARREN_E2E_RUNTIME: the server's `--runtime` (default `auto`; `vm` runs every sandbox as a
QEMU microVM fork, under TCG on hosts without usable KVM).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
API_KEY = "e2e-test-key-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir: str, extra_args: tuple[str, ...] = ()):
        self.data_dir = data_dir
        # More `warren serve` flags, for suites that test one (after the defaults below).
        self.extra_args = tuple(extra_args)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = open(os.path.join(data_dir, "serve.log"), "ab")

    def start(self) -> None:
        binary = os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))
        env = dict(os.environ, WARREN_API_KEY=API_KEY, WARREN_LOG="info")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir,
             "--runtime", os.environ.get("WARREN_E2E_RUNTIME", "auto"), "--max-sandboxes", "40",
             *self.extra_args],
            env=env, stdout=self.log, stderr=self.log,
        )
        # The first start builds the base template image before listening (minutes).
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren serve exited with {self.proc.returncode}; see {self.data_dir}/serve.log")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"warren serve {' '.join(self.extra_args)} did not become healthy")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def server():
    if os.geteuid() != 0:
        pytest.skip("the namespace runtime needs root")
    keep = os.environ.get("WARREN_E2E_DATA_DIR")
    data_dir = keep or tempfile.mkdtemp(prefix="warren-e2e-")
    os.makedirs(data_dir, exist_ok=True)
    srv = Server(data_dir)
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url)
    srv.start()
    # The first create may build the base template image (minutes); do it once up front.
    from e2b import Sandbox
    Sandbox.create(timeout=60, request_timeout=900).kill()
    yield srv
    # Leave nothing running: kill every sandbox this server still knows.
    try:
        for s in requests.get(srv.url + "/v2/sandboxes", headers={"X-API-KEY": API_KEY}, timeout=10).json():
            requests.delete(f"{srv.url}/sandboxes/{s['sandboxID']}", headers={"X-API-KEY": API_KEY}, timeout=30)
    finally:
        srv.stop()
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def api(server):
    """Raw REST helper for bad-input tests."""
    s = requests.Session()
    s.headers["X-API-KEY"] = API_KEY
    s.base = server.url  # type: ignore[attr-defined]
    return s

"""Fixtures of the agent conformance suite.

The suite drives a real `warren-agent` with the official, unmodified E2B Python SDK in debug
mode (no control plane: `debug=True` + `sandbox_url=<agent>` makes `Sandbox.create()` a local
no-op that points every envd call at the agent).

Environment:
  WARREN_AGENT_BIN          agent binary to start (default: target/debug/warren-agent)
  WARREN_AGENT_URL          use an already running agent instead of starting one
                            (e.g. the agent inside a real sandbox); nothing is started then
  WARREN_AGENT_SECURED_URL  with WARREN_AGENT_ACCESS_TOKEN: an already running agent that
                            requires that access token; without them (and without
                            WARREN_AGENT_URL) a second local agent is started with
                            --access-token; with WARREN_AGENT_URL alone, secured tests skip
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, Optional

import pytest
import requests

from e2b import AsyncSandbox, Sandbox

from _helpers import q
from support.warren import require

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_AGENT_BIN = REPO_ROOT / "target" / "debug" / "warren-agent"
DEFAULT_USER = "user"
STARTUP_TIMEOUT = 20.0


@dataclass
class Agent:
    url: str
    token: Optional[str] = None
    proc: Optional[subprocess.Popen] = None
    log_path: Optional[str] = None

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_default_user() -> None:
    """The agent runs commands as `user`; make sure the account exists on a local test host."""
    if subprocess.run(["id", DEFAULT_USER], capture_output=True).returncode == 0:
        return
    if os.geteuid() != 0:
        pytest.exit(
            f"Unix account {DEFAULT_USER!r} is missing and the suite is not root; "
            f"run: useradd -m -s /bin/bash {DEFAULT_USER}",
            returncode=2,
        )
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", DEFAULT_USER], check=True)


def _agent_bin() -> Path:
    path = Path(os.environ.get("WARREN_AGENT_BIN", str(DEFAULT_AGENT_BIN)))
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.exit(
            f"agent binary not found or not executable: {path}\n"
            f"build it with `cargo build -p warren-agent` in {REPO_ROOT}, "
            f"or set WARREN_AGENT_BIN (or WARREN_AGENT_URL to use a running agent)",
            returncode=2,
        )
    return path


def _start_agent(token: Optional[str] = None) -> Agent:
    _ensure_default_user()
    binary = _agent_bin()
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="warren-agent-", suffix=".log", delete=False)
    args = [str(binary), "--listen", f"127.0.0.1:{port}", "--default-user", DEFAULT_USER]
    if token:
        args += ["--access-token", token]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_AGENT_")}
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    agent = Agent(url=f"http://127.0.0.1:{port}", token=token, proc=proc, log_path=log.name)

    deadline = time.monotonic() + STARTUP_TIMEOUT
    last_error = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.exit(
                f"agent exited with status {proc.returncode} during startup:\n{agent.log_tail()}",
                returncode=2,
            )
        try:
            r = requests.get(f"{agent.url}/health", timeout=1)
            if r.status_code == 204:
                return agent
            last_error = f"GET /health -> {r.status_code}"
        except requests.RequestException as e:
            last_error = str(e)
        time.sleep(0.05)
    _stop_agent(agent)
    pytest.exit(
        f"agent did not answer GET /health with 204 within {STARTUP_TIMEOUT}s "
        f"({last_error}):\n{agent.log_tail()}",
        returncode=2,
    )


def _stop_agent(agent: Agent) -> None:
    proc = agent.proc
    if proc is not None and proc.poll() is None:
        proc.terminate()  # signals exactly this PID
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    if agent.log_path and not os.environ.get("WARREN_AGENT_KEEP_LOG"):
        try:
            os.unlink(agent.log_path)
        except FileNotFoundError:
            pass


@pytest.fixture(scope="session")
def agent() -> Iterator[Agent]:
    """The agent under test (no access token)."""
    url = os.environ.get("WARREN_AGENT_URL")
    if url:
        yield Agent(url=url.rstrip("/"))
        return
    a = _start_agent()
    try:
        yield a
    finally:
        _stop_agent(a)


@pytest.fixture(scope="session")
def secured_agent() -> Iterator[Agent]:
    """An agent that requires an access token (`X-Access-Token` or a URL signature)."""
    url = os.environ.get("WARREN_AGENT_SECURED_URL")
    token = os.environ.get("WARREN_AGENT_ACCESS_TOKEN")
    if url and token:
        yield Agent(url=url.rstrip("/"), token=token)
        return
    # An agent elsewhere (WARREN_AGENT_URL) comes with its secured twin, or these tests cannot run.
    require(
        "WARREN_AGENT_SECURED_URL and WARREN_AGENT_ACCESS_TOKEN next to WARREN_AGENT_URL",
        not os.environ.get("WARREN_AGENT_URL"),
    )
    a = _start_agent(token="tok-" + secrets.token_hex(16))
    try:
        yield a
    finally:
        _stop_agent(a)


def debug_opts(url: str) -> dict:
    """SDK options that point a debug-mode sandbox at one envd (no control plane)."""
    return {"debug": True, "sandbox_url": url, "api_key": "test"}


@pytest.fixture
def sandbox(agent: Agent) -> Sandbox:
    return Sandbox.create(**debug_opts(agent.url))


@pytest.fixture
async def async_sandbox(agent: Agent) -> AsyncSandbox:
    return await AsyncSandbox.create(**debug_opts(agent.url))


@pytest.fixture
def workdir(agent: Agent) -> Iterator[str]:
    """A fresh directory owned by the default user; removed (as root) afterwards.

    Created and removed through `commands.run` so that it does not depend on the filesystem
    service under test.
    """
    sbx = Sandbox.create(**debug_opts(agent.url))
    path = sbx.commands.run("mktemp -d /tmp/warren-agent-test-XXXXXXXX").stdout.strip()
    assert path.startswith("/tmp/warren-agent-test-"), path
    try:
        yield path
    finally:
        # Cleanup is not under test: one retry keeps a flaky connection from leaving litter.
        for attempt in range(2):
            try:
                sbx.commands.run(f"rm -rf {q(path)}", user="root")
                break
            except Exception:
                if attempt:
                    raise


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:12]


# ---------------------------------------------------------------------------------------------
# A minimal stand-in for the control plane, so that the SDK's normal (non-debug) create path
# hands the sandbox an envd access token, exactly as Warren's control plane will.
# ---------------------------------------------------------------------------------------------


class _FakeControlPlane(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, envd_token: str):
        super().__init__(("127.0.0.1", 0), _ControlPlaneHandler)
        self.envd_token = envd_token

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ControlPlaneHandler(BaseHTTPRequestHandler):
    server: _FakeControlPlane

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _json(self, status: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/v2/sandboxes":
            self._json(
                201,
                {
                    "templateID": req.get("templateID", "base"),
                    "sandboxID": "warrensecured",
                    "clientID": "warren",
                    "envdVersion": "0.6.13",
                    "envdAccessToken": self.server.envd_token,
                },
            )
        else:
            self._json(404, {"code": 404, "message": f"no route {self.path}"})

    def do_DELETE(self) -> None:
        self.send_response(204)
        self.end_headers()


@pytest.fixture(scope="session")
def control_plane(secured_agent: Agent) -> Iterator[_FakeControlPlane]:
    server = _FakeControlPlane(secured_agent.token or "")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def secured_sandbox(secured_agent: Agent, control_plane: _FakeControlPlane) -> Sandbox:
    """A sandbox created through the SDK's regular path; it carries the envd access token."""
    sbx = Sandbox.create(
        api_key="test",
        api_url=control_plane.url,
        sandbox_url=secured_agent.url,
        debug=False,
    )
    assert sbx._envd_access_token == secured_agent.token
    return sbx

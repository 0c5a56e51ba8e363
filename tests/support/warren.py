"""The harness every Python suite shares (tests/e2e, security, interpreter, dashboard, compat,
agent) and benches/interp_bench.py: `warren serve` started for a session, with the unmodified
E2B SDK pointed at it through E2B_API_URL and E2B_SANDBOX_URL (both the one listener).
Plain code; the fixtures over it are in `support.fixtures`.

WARREN_BIN: the `warren` binary (default target/release/warren).
WARREN_E2E_DATA_DIR: data dir to reuse (keeps built template images between runs).
WARREN_E2E_RUNTIME: the server's `--runtime` (default `ns`, so the namespace runtime is tested
end to end on a KVM host too; `vm` runs every sandbox as a QEMU microVM fork, under TCG on hosts
without usable KVM; `auto` lets the server choose).
WARREN_E2E_LOG: the server's WARREN_LOG (default `info`).
WARREN_REQUIRE_ALL=1: a test that needs something this host lacks fails instead of skipping
(docs/testing.md; scripts/test.sh sets it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from typing import Iterator

import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# E2B's format (`e2b_` + 40 hex digits): newer SDKs refuse other keys before sending them.
API_KEY = "e2b_0123456789abcdef0123456789abcdef01234567"


def require(what: str, ok: bool) -> None:
    """The one rule for a test that needs something the host lacks (docs/testing.md): skipped
    with the reason, or, under WARREN_REQUIRE_ALL=1, failed with it."""
    if ok:
        return
    if os.environ.get("WARREN_REQUIRE_ALL") == "1":
        pytest.fail(f"WARREN_REQUIRE_ALL=1 but this test cannot run here: needs {what}", pytrace=False)
    pytest.skip(f"needs {what}")


def require_root() -> None:
    """What every suite that starts a server needs."""
    require("root (the server's runtimes create namespaces, cgroups and network slots)", os.geteuid() == 0)


def same_on_every_runtime(why: str) -> None:
    """Tiering of the suite: a test of control-plane or build logic that does not depend on
    the runtime (the same code runs for both) runs with `ns` only; under the vm runtime, where
    every template build costs minutes of emulation, it is skipped with this reason. Tests of
    what a runtime does (export, snapshots, start commands, pulled images) run on both."""
    if os.environ.get("WARREN_E2E_RUNTIME", "ns") == "vm":
        pytest.skip(f"runtime-independent, tested with ns: {why}")


def slow_on_vm(why: str) -> None:
    """Tiering of the suite: a test whose runtime part another vm test covers but which costs
    minutes of emulation under the vm runtime (large writes, multi-step builds) runs with `vm`
    only in the slow tier (WARREN_SLOW=1, docs/testing.md); with `ns` it always runs. The
    default run skips it under vm with this reason, so the whole test command stays inside
    CI's limit."""
    if os.environ.get("WARREN_E2E_RUNTIME", "ns") == "vm" and os.environ.get("WARREN_SLOW") != "1":
        pytest.skip(f"slow tier under vm (WARREN_SLOW=1): {why}")


def warren_bin() -> str:
    """The `warren` binary under test (WARREN_BIN)."""
    return os.environ.get("WARREN_BIN", os.path.join(ROOT, "target", "release", "warren"))


def session_data_dir(prefix: str) -> tuple[str, bool]:
    """The session's data dir and whether it is temporary: WARREN_E2E_DATA_DIR (kept), or a new
    directory named `prefix`... (the caller removes it after the session)."""
    keep = os.environ.get("WARREN_E2E_DATA_DIR")
    path = keep or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(path, exist_ok=True)
    return path, not keep


def point_sdk_at(srv: Server) -> None:
    """The E2B SDK (and CLI) in this process and its children talk to `srv`."""
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerExited(RuntimeError):
    """`warren serve` ended before it answered /health."""


class Server:
    def __init__(self, data_dir: str, extra_args: tuple[str, ...] = (), runtime: str | None = None):
        self.data_dir = data_dir
        self.runtime = runtime or os.environ.get("WARREN_E2E_RUNTIME", "ns")
        # More `warren serve` flags, for suites that test one (after the defaults below).
        self.extra_args = tuple(extra_args)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = open(os.path.join(data_dir, "serve.log"), "ab")

    def start(self) -> None:
        env = dict(os.environ, WARREN_API_KEY=API_KEY, WARREN_LOG=os.environ.get("WARREN_E2E_LOG", "info"))
        self.log.flush()
        started_at = os.path.getsize(self.log.name)
        self.proc = subprocess.Popen(
            [warren_bin(), "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir,
             "--runtime", self.runtime, "--max-sandboxes", "40",
             # A volume owns its size on the data disk: the SDK's volumes (which name no size)
             # get 1 GiB here, not 10, so the suites fit a test machine's free disk.
             "--volume-size-mb", "1024",
             *self.extra_args],
            env=env, stdout=self.log, stderr=self.log,
        )
        # The first start builds the base template image before listening (minutes).
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerExited(
                    f"warren serve exited with {self.proc.returncode}; the end of {self.data_dir}/serve.log:\n"
                    + self._log_since(started_at)
                )
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"warren serve {' '.join(self.extra_args)} did not become healthy")

    def _log_since(self, offset: int, limit: int = 4000) -> str:
        """What this start wrote to serve.log (its last `limit` characters): the reason a
        start failed, shown where the failure is reported (a CI log has no data dir)."""
        with open(self.log.name, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")[-limit:]

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


def _end_sandboxes_of(srv: Server) -> None:
    """Starts `srv` (on a data dir of another runtime's leftovers), kills every running or
    paused sandbox its key sees, and stops it."""
    srv.start()
    try:
        h = {"X-API-KEY": API_KEY}
        listed = requests.get(srv.url + "/v2/sandboxes?state=running,paused&limit=100", headers=h, timeout=30)
        for s in listed.json():
            requests.delete(f"{srv.url}/sandboxes/{s['sandboxID']}", headers=h, timeout=60)
    finally:
        srv.stop()


def _template_ids(url: str) -> set[str]:
    r = requests.get(url + "/templates", headers={"X-API-KEY": API_KEY}, timeout=30)
    r.raise_for_status()
    return {t["templateID"] for t in r.json()}


@contextlib.contextmanager
def session_server(registry) -> Iterator[Server]:
    """The session's shared server (the `server` fixture of tests/e2e, security, dashboard and
    compat), the SDK pointed at it. `registry` (a `support.registry.Registry`, or None where
    the host has none) is the server's mirror of Docker Hub. Afterwards nothing the session
    made is left: sandboxes, and the volumes and templates it created."""
    require_root()
    path, temporary = session_data_dir("warren-e2e-")
    # Docker Hub names resolve to the local registry, which is the only one a test may reach.
    mirror = (
        ("--registry-mirror", f"docker.io={registry.url}", "--registry-insecure", registry.host)
        if registry is not None
        else ()
    )
    srv = Server(path, mirror)
    point_sdk_at(srv)
    try:
        srv.start()
    except ServerExited as first:
        # A reused data dir may hold sandboxes of the other runtime, left by a run of the vm
        # suite that was cut off: the server refuses to start over them and names the runtime
        # that must end them, which is done here as an operator would. Any other failure is
        # retried once, loudly (the step before this suite may still be releasing what a
        # server takes at start): the failed start's log stays in the warning summary.
        warnings.warn(f"warren serve failed its first start; starting it again. {first}")
        other = re.search(r"start it with --runtime (\w+) to keep them", str(first))
        if other:
            _end_sandboxes_of(Server(path, mirror, runtime=other.group(1)))
        else:
            time.sleep(5)
        srv.start()
    # The first create may build the base template image (minutes); do it once up front, over
    # raw HTTP so that suites run by any SDK release (tests/compat) share this server.
    try:
        r = requests.post(
            srv.url + "/v2/sandboxes",
            headers={"X-API-KEY": API_KEY},
            json={"templateID": "base", "timeout": 60},
            timeout=900,
        )
        r.raise_for_status()
        requests.delete(
            srv.url + "/sandboxes/" + r.json()["sandboxID"], headers={"X-API-KEY": API_KEY}, timeout=60
        )
    except BaseException:
        srv.stop()
        raise
    templates_before = _template_ids(srv.url)
    volumes_before = {v["volumeID"] for v in requests.get(srv.url + "/volumes", headers={"X-API-KEY": API_KEY}, timeout=10).json()}
    yield srv
    # Leave nothing running: kill every sandbox this server still knows (paused ones too).
    # A reused data dir (WARREN_E2E_DATA_DIR) also loses the templates this session built and
    # their cached build steps, or every run would leave gigabytes of images behind.
    try:
        h = {"X-API-KEY": API_KEY}
        listed = requests.get(srv.url + "/v2/sandboxes?state=running,paused&limit=100", headers=h, timeout=10)
        for s in listed.json():
            requests.delete(f"{srv.url}/sandboxes/{s['sandboxID']}", headers=h, timeout=30)
        for v in requests.get(srv.url + "/volumes", headers=h, timeout=10).json():
            if v["volumeID"] not in volumes_before:
                requests.delete(f"{srv.url}/volumes/{v['volumeID']}", headers=h, timeout=30)
        for tid in _template_ids(srv.url) - templates_before:
            requests.delete(f"{srv.url}/templates/{tid}", headers=h, timeout=60)
        requests.post(srv.url + "/v1/templates/prune", headers=h, timeout=300)
    finally:
        srv.stop()
        if temporary:
            shutil.rmtree(path, ignore_errors=True)


def outcome_within(seconds: float, call):
    """Runs `call` in a thread and returns what ended it within `seconds`: the exception it
    raised, or ("returned", value); None when it still runs then (the thread is left behind as
    a daemon)."""
    box: list = []

    def run():
        try:
            box.append(("returned", call()))
        except BaseException as e:  # noqa: BLE001 - what ended the call is the result
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return box[0] if box else None

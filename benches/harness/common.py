"""Shared pieces: statistics, results, the `warren serve` process, the mounted base rootfs."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import requests

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
API_KEY = "bench-key-0123456789abcdef0123"
MIB = 1024 * 1024
ENVD_PORT = 49983


# ---------------------------------------------------------------------------------------------
# statistics and results
# ---------------------------------------------------------------------------------------------


def percentile(samples: List[float], p: float) -> float:
    """Linear interpolation between closest ranks (p in 0..1)."""
    s = sorted(samples)
    if not s:
        return float("nan")
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Metric:
    scenario: str
    name: str
    unit: str
    samples: List[float]
    baseline: Optional[str] = None  # name of another metric of the same scenario
    plot: bool = True
    note: str = ""

    def summary(self) -> Dict[str, float]:
        s = self.samples
        return {
            "n": len(s),
            "median": percentile(s, 0.5),
            "p90": percentile(s, 0.9),
            "p99": percentile(s, 0.99),
            "max": max(s) if s else float("nan"),
            "min": min(s) if s else float("nan"),
        }


@dataclass
class Results:
    metrics: List[Metric] = field(default_factory=list)
    notes: Dict[str, List[str]] = field(default_factory=dict)

    def add(self, m: Metric) -> Metric:
        self.metrics.append(m)
        s = m.summary()
        base = ""
        b = self.find(m.scenario, m.baseline) if m.baseline else None
        if b and b.samples and s["n"]:
            bm = b.summary()["median"]
            base = f"  baseline {bm:.3f} {b.unit}  ratio {s['median'] / bm:.2f}x" if bm else ""
        if s["n"]:
            print(
                f"  [{m.scenario}] {m.name:<44} n={s['n']:<4} median={s['median']:9.3f} {m.unit}"
                f"  p99={s['p99']:9.3f}{base}",
                flush=True,
            )
        return m

    def note(self, scenario: str, text: str) -> None:
        print(f"  [{scenario}] note: {text}", flush=True)
        self.notes.setdefault(scenario, []).append(text)

    def find(self, scenario: str, name: str) -> Optional[Metric]:
        for m in self.metrics:
            if m.scenario == scenario and m.name == name:
                return m
        return None

    def by_scenario(self, scenario: str) -> List[Metric]:
        return [m for m in self.metrics if m.scenario == scenario and m.samples]


def time_calls(fn: Callable[[], object], iterations: int, warmup: int, scale: float = 1000.0) -> List[float]:
    """Runs fn warmup times (discarded), then iterations times; returns durations (ms)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * scale)
    return out


# ---------------------------------------------------------------------------------------------
# warren serve
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `warren serve` on a free loopback port; stopped by its own PID only."""

    def __init__(self, binary: str, data_dir: str, log_path: str, max_sandboxes: int,
                 runtime: str = "ns", extra_args: Optional[List[str]] = None):
        self.binary = binary
        self.extra_args = list(extra_args or [])
        self.runtime = runtime
        self.data_dir = data_dir
        self.log_path = log_path
        self.max_sandboxes = max_sandboxes
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.url = ""
        self.session = requests.Session()
        self.session.headers["X-API-KEY"] = API_KEY

    def start(self, lock_wait: float = 900.0, port: Optional[int] = None) -> None:
        """Starts the server on `port` (a restart keeps its clients' URL), else a free one."""
        deadline = time.monotonic() + lock_wait
        while True:
            try:
                self._start_once(port)
                return
            except LockBusy as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gave up waiting for the network prefix lock: {e}") from None
                print(f"  warren serve could not take the network prefix lock ({e}); retrying in 10 s", flush=True)
                time.sleep(10)

    def _start_once(self, port: Optional[int] = None) -> None:
        # Another `warren serve` (or a network test) holding the prefix lock: wait, do not
        # start beside it (a start reattaches or reaps the sandboxes recorded in the data dir).
        lock = "/run/warren-net/warren.lock"
        if os.path.exists(lock):
            with open(lock, "rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    raise LockBusy(f"{lock} is held by another process") from None
        port = port or free_port()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        log = open(self.log_path, "ab")
        start_offset = log.tell()
        env = dict(os.environ, WARREN_API_KEY=API_KEY, WARREN_LOG=os.environ.get("WARREN_LOG", "warn"))
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", self.data_dir,
             "--runtime", self.runtime, "--max-sandboxes", str(self.max_sandboxes), *self.extra_args],
            env=env, stdout=log, stderr=log,
        )
        # A first start may build the base image (and, for vm, the guest kernel and snapshot).
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(self.log_path, "rb") as f:
                    f.seek(start_offset)
                    tail = f.read().decode(errors="replace")[-2000:]
                self.proc = None
                if "lock" in tail.lower():
                    raise LockBusy(tail.strip().splitlines()[-1] if tail.strip() else "lock")
                raise RuntimeError(f"warren serve exited; log {self.log_path}:\n{tail}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    with open(self.log_path, "rb") as f:
                        f.seek(start_offset)
                        text = f.read().decode(errors="replace")
                    if "network pool did not start" in text:
                        self.stop()
                        raise LockBusy("network pool did not start (prefix lock taken)")
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("warren serve did not become healthy")

    def kill_all(self, ids: List[str]) -> None:
        """Kills the sandboxes this run created (and only those)."""
        seen = set()
        for sid in list(ids):
            seen.add(sid)
            with contextlib.suppress(Exception):
                self.session.delete(f"{self.url}/sandboxes/{sid}", timeout=60)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # this PID only
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class LockBusy(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# base rootfs, mounted read-only for the bwrap baselines
# ---------------------------------------------------------------------------------------------


def base_image(data_dir: str) -> str:
    images = sorted(glob.glob(os.path.join(data_dir, "images", "base-*", "rootfs.erofs")), key=os.path.getmtime)
    if not images:
        raise RuntimeError(f"no base image under {data_dir}/images (start `warren serve` once to build it)")
    return images[-1]


@contextlib.contextmanager
def mounted_rootfs(data_dir: str):
    mnt = tempfile.mkdtemp(prefix="warren-bench-rootfs-")
    subprocess.run(["mount", "-t", "erofs", "-o", "ro", base_image(data_dir), mnt], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", mnt], check=False)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def bwrap_cmd(root: str, *cmd: str) -> List[str]:
    return ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", root, "/",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", *cmd]


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cgroup_dir(sandbox_id: str) -> Optional[str]:
    """The sandbox's cgroup: v1 pids hierarchy, else the v2 unified one."""
    for base in ("/sys/fs/cgroup/pids/warren", "/sys/fs/cgroup/warren", "/sys/fs/cgroup/unified/warren"):
        d = os.path.join(base, sandbox_id)
        if os.path.isfile(os.path.join(d, "cgroup.procs")):
            return d
    return None


def cgroup_pids(d: str) -> List[int]:
    pids = []
    for dirpath, _dirs, files in os.walk(d):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.procs")) as f:
                pids += [int(x) for x in f.read().split()]
    return pids


def cgroup_layout() -> str:
    fs = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout.strip()
    return "v2 (unified)" if fs == "cgroup2fs" else f"v1 ({fs} with per-controller hierarchies)"


def meminfo() -> Dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0])
    return out

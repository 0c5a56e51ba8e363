#!/usr/bin/env python3
"""Guest-agent micro-benchmarks through the official E2B Python SDK and raw HTTP.

Prints numbers, asserts nothing:
  * round trip of `commands.run("true")` through the SDK, and of the same Start call
    hand-written as a Connect envelope over one kept-alive HTTP/1.1 connection (http.client);
  * upload/download throughput of one file through the SDK (`files.write` / `files.read`)
    and through raw `POST/GET /files`, beside a local `cp` of the same file in the same run.

Usage (from the repo root, after `cargo build -p warren-agent`):
  .venv/bin/python benches/agent_bench.py            # defaults: about a minute
  .venv/bin/python benches/agent_bench.py --smoke    # seconds
  .venv/bin/python benches/agent_bench.py --url http://127.0.0.1:49983   # a running agent
Without --url (or WARREN_AGENT_URL) it starts WARREN_AGENT_BIN (default
target/debug/warren-agent) on a free localhost port and stops it afterwards.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Callable, List, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# agent process
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_agent() -> tuple[subprocess.Popen, str]:
    binary = Path(os.environ.get("WARREN_AGENT_BIN", REPO_ROOT / "target/debug/warren-agent"))
    if not binary.is_file():
        sys.exit(f"agent binary not found: {binary} (run `cargo build -p warren-agent`)")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "--listen", f"127.0.0.1:{port}", "--default-user", "user"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"agent exited with status {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health")
            if conn.getresponse().status == 204:
                return proc, url
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    sys.exit("agent did not become healthy")


def stop_agent(proc: subprocess.Popen) -> None:
    proc.terminate()  # this PID only
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# ---------------------------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------------------------


def percentile(samples: List[float], p: float) -> float:
    s = sorted(samples)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def time_calls(fn: Callable[[], None], iterations: int, warmup: int) -> List[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def report_latency(name: str, samples: List[float]) -> None:
    ms = [s * 1000 for s in samples]
    print(
        f"  {name:<34} n={len(ms):<5} median={statistics.median(ms):8.3f} ms"
        f"  p90={percentile(ms, 0.9):8.3f} ms  min={min(ms):8.3f} ms"
    )


def best_of(fn: Callable[[], None], repeats: int) -> float:
    """Fastest of `repeats` runs (seconds): the least disturbed one."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------------------------------------
# raw Connect Start over one kept-alive HTTP/1.1 connection
# ---------------------------------------------------------------------------------------------


class RawConnect:
    """Start calls as hand-written Connect envelopes; `process` is the ProcessConfig to run."""

    def __init__(self, url: str, process: dict):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.conn: Optional[http.client.HTTPConnection] = None
        self.reconnects = 0
        msg = json.dumps({"process": process, "stdin": False}).encode()
        self.body = struct.pack(">BI", 0, len(msg)) + msg
        self.headers = {
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Content-Length": str(len(self.body)),
        }

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            self.conn.connect()
            self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.conn

    def run(self) -> None:
        for attempt in range(2):
            conn = self._connect()
            try:
                conn.request("POST", "/process.Process/Start", self.body, self.headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                # The server closed the kept-alive connection; count it and retry once.
                conn.close()
                self.conn = None
                self.reconnects += 1
                if attempt:
                    raise
        if resp.status != 200 or b'"end"' not in data:
            raise RuntimeError(f"unexpected Start answer {resp.status}: {data[-200:]!r}")
        if resp.getheader("connection", "").lower() == "close":
            conn.close()
            self.conn = None
            self.reconnects += 1


# ---------------------------------------------------------------------------------------------
# file transfer
# ---------------------------------------------------------------------------------------------


def make_file(path: str, size: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, MIB)
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())


def raw_upload(url: str, local: str, remote: str) -> None:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600, blocksize=MIB)
    size = os.path.getsize(local)
    with open(local, "rb") as f:
        conn.request(
            "POST",
            "/files?" + urllib.parse.urlencode({"path": remote}),
            body=f,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            encode_chunked=False,
        )
        resp = conn.getresponse()
        data = resp.read()
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"POST /files -> {resp.status}: {data[:200]!r}")


def raw_download(url: str, remote: str, expected: int, accept_encoding: str = "identity") -> None:
    """Reads the body as sent (compressed or not); checks the size only for identity."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    conn.request(
        "GET",
        "/files?" + urllib.parse.urlencode({"path": remote}),
        headers={"Accept-Encoding": accept_encoding},
    )
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"GET /files -> {resp.status}: {resp.read()[:200]!r}")
    got = 0
    while True:
        chunk = resp.read(MIB)
        if not chunk:
            break
        got += len(chunk)
    conn.close()
    if resp.getheader("content-encoding") in (None, "identity") and got != expected:
        raise RuntimeError(f"downloaded {got} bytes, expected {expected}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("WARREN_AGENT_URL"), help="running agent")
    ap.add_argument("--iterations", type=int, default=100, help="timed round trips per variant")
    ap.add_argument("--warmup", type=int, default=10, help="untimed round trips first")
    ap.add_argument(
        "--size-mib",
        type=int,
        default=32,
        help="transfer file size in MiB (the full measurement is --size-mib 256; the default "
        "keeps a run near a minute with a debug build, whose gzip of SDK downloads is slow)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="transfers per variant (best kept)")
    ap.add_argument("--tmpdir", default=tempfile.gettempdir(), help="where the local file goes")
    ap.add_argument("--smoke", action="store_true", help="tiny counts, to check the script runs")
    args = ap.parse_args()
    if args.smoke:
        args.iterations, args.warmup, args.size_mib, args.repeats = 5, 1, 4, 1

    from e2b import Sandbox  # imported late so --help works without the venv

    proc = None
    url = args.url
    if not url:
        proc, url = start_agent()
    try:
        sbx = Sandbox.create(debug=True, sandbox_url=url, api_key="bench")
        print(f"agent: {url}")

        # ---- round trips -----------------------------------------------------------------
        print(f"\ncommands.run('true') round trip ({args.iterations} iterations, {args.warmup} warm-up):")
        sdk = time_calls(lambda: sbx.commands.run("true"), args.iterations, args.warmup)
        report_latency("SDK commands.run", sdk)
        raw = RawConnect(url, {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]})
        raw_samples = time_calls(raw.run, args.iterations, args.warmup)
        report_latency("raw Connect Start (keep-alive)", raw_samples)
        direct = RawConnect(url, {"cmd": "/bin/true"})
        report_latency(
            "raw Start of /bin/true (no shell)", time_calls(direct.run, args.iterations, args.warmup)
        )
        for r in (raw, direct):
            if r.reconnects:
                print(f"  note: the agent closed the kept-alive connection {r.reconnects} times")
        print(
            f"  SDK/raw median ratio: {statistics.median(sdk) / statistics.median(raw_samples):.2f}"
        )

        # ---- throughput ------------------------------------------------------------------
        size = args.size_mib * MIB
        print(f"\nfile transfer of {args.size_mib} MiB (best of {args.repeats}):")
        tmp = tempfile.mkdtemp(prefix="warren-bench-", dir=args.tmpdir)
        remote_dir = f"/tmp/warren-bench-{uuid.uuid4().hex[:8]}"
        remote = f"{remote_dir}/payload.bin"
        try:
            src = os.path.join(tmp, "payload.bin")
            make_file(src, size)
            dst = os.path.join(tmp, "copy.bin")

            def local_cp() -> None:
                subprocess.run(["cp", src, dst], check=True)
                os.unlink(dst)

            def sdk_up() -> None:
                with open(src, "rb") as f:
                    sbx.files.write(remote, f)

            def sdk_down() -> None:
                got = 0
                with sbx.files.read(remote, format="stream") as stream:
                    for chunk in stream:
                        got += len(chunk)
                if got != size:
                    raise RuntimeError(f"SDK download returned {got} bytes")

            results = {"local cp": best_of(local_cp, args.repeats)}
            for name, fn in (
                ("SDK files.write (octet-stream)", sdk_up),
                ("SDK files.read (stream)", sdk_down),
                ("raw POST /files", lambda: raw_upload(url, src, remote)),
                ("raw GET /files (identity)", lambda: raw_download(url, remote, size)),
                (
                    "raw GET /files (gzip, deflate)",
                    lambda: raw_download(url, remote, size, "gzip, deflate"),
                ),
            ):
                try:
                    results[name] = best_of(fn, args.repeats)
                except Exception as e:  # keep going: a missing endpoint should not hide the rest
                    print(f"  {name:<34} FAILED: {type(e).__name__}: {str(e)[:160]}")
            cp_time = results["local cp"]
            for name, secs in results.items():
                ratio = "" if name == "local cp" else f"  {secs / cp_time:6.2f}x local cp"
                print(f"  {name:<34} {secs:8.3f} s  {size / MIB / secs:9.1f} MiB/s{ratio}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                sbx.commands.run(f"rm -rf {remote_dir}", user="root")
            except Exception:
                pass
    finally:
        if proc is not None:
            stop_agent(proc)


if __name__ == "__main__":
    main()

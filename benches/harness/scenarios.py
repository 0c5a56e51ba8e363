"""The scenarios. Each takes a Ctx and adds Metrics to ctx.results; baselines are measured in
the same run, on the same machine, right beside the figure they qualify."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from .persist import scenario_fork, scenario_pause
from .common import (API_KEY, ENVD_PORT, MIB, Metric, Results, Server, bwrap_cmd, cgroup_dir,
                     cgroup_pids, meminfo, mounted_rootfs, percentile, pss_kib, time_calls)


@dataclass
class Ctx:
    server: Server
    results: Results
    smoke: bool
    data_dir: str
    idle_count: int
    max_idle: bool
    max_idle_cap: int
    idle_latency_limit_ms: float
    tmpdir: str
    created: List[str]  # every sandbox id we created, for the finally-block cleanup
    lock: threading.Lock


# ---------------------------------------------------------------------------------------------
# sandbox helpers
# ---------------------------------------------------------------------------------------------


def sdk_create(ctx: Ctx, **kw):
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=600, request_timeout=120, **kw)
    with ctx.lock:
        ctx.created.append(sbx.sandbox_id)
    return sbx


def kill(ctx: Ctx, sid: str) -> None:
    with contextlib.suppress(Exception):
        ctx.server.session.delete(f"{ctx.server.url}/sandboxes/{sid}", timeout=60)


def kill_many(ctx: Ctx, ids: List[str]) -> None:
    with ThreadPoolExecutor(max_workers=16) as ex:
        list(ex.map(lambda s: kill(ctx, s), ids))


def connect_body(process: dict) -> bytes:
    msg = json.dumps({"process": process, "stdin": False}).encode()
    return struct.pack(">BI", 0, len(msg)) + msg


TRUE_PROCESS = {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]}  # what commands.run("true") sends


class RawStart:
    """Connect Start calls through the server's proxy over one kept-alive connection."""

    def __init__(self, url: str, sandbox_id: str, token: Optional[str], process: dict):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.body = connect_body(process)
        self.headers = {
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "Content-Length": str(len(self.body)),
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
            "Authorization": "Basic dXNlcjo=",  # user "user", as the SDK sends
        }
        if token:
            self.headers["X-Access-Token"] = token
        self.conn: Optional[http.client.HTTPConnection] = None

    def run(self) -> None:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                self.conn.connect()
                import socket
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self.conn.request("POST", "/process.Process/Start", self.body, self.headers)
                resp = self.conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        if resp.status != 200 or b'"end"' not in data:
            raise RuntimeError(f"unexpected Start answer {resp.status}: {data[-300:]!r}")
        if (resp.getheader("connection") or "").lower() == "close":
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        if self.conn:
            self.conn.close()


def raw_create(ctx: Ctx, session) -> Tuple[str, Optional[str]]:
    r = session.post(f"{ctx.server.url}/v2/sandboxes",
                     json={"templateID": "base", "timeout": 600, "secure": True}, timeout=120)
    if r.status_code != 201:
        raise RuntimeError(f"POST /v2/sandboxes -> {r.status_code}: {r.text[:300]}")
    body = r.json()
    with ctx.lock:
        ctx.created.append(body["sandboxID"])
    return body["sandboxID"], body.get("envdAccessToken")


# ---------------------------------------------------------------------------------------------
# create
# ---------------------------------------------------------------------------------------------


def scenario_create(ctx: Ctx) -> None:
    import requests
    res, S = ctx.results, "create"
    n1, rounds10, rounds50, warm = (3, 1, 1, 1) if ctx.smoke else (30, 3, 2, 3)
    levels = [(1, n1), (3, 1)] if ctx.smoke else [(1, n1), (10, rounds10), (50, rounds50)]

    # Baselines: a local process spawn and a bwrap spawn of the same rootfs.
    res.add(Metric(S, "baseline: local spawn of `true`", "ms",
                   time_calls(lambda: subprocess.run(["true"], check=True), n1 * 2, warm)))
    with mounted_rootfs(ctx.data_dir) as root:
        cmd = bwrap_cmd(root, "/bin/true")
        res.add(Metric(S, "baseline: bwrap spawn of the rootfs (/bin/true)", "ms",
                       time_calls(lambda: subprocess.run(cmd, check=True), n1 * 2, warm),
                       baseline="baseline: local spawn of `true`"))
    bw = "baseline: bwrap spawn of the rootfs (/bin/true)"

    def sdk_once() -> Tuple[float, str]:
        t0 = time.perf_counter()
        sbx = sdk_create(ctx)
        sbx.commands.run("true")
        return (time.perf_counter() - t0) * 1000, sbx.sandbox_id

    local = threading.local()

    def raw_once() -> Tuple[float, str]:
        if not hasattr(local, "session"):
            local.session = requests.Session()
            local.session.headers["X-API-KEY"] = API_KEY
        t0 = time.perf_counter()
        sid, token = raw_create(ctx, local.session)
        rs = RawStart(ctx.server.url, sid, token, TRUE_PROCESS)
        rs.run()
        dt = (time.perf_counter() - t0) * 1000
        rs.close()
        return dt, sid

    def burst(once, count: int, conc: int) -> Tuple[List[Tuple[float, str]], List[Exception]]:
        with ThreadPoolExecutor(max_workers=conc) as ex:
            futs = [ex.submit(once) for _ in range(count)]
            out, errs = [], []
            for f in futs:
                try:
                    out.append(f.result())
                except Exception as e:  # noqa: BLE001 - counted and reported, not hidden
                    errs.append(e)
        return out, errs

    for label, once in (("SDK", sdk_once), ("raw HTTP", raw_once)):
        # warm-up (discarded): a few sequential creates
        ids = [once()[1] for _ in range(warm)]
        kill_many(ctx, ids)
        for conc, reps in levels:
            samples: List[float] = []
            failures, attempts, last_err = 0, 0, ""
            if conc > 1:
                # A burst of this size first (discarded), as a host serving such bursts has
                # seen: the runtime sizes what it prepares ahead by recent demand.
                out, _ = burst(once, conc, conc)
                kill_many(ctx, [s for _, s in out])
            client_cpu: List[float] = []
            host_cpu: List[float] = []
            for rep in range(reps if conc > 1 else 1):
                wait_for_prepared(ctx, conc)
                count = n1 if conc == 1 else conc
                before = CpuClock()
                out, errs = burst(once, count, conc)
                client, host = before.spent()
                client_cpu.append(client / count)
                host_cpu.append(host / count)
                samples += [d for d, _ in out]
                failures += len(errs)
                attempts += count
                if errs:
                    last_err = str(errs[-1])[:200]
                kill_many(ctx, [s for _, s in out])
            note = f"{failures} of {attempts} failed: {last_err}" if failures else ""
            if failures:
                res.note(S, f"{label} concurrency {conc}: {note}")
            res.add(Metric(S, f"{label} create + run('true'), concurrency {conc}", "ms", samples,
                           baseline=bw, note=note))
            # Where the CPU goes: this process's (the client's) and the whole host's, per create.
            # With `CPUS` cores, a burst whose cores are busy throughout takes about
            # count * host CPU / CPUS: when its p99 is there, only less CPU per create helps,
            # and the client's share is no server's to cut.
            res.add(Metric(S, f"{label} client CPU per create, concurrency {conc}", "ms",
                           client_cpu, plot=False))
            res.add(Metric(S, f"{label} host CPU per create (all processes), concurrency {conc}",
                           "ms", host_cpu, plot=False))
            if conc > 1:
                res.add(Metric(S, f"{label} burst of {conc}: host CPU / {CPUS} cores", "ms",
                               [c * conc / CPUS for c in host_cpu], plot=False))
    pool = prepared_pool(ctx)
    if pool and pool.get("ready"):
        wait_for_prepared(ctx, levels[-1][0])
        pool = prepared_pool(ctx)
        res.add(Metric(S, "prepared sandboxes waiting after the last burst", "count",
                       [pool["ready"]]))
        res.add(Metric(S, "idle memory of one prepared sandbox (cgroup charge)", "MiB",
                       [pool["memory_bytes"] / pool["ready"] / MIB]))


CPUS = os.cpu_count() or 1
_TICK = os.sysconf("SC_CLK_TCK")


class CpuClock:
    """CPU spent since its creation: this process's (all threads, and children it waited for)
    and the host's (every core's busy time from /proc/stat), in milliseconds. Both count in
    clock ticks (10 ms), so one figure is only as good as the span it covers."""

    def __init__(self) -> None:
        self.client, self.host = self._now()

    @staticmethod
    def _now() -> Tuple[float, float]:
        t = os.times()
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        # user, nice, system, irq, softirq; not steal (the hypervisor's), and guest time is
        # already inside user.
        busy = sum(fields[:7]) - idle
        client = t.user + t.system + t.children_user + t.children_system
        return client * 1000, busy * 1000 / _TICK

    def spent(self) -> Tuple[float, float]:
        client, host = self._now()
        return client - self.client, host - self.host


def cpu_per_call(fn: Callable[[], None], n: int) -> Tuple[List[float], List[float]]:
    """The client's and the host's CPU (ms) of each of n calls."""
    client, host = [], []
    for _ in range(n):
        clock = CpuClock()
        fn()
        c, h = clock.spent()
        client.append(c)
        host.append(h)
    return client, host


def prepared_pool(ctx: Ctx) -> dict:
    """The server's sandboxes prepared ahead, from its `/metrics` (empty where it has none)."""
    text = ctx.server.session.get(ctx.server.url + "/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith('warren_prepared_sandboxes{state="ready"}'):
            out["ready"] = int(float(line.split()[-1]))
        elif line.startswith("warren_prepared_sandbox_target "):
            out["target"] = int(float(line.split()[-1]))
        elif line.startswith("warren_prepared_sandbox_memory_bytes "):
            out["memory_bytes"] = int(float(line.split()[-1]))
    return out


def wait_for_prepared(ctx: Ctx, want: int, limit: float = 60.0) -> None:
    """Until the server has `want` sandboxes prepared (or all its target), at most `limit` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        pool = prepared_pool(ctx)
        if not pool or pool.get("ready", 0) >= min(want, pool.get("target", 0)):
            return
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# command round trip
# ---------------------------------------------------------------------------------------------

ONE_MB_CMD = "head -c 1000000 /dev/zero | tr '\\0' a"


def scenario_command(ctx: Ctx) -> None:
    res, S = ctx.results, "command"
    n, n_mb, warm = (5, 3, 1) if ctx.smoke else (300, 50, 20)

    def local(cmd: str) -> Callable[[], None]:
        return lambda: subprocess.run(["/bin/bash", "-c", cmd], check=True, capture_output=True)

    res.add(Metric(S, "baseline: local spawn bash -c true", "ms", time_calls(local("true"), n, warm)))
    res.add(Metric(S, "baseline: local spawn printing 1 MB", "ms", time_calls(local(ONE_MB_CMD), n_mb, warm)))
    # What the SDK's command costs without the platform: the same login shell (`bash -l -c`,
    # the SDK's wrapper) of the same rootfs, its profile files included, as the same user,
    # spawned locally. The host's own login shell is no baseline: its profile is the host's.
    login = "baseline: local spawn bash -l -c true in the base rootfs (chroot, uid 1000)"
    # Timed by a shell inside the rootfs around each spawn, so neither `chroot` nor Python's
    # own spawn is in the figure: only fork, exec, the login shell's start and its exit.
    loop = (f"for i in $(seq {n + warm}); do s=$EPOCHREALTIME; /bin/bash -l -c true; "
            "e=$EPOCHREALTIME; echo \"$s $e\"; done")
    with mounted_rootfs(ctx.data_dir) as root:
        env = {"HOME": "/home/user", "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash",
               "LANG": "C.UTF-8", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        out = subprocess.run(["chroot", "--userspec=1000:1000", root, "/bin/bash", "-c", loop],
                             check=True, capture_output=True, text=True, env=env, cwd="/").stdout
    spans = [(float(b) - float(a)) * 1000.0 for a, b in (line.split() for line in out.splitlines())]
    res.add(Metric(S, login, "ms", spans[warm:]))

    sbx = sdk_create(ctx)
    try:
        run_true = time_calls(lambda: sbx.commands.run("true"), n, warm)
        res.add(Metric(S, "SDK commands.run('true')", "ms", run_true, baseline="baseline: local spawn bash -c true"))
        res.add(Metric(S, "SDK commands.run('true'), against the login shell", "ms", run_true, baseline=login,
                       plot=False, note="the same samples as the row above"))

        def big() -> None:
            out = sbx.commands.run(ONE_MB_CMD).stdout
            if len(out) < 1_000_000:
                raise RuntimeError(f"got {len(out)} bytes of output")

        res.add(Metric(S, "SDK commands.run printing 1 MB", "ms", time_calls(big, n_mb, warm),
                       baseline="baseline: local spawn printing 1 MB"))
        info = ctx.server.session.get(f"{ctx.server.url}/sandboxes/{sbx.sandbox_id}", timeout=30).json()
        rs = RawStart(ctx.server.url, sbx.sandbox_id, info.get("envdAccessToken") or _token(sbx), TRUE_PROCESS)
        res.add(Metric(S, "raw Connect Start 'true' (keep-alive)", "ms", time_calls(rs.run, n, warm),
                       baseline="baseline: local spawn bash -c true"))
        rs.close()

        def fresh() -> None:  # a new TCP connection per call (what a short-lived client does)
            r = RawStart(ctx.server.url, sbx.sandbox_id, info.get("envdAccessToken") or _token(sbx), TRUE_PROCESS)
            r.run()
            r.close()

        res.add(Metric(S, "raw Connect Start 'true' (new connection each)", "ms", time_calls(fresh, n, warm),
                       baseline="baseline: local spawn bash -c true"))
    finally:
        kill(ctx, sbx.sandbox_id)


def _token(sbx) -> Optional[str]:
    for attr in ("_envd_access_token", "envd_access_token"):
        v = getattr(sbx, attr, None)
        if v:
            return v
    return None


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------


def make_file(path: str, size: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, MIB)])
            left -= MIB


def scenario_files(ctx: Ctx) -> None:
    res, S = ctx.results, "files"
    sizes = [(1, 3, 1), (8, 2, 1)] if ctx.smoke else [(1, 30, 3), (256, 5, 1)]
    tmp = tempfile.mkdtemp(prefix="warren-bench-files-", dir=ctx.tmpdir)
    sbx = None
    try:
        sbx = sdk_create(ctx)
        for mib, n, warm in sizes:
            size = mib * MIB
            src, dst = os.path.join(tmp, "src.bin"), os.path.join(tmp, "dst.bin")
            make_file(src, size)
            remote = f"/tmp/bench-{mib}.bin"

            def cp() -> None:
                subprocess.run(["cp", src, dst], check=True)
                os.unlink(dst)

            base = f"baseline: local cp {mib} MiB"
            res.add(Metric(S, base, "ms", time_calls(cp, n, warm)))

            def up() -> None:
                with open(src, "rb") as f:
                    sbx.files.write(remote, f)

            def down() -> None:
                got = 0
                with sbx.files.read(remote, format="stream") as stream:
                    for chunk in stream:
                        got += len(chunk)
                if got != size:
                    raise RuntimeError(f"downloaded {got} bytes, expected {size}")

            res.add(Metric(S, f"SDK upload {mib} MiB", "ms", time_calls(up, n, warm), baseline=base))
            res.add(Metric(S, f"SDK download {mib} MiB", "ms", time_calls(down, n, warm), baseline=base))
            if mib >= 8:
                # The CPU each costs (client, whole host) against the copy's: a transfer that
                # keeps both cores busy cannot end before host CPU / CPUS.
                for what, fn in (("local cp", cp), ("SDK upload", up), ("SDK download", down)):
                    client, host = cpu_per_call(fn, n)
                    res.add(Metric(S, f"{what} {mib} MiB: client CPU", "ms", client, plot=False))
                    res.add(Metric(S, f"{what} {mib} MiB: host CPU (all processes)", "ms", host,
                                   plot=False))
            with contextlib.suppress(Exception):
                sbx.commands.run(f"rm -f {remote}")
            os.unlink(src)
    finally:
        if sbx is not None:
            kill(ctx, sbx.sandbox_id)
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# pty echo
# ---------------------------------------------------------------------------------------------


def scenario_pty(ctx: Ctx) -> None:
    from e2b import PtySize
    res, S = ctx.results, "pty"
    n, warm = (5, 2) if ctx.smoke else (200, 20)

    # Baseline: a local bash on a local pty.
    master, slave = pty.openpty()
    proc = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, env=dict(os.environ, PS1="$ ", TERM="xterm"))
    os.close(slave)
    try:
        def drain(timeout: float) -> bytes:
            out = b""
            while select.select([master], [], [], timeout)[0]:
                chunk = os.read(master, 65536)
                if not chunk:
                    break
                out += chunk
                timeout = 0.05
            return out

        drain(1.0)

        def local_clear() -> None:
            os.write(master, b"\x15")
            drain(0.05)

        def local_echo() -> None:
            os.write(master, b"a")
            got = b""
            while b"a" not in got:
                r, _, _ = select.select([master], [], [], 5)
                if not r:
                    raise RuntimeError("local pty did not echo")
                got += os.read(master, 4096)

        res.add(Metric(S, "baseline: local pty + bash echo", "ms", echo_loop(local_echo, local_clear, n, warm)))
    finally:
        proc.kill()
        proc.wait()
        os.close(master)

    sbx = sdk_create(ctx)
    try:
        buf = bytearray()
        cond = threading.Condition()

        def on_data(data: bytes) -> None:
            with cond:
                buf.extend(data)
                cond.notify_all()

        term = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
        reader = threading.Thread(target=lambda: _swallow(lambda: term.wait(on_pty=on_data)), daemon=True)
        reader.start()
        time.sleep(1.0)

        def remote_clear() -> None:
            sbx.pty.send_stdin(term.pid, b"\x15")
            time.sleep(0.05)

        def remote_echo() -> None:
            with cond:
                buf.clear()
            sbx.pty.send_stdin(term.pid, b"a")
            with cond:
                if not cond.wait_for(lambda: b"a" in buf, timeout=10):
                    raise RuntimeError("sandbox pty did not echo")

        res.add(Metric(S, "SDK pty echo (send_stdin -> on_data)", "ms", echo_loop(remote_echo, remote_clear, n, warm),
                       baseline="baseline: local pty + bash echo"))
        with contextlib.suppress(Exception):
            sbx.pty.kill(term.pid)
    finally:
        kill(ctx, sbx.sandbox_id)


def echo_loop(echo: Callable[[], None], clear: Callable[[], None], n: int, warm: int) -> List[float]:
    """Times echo() n times after warm discarded runs; clears the line every 40 keys, untimed."""
    out = []
    for i in range(warm + n):
        if i % 40 == 39:
            clear()
        t0 = time.perf_counter()
        echo()
        if i >= warm:
            out.append((time.perf_counter() - t0) * 1000)
    return out


def _swallow(fn: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        fn()


# ---------------------------------------------------------------------------------------------
# idle memory
# ---------------------------------------------------------------------------------------------


def sandbox_pss_mib(sid: str) -> Optional[float]:
    d = cgroup_dir(sid)
    if d is None:
        return None
    pids = cgroup_pids(d)
    if not pids:
        return None
    return sum(pss_kib(p) for p in pids) / 1024


def vm_pss_samples() -> List[float]:
    """PSS of each microVM of the host (one QEMU per cgroup under `warren-vm`), warm-pool VMs
    included: VM cgroups are named when the QEMU starts, before a sandbox claims it."""
    for base in ("/sys/fs/cgroup/pids/warren-vm", "/sys/fs/cgroup/warren-vm",
                 "/sys/fs/cgroup/unified/warren-vm"):
        if not os.path.isdir(base):
            continue
        out = []
        for name in sorted(os.listdir(base)):
            d = os.path.join(base, name)
            pids = cgroup_pids(d) if os.path.isfile(os.path.join(d, "cgroup.procs")) else []
            if pids:
                out.append(sum(pss_kib(p) for p in pids) / 1024)
        return out
    return []


def scenario_idle(ctx: Ctx) -> None:
    import requests
    res, S = ctx.results, "idle"
    target = 3 if ctx.smoke else ctx.idle_count
    cap = ctx.max_idle_cap if ctx.max_idle else target

    # Baseline: the same rootfs under bwrap running an idle `sleep` (bwrap + sleep processes).
    with mounted_rootfs(ctx.data_dir) as root:
        procs = [subprocess.Popen(bwrap_cmd(root, "/bin/sleep", "600")) for _ in range(min(target, 10))]
        try:
            time.sleep(1.0)
            samples = []
            for p in procs:
                kids = _descendants(p.pid)
                samples.append(sum(pss_kib(x) for x in [p.pid, *kids]) / 1024)
            res.add(Metric(S, "baseline: idle bwrap + sleep on the rootfs", "MiB", samples))
        finally:
            for p in procs:
                p.kill()
                p.wait()

    session = requests.Session()
    session.headers["X-API-KEY"] = API_KEY
    ids: List[str] = []
    stop_reason = f"reached the requested count ({cap})"
    total_kib = meminfo()["MemTotal"]
    rtt_at: Dict[int, float] = {}
    failures, last_err = 0, ""
    try:
        batch = 10 if ctx.smoke else 50
        while len(ids) < cap:
            want = min(batch, cap - len(ids))
            def one(_):
                try:
                    return raw_create(ctx, session)[0], None
                except Exception as e:  # noqa: BLE001 - counted; a limit is a result here
                    return None, e
            with ThreadPoolExecutor(max_workers=10) as ex:
                got = list(ex.map(one, range(want)))
            ids += [sid for sid, _ in got if sid]
            errs = [e for _, e in got if e]
            failures += len(errs)
            if errs:
                last_err = str(errs[-1])[:200]
            if len(errs) * 2 > want:  # most of a batch failed: that is the limit
                stop_reason = f"most creates failed at {len(ids)} sandboxes: {last_err}"
                break
            # Latency probe: a command round trip on the newest sandbox.
            from e2b import Sandbox
            probe = Sandbox.connect(ids[-1])
            lat = time_calls(lambda: probe.commands.run("true"), 10, 2)
            rtt_at[len(ids)] = percentile(lat, 0.5)
            used = 1 - meminfo()["MemAvailable"] / total_kib
            if ctx.max_idle and used >= 0.9:
                stop_reason = f"host memory use reached {used:.0%} at {len(ids)} sandboxes"
                break
            if ctx.max_idle and rtt_at[len(ids)] > ctx.idle_latency_limit_ms:
                stop_reason = (f"command round trip p50 {rtt_at[len(ids)]:.1f} ms exceeded "
                               f"{ctx.idle_latency_limit_ms} ms at {len(ids)} sandboxes")
                break
        time.sleep(2.0)  # let them settle
        if ctx.server.runtime == "vm":
            pss = vm_pss_samples()
            res.note(S, f"{len(pss)} QEMU processes measured: {len(ids)} idle sandboxes and the "
                        "warm pool's VMs waiting for a create")
            label = f"PSS per idle microVM ({len(ids)} idle + warm pool)"
        else:
            pss = [v for v in (sandbox_pss_mib(s) for s in ids) if v is not None]
            if len(pss) < len(ids):
                res.note(S, f"{len(ids) - len(pss)} sandboxes had no readable cgroup")
            label = f"PSS per idle sandbox ({len(ids)} idle)"
        res.add(Metric(S, label, "MiB", pss, baseline="baseline: idle bwrap + sleep on the rootfs"))
        res.add(Metric(S, "idle sandboxes held", "count", [float(len(ids))], plot=False,
                       note=stop_reason))
        res.note(S, f"stopped: {stop_reason}; host memory in use "
                    f"{1 - meminfo()['MemAvailable'] / total_kib:.0%}")
        if failures:
            res.note(S, f"{failures} sandbox creates failed along the way (last: {last_err})")
        res.note(S, "command round trip p50 (ms) by idle count: "
                    + ", ".join(f"{k}: {v:.1f}" for k, v in sorted(rtt_at.items())))
    finally:
        kill_many(ctx, ids)


def _descendants(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


SCENARIOS: Dict[str, Callable[[Ctx], None]] = {
    "create": scenario_create,
    "command": scenario_command,
    "files": scenario_files,
    "pty": scenario_pty,
    "idle": scenario_idle,
    "pause": scenario_pause,
    "fork": scenario_fork,
}

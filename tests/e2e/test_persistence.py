"""Pause, resume, snapshots and fork through the unmodified E2B SDK against `warren serve`
with a real runtime (`ns`, or `vm` with WARREN_E2E_RUNTIME=vm). Nothing a sandbox wrote
before an acknowledged pause may be lost, across server restarts and any number of resumes."""

from __future__ import annotations

import datetime
import os
import time
import uuid

import pytest
import requests
from e2b import Sandbox
from e2b.exceptions import (
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
    SandboxNotRunningException,
)

# Sizes around page and block boundaries, plus one larger than any write buffer.
SIZES = [0, 1, 511, 4095, 4096, 4097, 65537, 1024 * 1024 + 3, 24 * 1024 * 1024]

WRITE_FILES = r"""
set -e
mkdir -p /home/user/data/tree/a/b
cd /home/user/data
for n in {sizes}; do head -c $n /dev/urandom > f$n; done
for i in $(seq 1 200); do echo "small $i" > tree/a/b/s$i; done
head -c 100000 /dev/urandom > /tmp/in-tmp
echo first > rewritten && echo second > rewritten
echo gone > deleted && rm deleted
ln -s f4096 link
"""

# A process whose counter lives only in its memory; it reports it and its pid every tick.
COUNTER = (
    "python3 -c \"import os,time\n"
    "i=0\n"
    "while True:\n"
    "  i+=1\n"
    "  open('/tmp/counter.new','w').write(f'{os.getpid()} {i}')\n"
    "  os.replace('/tmp/counter.new','/tmp/counter')\n"
    "  time.sleep(0.05)\""
)


def _api(server, method, path, **kw):
    headers = {"X-API-KEY": os.environ["E2B_API_KEY"]}
    return requests.request(method, server.url + path, headers=headers, timeout=120, **kw)


def _checksums(sbx) -> dict[str, str]:
    r = sbx.commands.run(
        "cd /home/user/data && find . /tmp/in-tmp -type f | sort | xargs sha256sum && "
        "readlink link && cat rewritten && test ! -e deleted && echo no-deleted",
        timeout=120,
    )
    return {"out": r.stdout}


def _write_files(sbx) -> dict[str, str]:
    sbx.commands.run(WRITE_FILES.format(sizes=" ".join(map(str, SIZES))), timeout=120)
    # And one written through the agent's file API, never fsynced by anyone.
    payload = uuid.uuid4().bytes * 5000
    sbx.files.write("/home/user/data/via-sdk.bin", payload)
    sums = _checksums(sbx)
    assert "via-sdk.bin" in sums["out"] and "no-deleted" in sums["out"]
    assert sums["out"].count("\n") >= len(SIZES) + 200
    return sums


def _counter(sbx) -> tuple[int, int]:
    # The first read after a start may race the first tick.
    for _ in range(100):
        out = sbx.commands.run("cat /tmp/counter 2>/dev/null || true").stdout.split()
        if len(out) == 2:
            return int(out[0]), int(out[1])
        time.sleep(0.05)
    raise AssertionError("counter never reported")


def _runtime(server, sandbox_id: str) -> dict:
    """The sandbox's runtime as the API reports it: name and the modes it has."""
    return _api(server, "GET", f"/sandboxes/{sandbox_id}").json()["runtime"]


def _saved_dirs(server, runtime: str) -> tuple[str, str]:
    """Where the runtime keeps paused sandboxes and snapshots on the host."""
    base = server.data_dir if runtime == "ns" else os.path.join(server.data_dir, "vm-checkpoints")
    return os.path.join(base, "paused"), os.path.join(base, "snapshots")


def _wait_state(server, sandbox_id: str, state: str, limit: float = 120) -> dict:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        info = _api(server, "GET", f"/sandboxes/{sandbox_id}").json()
        if info.get("state") == state:
            return info
        time.sleep(0.2)
    raise AssertionError(f"sandbox {sandbox_id} never became {state}")


def test_pause_restart_resume_keeps_files_and_processes(server):
    sbx = Sandbox.create(timeout=600)
    try:
        sums = _write_files(sbx)
        sbx.commands.run(COUNTER, background=True)
        pid, before = _counter(sbx)

        assert sbx.pause() is True
        info = _api(server, "GET", f"/sandboxes/{sbx.sandbox_id}").json()
        assert info["state"] == "paused"
        assert info["pauseMode"] == "full"
        assert "full" in info["runtime"]["pauseModes"]
        listed = _api(server, "GET", "/v2/sandboxes", params={"state": "paused"}).json()
        assert sbx.sandbox_id in [s["sandboxID"] for s in listed]

        server.restart()

        again = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert again.is_running()
        assert _checksums(again) == sums
        pid_after, after = _counter(again)
        assert pid_after == pid, "the same process continues after a memory pause"
        assert after >= before, "the counter continues from its value at pause"
        _, later = _counter(again)
        assert later >= after
        time.sleep(0.3)
        assert _counter(again)[1] > after, "and keeps counting"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_second_and_tenth_resume(server):
    sbx = Sandbox.create(timeout=600)
    try:
        sums = _write_files(sbx)
        sbx.commands.run(COUNTER, background=True)
        pid, last = _counter(sbx)
        for i in range(10):
            sbx.commands.run(f"echo {i} > /home/user/round")
            assert Sandbox.pause(sbx.sandbox_id) is True
            if i == 4:
                server.restart()
            sbx = Sandbox.connect(sbx.sandbox_id, timeout=600)
            assert sbx.commands.run("cat /home/user/round").stdout.strip() == str(i)
            now_pid, value = _counter(sbx)
            assert now_pid == pid and value >= last, f"resume {i + 1}"
            last = value
        assert _checksums(sbx) == sums
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_filesystem_pause_keeps_files_not_processes(server):
    sbx = Sandbox.create(timeout=600, envs={"KEPT_ENV": "still-here"})
    try:
        sums = _write_files(sbx)
        sbx.commands.run(COUNTER, background=True)
        pid, _ = _counter(sbx)
        assert sbx.pause(mode="filesystem") is True
        info = _api(server, "GET", f"/sandboxes/{sbx.sandbox_id}").json()
        assert info["pauseMode"] == "filesystem"
        server.restart()
        again = Sandbox.connect(sbx.sandbox_id)
        assert _checksums(again) == sums
        r = again.commands.run(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone")
        assert r.stdout.strip() == "gone", "a filesystem pause does not keep processes"
        assert again.commands.run("echo $KEPT_ENV").stdout.strip() == "still-here"
        # And it can be paused and resumed again.
        assert again.pause() is True
        assert _checksums(Sandbox.connect(sbx.sandbox_id)) == sums
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_pause_twice_and_unknown(server):
    sbx = Sandbox.create()
    try:
        assert sbx.pause() is True
        assert sbx.pause() is False, "already paused is 409, which the SDK returns as False"
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.state.value == "paused"
        assert info.lifecycle is not None
        paused_at = datetime.datetime.now(datetime.timezone.utc)
        history = sbx.get_metrics()
        assert all(m.timestamp <= paused_at for m in history), "a paused sandbox is not sampled"
        time.sleep(1.1)
        assert [m.timestamp for m in sbx.get_metrics()] == [m.timestamp for m in history]
    finally:
        assert Sandbox.kill(sbx.sandbox_id) is True, "a paused sandbox can be killed"
    assert not Sandbox.kill(sbx.sandbox_id)
    with pytest.raises(NotFoundException):
        Sandbox.pause("nosuchsandbox")
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_snapshots_create_list_delete_and_create_from(server):
    sbx = Sandbox.create(timeout=600, envs={"FROM_PARENT": "1"}, metadata={"who": "parent"})
    children = []
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    try:
        sums = _write_files(sbx)
        snap = sbx.create_snapshot(name=name)
        assert snap.names == [name]
        assert sbx.is_running(), "the sandbox keeps running"
        sbx.commands.run("echo after-snapshot > /home/user/data/later")

        ids = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
        assert snap.snapshot_id in ids
        by_name = Sandbox.list_snapshots(name=name).next_items()
        assert [s.snapshot_id for s in by_name] == [snap.snapshot_id]

        child = Sandbox.create(snap.snapshot_id)
        children.append(child)
        r = child.commands.run("ls /home/user/data/later 2>&1 || true")
        assert "No such file" in r.stdout, "the child has the state at snapshot time"
        child.commands.run("rm /home/user/data/later 2>/dev/null; true")
        assert _checksums(child) == sums
        assert child.commands.run("echo $FROM_PARENT").stdout.strip() == "1"
        child.commands.run("echo child > /home/user/data/f0")
        assert sbx.commands.run("cat /home/user/data/f0").stdout == "", "the parent is untouched"

        # The name works as a template too, with a tag.
        children.append(Sandbox.create(f"{name}:default"))

        # Reusing the name replaces the older snapshot.
        snap2 = sbx.create_snapshot(name=name)
        assert snap2.snapshot_id != snap.snapshot_id
        ids = [s.snapshot_id for s in Sandbox.list_snapshots(name=name).next_items()]
        assert ids == [snap2.snapshot_id]

        unnamed = sbx.create_snapshot()
        assert Sandbox.delete_snapshot(unnamed.snapshot_id) is True
        assert Sandbox.delete_snapshot(unnamed.snapshot_id) is False
        with pytest.raises(SandboxException):
            Sandbox.create(unnamed.snapshot_id)

        # The runtime says which snapshots it takes: ns keeps files only, vm memory too.
        runtime = _runtime(server, sbx.sandbox_id)
        if runtime["name"] == "ns":
            assert runtime["snapshotModes"] == ["filesystem"]
            with pytest.raises(SandboxException, match="filesystem"):
                sbx.create_snapshot(mode="full")
        else:
            assert runtime["snapshotModes"] == ["full", "filesystem"]
            sbx.commands.run(COUNTER, background=True)
            pid, _ = _counter(sbx)
            full = sbx.create_snapshot(mode="full")
            from_full = Sandbox.create(full.snapshot_id)
            children.append(from_full)
            assert _counter(from_full)[0] == pid, "a full snapshot carries running processes"
            from_files = Sandbox.create(sbx.create_snapshot(mode="filesystem").snapshot_id)
            children.append(from_files)
            r = from_files.commands.run(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone")
            assert r.stdout.strip() == "gone", "a filesystem snapshot carries files only"
            Sandbox.delete_snapshot(full.snapshot_id)
        assert sbx.create_snapshot(mode="filesystem").snapshot_id
        assert Sandbox.delete_snapshot(snap2.snapshot_id) is True
    finally:
        for c in children:
            c.kill()
        sbx.kill()
        for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items():
            Sandbox.delete_snapshot(s.snapshot_id)


def test_fork_three_independent_children(server):
    parent = Sandbox.create(timeout=600, metadata={"role": "parent"}, envs={"INHERITED": "yes"})
    forks = []
    try:
        parent.files.write("/home/user/shared.txt", "from parent")
        forks = parent.fork(count=3, timeout=300)
        assert len(forks) == 3
        for f in forks:
            assert not isinstance(f, Exception), f
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 3 and parent.sandbox_id not in ids
        for i, f in enumerate(forks):
            assert f.files.read("/home/user/shared.txt") == "from parent"
            assert f.commands.run("echo $INHERITED").stdout.strip() == "yes"
            assert f.get_info().metadata["role"] == "parent"
            f.files.write("/home/user/mine.txt", f"child {i}")
        parent.files.write("/home/user/shared.txt", "parent changed")
        for i, f in enumerate(forks):
            assert f.files.read("/home/user/mine.txt") == f"child {i}", "children are independent"
            assert f.files.read("/home/user/shared.txt") == "from parent"
        assert not parent.files.exists("/home/user/mine.txt")
        assert parent.is_running()
    finally:
        for f in forks:
            if not isinstance(f, Exception):
                f.kill()
        parent.kill()


def test_on_timeout_pause_then_auto_resume_by_traffic(server):
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/home/user/keep.txt", "kept across auto pause")
        info = _wait_state(server, sbx.sandbox_id, "paused")
        assert info["lifecycle"] == {"autoResume": True, "onTimeout": "pause"}
        # Traffic through the proxy wakes it.
        assert sbx.files.read("/home/user/keep.txt") == "kept across auto pause"
        assert _api(server, "GET", f"/sandboxes/{sbx.sandbox_id}").json()["state"] == "running"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_on_timeout_pause_without_auto_resume_stays_paused(server):
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        sbx.files.write("/home/user/keep.txt", "kept")
        _wait_state(server, sbx.sandbox_id, "paused")
        with pytest.raises(SandboxNotRunningException):
            sbx.files.read("/home/user/keep.txt", request_timeout=30)
        assert Sandbox.connect(sbx.sandbox_id).files.read("/home/user/keep.txt") == "kept"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_bad_input(server):
    sbx = Sandbox.create()
    try:
        for count in (0, 101):
            with pytest.raises(InvalidArgumentException):
                sbx.fork(count=count)
            r = _api(server, "POST", f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": count})
            assert r.status_code == 400 and r.json()["code"] == 400
            assert "between 1 and 100" in r.json()["message"]
        r = _api(server, "POST", "/sandboxes/nosuchsandbox/fork", json={"count": 1})
        assert r.status_code == 404 and r.json()["code"] == 404
        with pytest.raises(NotFoundException):
            Sandbox.fork("nosuchsandbox")
        r = _api(server, "POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": "bad:name"})
        assert r.status_code == 400 and r.json()["code"] == 400
        if _runtime(server, sbx.sandbox_id)["name"] == "ns":
            r = _api(server, "POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"memory": True})
            assert r.status_code == 400 and 'mode="filesystem"' in r.json()["message"]
        # Snapshot ids are path-encoded by the SDK (`/` as %2F).
        r = _api(server, "DELETE", "/templates/team%2Fnothing%3Adefault")
        assert r.status_code == 404 and r.json()["code"] == 404
        assert Sandbox.delete_snapshot("team/nothing:default") is False
        r = _api(server, "GET", "/snapshots", params={"limit": "0"})
        assert r.status_code == 400
    finally:
        sbx.kill()


def test_saved_state_is_freed(server):
    """Killing a paused sandbox, deleting a snapshot and finishing a fork leave nothing of
    theirs on the host's disk."""
    sbx = Sandbox.create()
    paused_dir, snapshots_dir = _saved_dirs(server, _runtime(server, sbx.sandbox_id)["name"])
    forks = []
    try:
        sbx.commands.run("head -c 1000000 /dev/urandom > /home/user/blob")
        snap = sbx.create_snapshot()
        assert os.path.exists(os.path.join(snapshots_dir, snap.snapshot_id))
        before = set(os.listdir(snapshots_dir))
        forks = sbx.fork(count=2)
        assert all(not isinstance(f, Exception) for f in forks)
        # Deleted state is renamed away at once and removed in the background.
        deadline = time.monotonic() + 30
        while set(os.listdir(snapshots_dir)) != before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(os.listdir(snapshots_dir)) == before, "the fork's checkpoint is deleted"
        assert Sandbox.delete_snapshot(snap.snapshot_id)
        assert not os.path.exists(os.path.join(snapshots_dir, snap.snapshot_id))
        for mode in ("full", "filesystem"):
            victim = forks.pop()
            assert victim.pause(mode=mode)
            assert os.path.exists(os.path.join(paused_dir, victim.sandbox_id)), mode
            assert victim.kill()
            assert not os.path.exists(os.path.join(paused_dir, victim.sandbox_id)), mode
    finally:
        for f in forks:
            f.kill()
        sbx.kill()


def test_acknowledged_pause_survives_a_killed_server(server):
    """The pause's record is durable when it is acknowledged: SIGKILL the server right after."""
    sbx = Sandbox.create(timeout=600)
    try:
        sums = _write_files(sbx)
        for mode in ("filesystem", "full"):
            assert sbx.pause(mode=mode) is True
            server.proc.kill()
            server.proc.wait()
            server.start()
            info = _api(server, "GET", f"/sandboxes/{sbx.sandbox_id}").json()
            assert info["state"] == "paused" and info["pauseMode"] == mode
            sbx = Sandbox.connect(sbx.sandbox_id)
            assert _checksums(sbx) == sums, mode
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_concurrent_resumes(server):
    """Many connects to one paused sandbox resume it once; many requests through the proxy to
    an auto-resuming one all get answers."""
    from concurrent.futures import ThreadPoolExecutor

    sbx = Sandbox.create(timeout=600, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/home/user/x", "x")
        assert sbx.pause()
        path = f"/v2/sandboxes/{sbx.sandbox_id}/connect"
        codes = list(ThreadPoolExecutor(10).map(lambda _: _api(server, "POST", path, json={}).status_code, range(10)))
        assert sorted(codes) == [200] * 9 + [201], codes
        assert sbx.pause()
        reads = list(ThreadPoolExecutor(10).map(lambda _: sbx.files.read("/home/user/x"), range(10)))
        assert reads == ["x"] * 10
        assert _api(server, "GET", f"/sandboxes/{sbx.sandbox_id}").json()["state"] == "running"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_filesystem_resume_is_a_new_boot(server):
    """The boot id changes when the sandbox starts again from its files (a reboot), not when
    its memory was kept; programs that cache per boot (systemd-style tools, SDK tests) rely
    on it."""
    sbx = Sandbox.create(timeout=600)
    try:
        read = "cat /proc/sys/kernel/random/boot_id"
        first = sbx.commands.run(read).stdout.strip()
        assert len(first) == 36, first
        with open("/proc/sys/kernel/random/boot_id") as f:
            assert first != f.read().strip(), "the sandbox sees the host's boot id"
        assert sbx.pause() is True
        kept = Sandbox.connect(sbx.sandbox_id).commands.run(read).stdout.strip()
        assert kept == first, "a memory pause and resume is not a reboot"
        assert sbx.pause(mode="filesystem") is True
        rebooted = Sandbox.connect(sbx.sandbox_id).commands.run(read).stdout.strip()
        assert len(rebooted) == 36 and rebooted != first, (first, rebooted)
    finally:
        Sandbox.kill(sbx.sandbox_id)

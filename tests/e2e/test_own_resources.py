"""Inside a sandbox, the sandbox's own resources: `nproc`, `free`, `/proc/meminfo`,
`/proc/cpuinfo`, `/proc/stat`, `/proc/uptime`, `/sys/devices/system/cpu/online` and `df /`
describe its limits and use, not the host's. A VM shows its own by nature; the namespace
runtime binds LXCFS's files over procfs's (docs/runtime-ns.md, "Its own resources").

The sandboxes come from a template of 1 CPU and 384 MiB, which differs from the development
hosts (2 or more cores, gigabytes of memory) and from the `base` template (2 CPUs, 512 MiB).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid

import pytest
from e2b import Sandbox, Template

from support.warren import require, slow_on_vm

RUNTIME = os.environ.get("WARREN_E2E_RUNTIME", "ns")
CPUS = 1
MEMORY_MB = 384


def _host_meminfo_kib() -> int:
    with open("/proc/meminfo") as f:
        return int(next(l for l in f if l.startswith("MemTotal:")).split()[1])


@pytest.fixture(scope="module")
def small(server):
    # Before the build, so the default vm run skips the minutes of it too.
    slow_on_vm("a template build of its own (vm builds: test_templates.py, test_images.py)")
    if RUNTIME == "ns":
        require("lxcfs and /dev/fuse (scripts/setup.sh installs lxcfs)",
                shutil.which("lxcfs") is not None and os.path.exists("/dev/fuse"))
    # The test's own numbers must not be the host's, or it could pass on the host's files.
    assert os.cpu_count() > CPUS and _host_meminfo_kib() > 2 * MEMORY_MB * 1024
    name = f"own-res-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    # A fresh step, so the template (and under vm its snapshot) is made now: a VM's uptime
    # counts from its template's boot.
    tpl = Template().from_base_image().run_cmd(f"echo {uuid.uuid4().hex}")
    Template.build(tpl, name, cpu_count=CPUS, memory_mb=MEMORY_MB)
    return name, started


def sh(sb: Sandbox, cmd: str) -> str:
    return sb.commands.run(cmd, timeout=60).stdout.strip()


def meminfo_kib(sb: Sandbox, key: str) -> int:
    return int(sh(sb, f"awk '/^{key}:/ {{print $2}}' /proc/meminfo"))


def free_used_bytes(sb: Sandbox) -> tuple[int, int]:
    """`free -b`'s total and used memory."""
    mem = next(l for l in sh(sb, "free -b").splitlines() if l.startswith("Mem:")).split()
    return int(mem[1]), int(mem[2])


def assert_own_cpus_and_memory(sb: Sandbox) -> None:
    assert sh(sb, "nproc") == str(CPUS)
    assert sh(sb, "grep -c ^processor /proc/cpuinfo") == str(CPUS)
    assert sh(sb, "grep -c '^cpu[0-9]' /proc/stat") == str(CPUS)
    assert sh(sb, "cat /sys/devices/system/cpu/online") == "0"
    assert sh(sb, "python3 -c 'import os; print(os.cpu_count())'") == str(CPUS)
    total = meminfo_kib(sb, "MemTotal")
    # A VM's kernel keeps some of its memory for itself; a namespace sandbox's is the limit.
    assert MEMORY_MB * 1024 * 3 // 4 < total <= MEMORY_MB * 1024, total
    free_total, _ = free_used_bytes(sb)
    assert free_total == total * 1024, (free_total, total)


def test_a_sandbox_sees_its_own_cpus_memory_and_uptime(small):
    name, built = small
    asked = time.monotonic()
    sb = Sandbox.create(name, timeout=300)
    try:
        assert_own_cpus_and_memory(sb)
        uptime = float(sh(sb, "cut -d' ' -f1 /proc/uptime"))
        # The host has been up for hours; the sandbox since its start (a VM: since its
        # template's boot, which this test made).
        since = time.monotonic() - (asked if RUNTIME == "ns" else built)
        assert uptime < since + 5, (uptime, since)
        # /proc/stat's CPU times are the sandbox's: far less than the host's uptime on a CPU,
        # and they grow with a busy loop inside.
        def busy() -> float:
            user, nice, system = (int(x) for x in sh(sb, "head -1 /proc/stat").split()[1:4])
            return (user + nice + system) / os.sysconf("SC_CLK_TCK")

        before = busy()
        assert before < since + 5, (before, since)
        sh(sb, "timeout 3 sh -c 'while :; do :; done' || true")
        after = busy()
        assert after - before > 1.5, (before, after)
        if RUNTIME == "ns":
            assert after < time.monotonic() - asked + 5, after
        load = sh(sb, "cat /proc/loadavg").split()
        assert len(load) == 5 and "/" in load[3], load
        assert "Swap:" in sh(sb, "free -b")
        assert meminfo_kib(sb, "SwapTotal") == 0
    finally:
        sb.kill()


def test_memory_use_inside_shows_in_free(small):
    name, _ = small
    sb = Sandbox.create(name, timeout=300)
    try:
        _, before = free_used_bytes(sb)
        hog = 150 << 20
        # Bytes written, not just reserved: each page is touched.
        sb.commands.run(
            f"python3 -c \"import time; b = b'x' * {hog}; open('/tmp/hog-ready', 'w').close(); time.sleep(600)\"",
            background=True,
        )
        for _ in range(300):
            if sh(sb, "test -e /tmp/hog-ready && echo yes || true") == "yes":
                break
            time.sleep(0.1)
        _, during = free_used_bytes(sb)
        assert during - before > hog * 3 // 4, (before, during)
        assert meminfo_kib(sb, "MemAvailable") * 1024 < MEMORY_MB * (1 << 20) - hog // 2
    finally:
        sb.kill()


def test_disk_shows_the_sandbox_writable_layer(small):
    name, _ = small
    sb = Sandbox.create(name, timeout=300)
    try:
        host_root = shutil.disk_usage("/")

        def df():
            size, used = sh(sb, "df -B1 --output=size,used / | tail -1").split()
            return int(size), int(used)

        size, used = df()
        assert size < host_root.total, (size, host_root.total)
        sh(sb, "head -c 64M /dev/urandom > /home/user/blob && sync")
        _, after = df()
        assert after - used >= 60 << 20, (used, after)
    finally:
        sb.kill()


def test_pause_resume_snapshot_and_fork_keep_it(small):
    name, _ = small
    sb = Sandbox.create(name, timeout=300)
    children = []
    try:
        total = meminfo_kib(sb, "MemTotal")
        assert sb.pause() is True
        sb = Sandbox.connect(sb.sandbox_id, timeout=300)
        assert_own_cpus_and_memory(sb)
        if RUNTIME == "ns":
            # A filesystem pause ends the processes; the resumed sandbox is started again.
            assert sb.pause(mode="filesystem") is True
            sb = Sandbox.connect(sb.sandbox_id, timeout=300)
            assert_own_cpus_and_memory(sb)
            assert float(sh(sb, "cut -d' ' -f1 /proc/uptime")) < 60
        snap = sb.create_snapshot()
        children.append(Sandbox.create(snap.snapshot_id, timeout=300))
        children.extend(sb.fork(count=1, timeout=300))
        for child in children:
            assert meminfo_kib(child, "MemTotal") == total
            assert sh(child, "nproc") == str(CPUS)
            assert sh(child, "grep -c ^processor /proc/cpuinfo") == str(CPUS)
        Sandbox.delete_snapshot(snap.snapshot_id)
    finally:
        for child in children:
            child.kill()
        sb.kill()

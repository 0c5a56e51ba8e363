"""Namespace runtime confinement, shown from outside through the SDK (threat model H1, M1,
L10, L11). The Rust suites (crates/warren-runtime-ns/tests/confinement.rs,
crates/warren-host/tests/ns_ids.rs) cover the rest (H4, M2, M4, M7) with host-side checks.

Skipped, with the reason printed, on a server whose sandboxes are VMs (the server says which
runtime it runs in every sandbox's detail).
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import sh

# Every capability up to CAP_CHECKPOINT_RESTORE (40): what sandbox root held before.
FULL_SET = 0x1FFFFFFFFFF


@pytest.fixture
def ns_sbx(sbx, api):
    detail = api.get(f"{api.base}/sandboxes/{sbx.sandbox_id}", timeout=30).json()
    runtime = detail["runtime"]["name"]
    if runtime != "ns":
        pytest.skip(f"not a namespace sandbox (the server runs the {runtime} runtime)")
    return sbx


def test_h1_root_cannot_create_namespaces_mount_or_use_io_uring(ns_sbx):
    for cmd in ("unshare -n true", "unshare -U true", "unshare -m true"):
        out = sh(ns_sbx, f"{cmd}; echo rc=$?", root=True)
        assert "rc=0" not in out, f"{cmd}: {out}"
    out = sh(ns_sbx, "mkdir -p /mnt/x && mount -t tmpfs none /mnt/x; echo rc=$?", root=True)
    assert "rc=0" not in out, out
    errno = sh(ns_sbx, "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                       "l.syscall(425, 4, ctypes.create_string_buffer(120)); print(ctypes.get_errno())'")
    assert errno.strip() in ("1", "38"), errno  # EPERM or ENOSYS
    status = sh(ns_sbx, "grep CapBnd /proc/self/status", root=True)
    bounding = int(status.split()[1], 16)
    assert bounding & (1 << 21) == 0, f"CAP_SYS_ADMIN in the bounding set: {status}"
    assert bounding & (1 << 12) == 0, f"CAP_NET_ADMIN in the bounding set: {status}"
    assert bounding != FULL_SET
    # sudo still works, with the reduced set.
    assert sh(ns_sbx, "sudo -n id -u").strip() == "0"


def test_m1_sys_shows_no_sandbox_ids_and_no_host_links(ns_sbx, server):
    from e2b import Sandbox

    other = Sandbox.create(timeout=120, request_timeout=300)
    try:
        tree = sh(ns_sbx, "find /sys; cat /proc/self/cgroup", root=True, timeout=120)
        for sid in (ns_sbx.sandbox_id, other.sandbox_id):
            assert sid not in tree, f"/sys names sandbox {sid}"
        links = sh(ns_sbx, "ls /sys/class/net")
        assert "warren" not in links and "eth0" not in links, links
    finally:
        other.kill()


def test_l11_mountinfo_shows_no_host_paths(ns_sbx):
    mountinfo = sh(ns_sbx, "cat /proc/self/mountinfo")
    assert "/run/warren" not in mountinfo, mountinfo
    assert "/var/lib/warren" not in mountinfo, mountinfo
    assert sh(ns_sbx, "wc -c < /proc/keys").strip() == "0"


def test_l10_the_end_of_a_sandbox_is_recorded_with_its_reason(ns_sbx, server):
    sid = ns_sbx.sandbox_id
    log_path = os.path.join(server.data_dir, "serve.log")
    start = os.path.getsize(log_path)
    try:
        sh(ns_sbx, "kill -9 $(pgrep -x warren-agent | grep -vx 1)", root=True, timeout=10)
    except Exception:  # noqa: BLE001 - the agent running the command is what dies
        pass
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        if sid in text and ("exited 137" in text or "signaled" in text):
            return
        time.sleep(0.5)
    pytest.fail(f"the server log does not say how sandbox {sid} ended:\n{text[-3000:]}")

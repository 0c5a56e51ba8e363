"""A sandbox's disk is disk, through the unmodified E2B SDK on either runtime: a default
sandbox (512 MiB of memory, 2048 MiB of disk) keeps more files than its memory, a full disk
is "No space left on device" to a sandbox that lives on (and 507 to an upload), and a large
file comes through every pause, snapshot and fork with its checksum unchanged."""

from __future__ import annotations

import os

import pytest
from e2b import Sandbox
from e2b.exceptions import NotEnoughSpaceException

from support.warren import slow_on_vm

RUNTIME = os.environ.get("WARREN_E2E_RUNTIME", "ns")
MIB = 1 << 20


def _sh(sbx, cmd: str, timeout: float = 600) -> str:
    return sbx.commands.run(cmd, timeout=timeout).stdout.strip()


def _write(sbx, path: str, mib: int) -> str:
    """Writes `mib` MiB of non-repeating data (so no layer can store it compressed) and
    returns its checksum as read back from the disk."""
    return _sh(
        sbx,
        f"python3 -c \"import hashlib,os\nh=hashlib.sha256(os.urandom(32)).digest()\n"
        f"with open('{path}','wb') as f:\n"
        f"  for i in range({mib}):\n"
        f"    h=hashlib.sha256(h).digest(); f.write(h*32768)\" && sync && "
        f"sha256sum {path} | cut -d' ' -f1",
    )


def _sum(sbx, path: str) -> str:
    return _sh(sbx, f"sha256sum {path} | cut -d' ' -f1")


def test_a_default_sandbox_keeps_more_files_than_its_memory(server):
    slow_on_vm('writes more than its memory (vm disks: crates/warren-runtime-vm/tests/vm_persist.rs)')
    sbx = Sandbox.create(timeout=900)
    try:
        size_mib = int(_sh(sbx, "df -m --output=size / | tail -1"))
        assert 2000 <= size_mib <= 2100, f"a 2048 MiB disk shows {size_mib} MiB"
        memory_mib = int(_sh(sbx, "free -m | awk '/^Mem:/ {print $2}'"))
        assert memory_mib <= 600, memory_mib
        # 1.2 GiB: more than twice the sandbox's memory.
        sums = _write(sbx, "/home/user/big", 1228)
        assert len(sums) == 64, sums
        assert _sum(sbx, "/home/user/big") == sums
        assert sbx.is_running()

        # Past the disk's size: ENOSPC inside, and the sandbox answers.
        r = sbx.commands.run(
            "dd if=/dev/zero of=/home/user/fill bs=1M count=3072 2>&1 | head -n1; echo done",
            timeout=600,
        )
        assert "No space left on device" in r.stdout, r.stdout
        assert _sh(sbx, "echo alive") == "alive"
        # An upload that does not fit: 507, which the SDK raises as NotEnoughSpaceException.
        with pytest.raises(NotEnoughSpaceException):
            sbx.files.write("/home/user/upload.bin", os.urandom(16 * MIB))
        # Space freed is space again; nothing written before was lost.
        _sh(sbx, "rm -f /home/user/fill /home/user/upload.bin")
        sbx.files.write("/home/user/upload.bin", b"fits now")
        assert sbx.files.read("/home/user/upload.bin") == "fits now"
        assert _sum(sbx, "/home/user/big") == sums
    finally:
        sbx.kill()


def test_a_large_file_survives_pause_snapshot_and_fork(server):
    slow_on_vm('hundreds of MiB through pause, snapshot and fork (vm disks: vm_persist.rs)')
    sbx = Sandbox.create(timeout=900)
    children = []
    snapshots = []
    try:
        path = "/home/user/large"
        sums = _write(sbx, path, 700)
        assert sbx.pause() is True
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=900)
        assert _sum(sbx, path) == sums, "after a memory pause"
        if RUNTIME == "ns":
            assert sbx.pause(mode="filesystem") is True
            sbx = Sandbox.connect(sbx.sandbox_id, timeout=900)
            assert _sum(sbx, path) == sums, "after a filesystem pause"
        snap = sbx.create_snapshot()
        snapshots.append(snap.snapshot_id)
        children.append(Sandbox.create(snap.snapshot_id, timeout=900))
        children.extend(sbx.fork(count=1, timeout=900))
        for child in children:
            assert not isinstance(child, Exception), child
            assert _sum(child, path) == sums, f"in {child.sandbox_id}"
        # The children's disks are their own.
        _sh(children[0], f"rm {path}")
        assert _sum(sbx, path) == sums
        assert _sum(children[1], path) == sums
    finally:
        for child in children:
            if not isinstance(child, Exception):
                child.kill()
        sbx.kill()
        for s in snapshots:
            Sandbox.delete_snapshot(s)

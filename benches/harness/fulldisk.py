"""A data disk that fills up: `warren serve` on a small loop-mounted data dir, filled from outside
(as a log or a backup left on the disk would), must refuse what would write there with 507 and
the cause, keep its running sandboxes answering, and take everything again once the space is
freed, with no restart.

The data dir is a fresh ext4 image of `size_mib` with the main data dir's `images/` (and, for
the vm runtime, `vm/kernel/`) bind-mounted in: the base image and the guest kernel would not fit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
from typing import List

from .common import API_KEY, Server

MIB = 1024 * 1024


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@contextlib.contextmanager
def small_data_dir(main_data_dir: str, size_mib: int, wrong: List[str], shared=("images",)):
    """A data dir on an ext4 image of its own, holding the `shared` dirs of the main data dir;
    a mount the server left busy at the end is one of the things that went `wrong`."""
    work = tempfile.mkdtemp(prefix="warren-fulldisk-", dir="/var/tmp")
    image, data = os.path.join(work, "disk.img"), os.path.join(work, "data")
    os.makedirs(data)
    mounted: List[str] = []
    try:
        with open(image, "wb") as f:
            f.truncate(size_mib * MIB)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", image)
        _run("mount", "-o", "loop", image, data)
        mounted.append(data)
        for sub in shared:
            inside = os.path.join(data, sub)
            os.makedirs(inside)
            _run("mount", "--bind", os.path.join(main_data_dir, sub), inside)
            mounted.append(inside)
        yield data
    finally:
        for m in reversed(mounted):
            r = subprocess.run(["umount", m], capture_output=True, text=True)
            if r.returncode != 0:
                wrong.append(f"{m} stayed busy once the server stopped: {r.stderr.strip()}")
                subprocess.run(["umount", "-l", m], capture_output=True)
        with contextlib.suppress(OSError):
            os.remove(image)
        with contextlib.suppress(OSError):
            os.rmdir(data)
            os.rmdir(work)


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def run(binary: str, main_data_dir: str, log_path: str, runtime: str = "ns", size_mib: int = 1536,
        reserve_mib: int = 256) -> List[str]:
    """Returns what went wrong (empty when the server did all it promises)."""
    wrong: List[str] = []
    shared = ("images",) if runtime == "ns" else ("images", "vm/kernel")
    with small_data_dir(main_data_dir, size_mib, wrong, shared) as data:
        # No sandboxes prepared ahead: they would take the small disk's room and count as leaks.
        server = Server(binary, data, log_path, 8, runtime,
                        ["--min-free-mb", str(reserve_mib), "--ns-prepared-max", "0"])
        server.start()
        api = server.session

        def call(method: str, path: str, **kw):
            return api.request(method, server.url + path, timeout=300, **kw)

        os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
        from e2b import Sandbox
        sbx = None
        ballast = os.path.join(data, "ballast")
        try:
            sbx = Sandbox.create(timeout=600)
            payload = os.urandom(MIB)
            sbx.files.write("/home/user/kept.bin", payload)
            digest = hashlib.sha256(payload).hexdigest()

            # Fill the disk from outside until less than the reserve is free.
            with open(ballast, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, max(_free(data) - reserve_mib * MIB // 2, MIB))
            refused = {
                "create": call("POST", "/sandboxes", json={"templateID": "base"}),
                "pause": call("POST", f"/sandboxes/{sbx.sandbox_id}/pause"),
                "snapshot": call("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", json={}),
                "volume": call("POST", "/volumes", json={"name": "full-disk-probe"}),
            }
            for what, r in refused.items():
                body = r.text
                if r.status_code != 507 or "free" not in body:
                    wrong.append(f"a {what} on a full data disk answered {r.status_code}: {body[:300]}")
            out = sbx.commands.run("sha256sum /home/user/kept.bin", timeout=60).stdout
            if digest not in out:
                wrong.append(f"a running sandbox's file read back different on a full disk: {out!r}")

            # Space freed: everything works again, with no restart.
            os.remove(ballast)
            made = call("POST", "/sandboxes", json={"templateID": "base", "timeout": 60})
            if made.status_code != 201:
                wrong.append(f"a create after space was freed answered {made.status_code}: {made.text[:300]}")
            else:
                call("DELETE", f"/sandboxes/{made.json()['sandboxID']}")
            snap = call("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots", json={})
            if snap.status_code != 201:
                wrong.append(f"a snapshot after space was freed answered {snap.status_code}: {snap.text[:300]}")
            else:
                Sandbox.delete_snapshot(snap.json()["snapshotID"])
            if not sbx.pause():
                wrong.append("a pause after space was freed did not pause")
            sbx = Sandbox.connect(sbx.sandbox_id, timeout=600)
            if digest not in sbx.commands.run("sha256sum /home/user/kept.bin", timeout=60).stdout:
                wrong.append("a file read back different after the disk was freed and the sandbox paused")
        finally:
            with contextlib.suppress(OSError):
                os.remove(ballast)
            if sbx is not None:
                with contextlib.suppress(Exception):
                    sbx.kill()
            server.stop()
    return wrong

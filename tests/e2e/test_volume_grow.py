"""Growing a volume (Warren's `PATCH /volumes/{id}`, `warren volume grow`): an unused volume
takes files past its old quota; one a sandbox mounts either grows in place (a server that may
resize a mounted filesystem: the sandbox's `df` shows it) or is refused with 409 and left as
it was, never half grown."""

from __future__ import annotations

import os
import uuid

import pytest
import requests
from e2b import Sandbox, Volume


def api(method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, os.environ["E2B_API_URL"] + path, timeout=120,
                            headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, **kw)


def test_a_volume_grows_through_the_cli_and_takes_more(server):
    from test_cli import warren

    os.environ["E2B_VOLUME_API_URL"] = server.url
    name = f"grow-{uuid.uuid4().hex[:8]}"
    r = warren(server, "volume", "create", name, "--size", "32M")
    assert r.returncode == 0, r.stderr
    try:
        vol = Volume.connect(r.stdout.strip())
        # 40 MiB does not fit in 32 MiB ...
        big = os.urandom(40 << 20)
        assert api("GET", f"/volumes/{name}").json()["usage"]["bytesTotal"] < len(big)
        r = warren(server, "volume", "grow", name, "--size", "96M")
        assert r.returncode == 0, r.stderr
        assert str(96 << 20) in r.stdout, r.stdout
        # ... and fits once grown; the record and the filesystem agree.
        vol.write_file("/big.bin", big)
        assert vol.read_file("/big.bin", format="bytes") == big
        info = api("GET", f"/volumes/{name}").json()
        assert info["quota"]["bytes"] == 96 << 20
        assert info["usage"]["bytesTotal"] > 64 << 20, info
        # Shrinking is refused with the reason.
        r = warren(server, "volume", "grow", name, "--size", "64M")
        assert r.returncode != 0 and "larger" in r.stderr, r.stderr
    finally:
        warren(server, "volume", "delete", name)


def test_growing_a_mounted_volume_grows_it_in_place_or_says_why_not(server):
    os.environ["E2B_VOLUME_API_URL"] = server.url
    name = f"grow-{uuid.uuid4().hex[:8]}"
    assert api("POST", "/volumes", json={"name": name, "quota": {"bytes": 32 << 20}}).status_code == 201
    try:
        sbx = Sandbox.create(timeout=300, volume_mounts={"/data": name})
    except Exception as e:  # noqa: BLE001
        api("DELETE", f"/volumes/{name}")
        if "does not mount volumes" in str(e):
            pytest.skip(f"this runtime does not mount volumes: {e}")
        raise
    try:
        sbx.commands.run("echo kept > /data/before.txt")
        r = api("PATCH", f"/volumes/{name}", json={"quota": {"bytes": 96 << 20}})
        df = lambda: int(sbx.commands.run("df -B1 --output=size /data | tail -1").stdout)  # noqa: E731
        if r.status_code == 200:
            # Resized online: the running sandbox sees the new size at once.
            assert df() > 64 << 20
        else:
            assert r.status_code == 409, r.text
            assert "in use" in r.json()["message"] and "CAP_SYS_RESOURCE" in r.json()["message"], r.text
            # Nothing changed: the old size, the data, the mount.
            assert df() < 40 << 20
            assert api("GET", f"/volumes/{name}").json()["quota"]["bytes"] == 32 << 20
            assert sbx.commands.run("cat /data/before.txt").stdout.strip() == "kept"
            sbx.kill()
            # Unmounted, it grows.
            r = api("PATCH", f"/volumes/{name}", json={"quota": {"bytes": 96 << 20}})
            assert r.status_code == 200, r.text
    finally:
        sbx.kill()
        api("DELETE", f"/volumes/{name}")

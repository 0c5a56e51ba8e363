"""Threat model W3-M3 (the disk half): volumes used to be sparse images of up to 1 TiB with no
free-space check, so one team could write the data disk full and break the store and every
other team's volumes; COPY uploads and builds wrote with no check either. Now a volume owns its
whole size on the host's disk (allocated when made or grown, kept through `fstrim`), and every
writer (volume create, grow, snapshot; uploads; build steps; sandbox creates; pauses) refuses
with 507 and the numbers when it would eat into the server's reserve (`--min-free-mb`). Per-team
quotas are the agent-driven cloud's issue."""

from __future__ import annotations

import os
import uuid

import pytest
import requests
from e2b import Sandbox, Template

import conftest
from support.warren import API_KEY

MIB = 1 << 20


def volumes_api(server, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, f"{server.url}{path}", headers={"X-API-KEY": API_KEY},
                            timeout=120, **kw)


def new_volume(server, mib: int) -> str:
    r = volumes_api(server, "POST", "/volumes",
                    json={"name": f"res-{uuid.uuid4().hex[:10]}", "quota": {"bytes": mib * MIB}})
    assert r.status_code == 201, r.text
    return r.json()["volumeID"]


def reserved(server):
    """A reserve no disk has room for: every writer must refuse."""
    return conftest.restarted_with(server, "--min-free-mb", str(1 << 30))


def says_why(r: requests.Response) -> str:
    assert r.status_code == 507, (r.status_code, r.text)
    message = r.json()["message"]
    assert "free" in message and "bytes" in message, message
    return message


def test_a_volume_owns_its_size_on_the_host_disk(server):
    vid = new_volume(server, 64)
    try:
        image = os.path.join(server.data_dir, "volumes", vid, "disk.ext4")
        st = os.stat(image)
        assert st.st_size == 64 * MIB
        # Sparse, it took a few MiB; a full disk then broke it on its next block allocation.
        assert st.st_blocks * 512 >= 64 * MIB, f"the volume's image takes {st.st_blocks * 512} bytes"
    finally:
        volumes_api(server, "DELETE", f"/volumes/{vid}")


def test_without_room_every_writer_refuses_with_507_and_the_numbers(server):
    kept = new_volume(server, 16)
    before = len(volumes_api(server, "GET", "/volumes").json())
    # Made while there is room; the restart below takes it back.
    sbx = Sandbox.create(timeout=300, request_timeout=300)
    with reserved(server) as srv:
        # A volume, however small.
        r = volumes_api(srv, "POST", "/volumes",
                        json={"name": f"res-{uuid.uuid4().hex[:10]}", "quota": {"bytes": 8 * MIB}})
        says_why(r)
        assert len(volumes_api(srv, "GET", "/volumes").json()) == before, "a refused volume is listed"
        # A grow: refused, and the volume keeps its size and its data.
        r = volumes_api(srv, "PATCH", f"/volumes/{kept}", json={"quota": {"bytes": 32 * MIB}})
        says_why(r)
        assert volumes_api(srv, "GET", f"/volumes/{kept}").json()["quota"]["bytes"] == 16 * MIB
        # A template build: its COPY upload or its first step is refused, with the reason.
        with pytest.raises(Exception) as refused:
            tpl = Template().from_base_image().run_cmd(f"echo {uuid.uuid4().hex}")
            Template.build(tpl, f"res-{uuid.uuid4().hex[:8]}")
        assert "no room" in str(refused.value), refused.value
        # A create (the sandbox's disk lives on the data disk) and a pause (memory and disk
        # to the data disk); the running sandbox runs on.
        try:
            says_why(volumes_api(srv, "POST", "/sandboxes", json={"templateID": "base"}))
            r = volumes_api(srv, "POST", f"/sandboxes/{sbx.sandbox_id}/pause")
            assert r.status_code == 507, r.text
            assert sbx.is_running()
            assert sbx.commands.run("echo alive").stdout == "alive\n"
        finally:
            sbx.kill()
    volumes_api(server, "DELETE", f"/volumes/{kept}")

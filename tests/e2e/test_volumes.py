"""Volumes through the unmodified E2B SDK: the `Volume` class (control API and content API,
no sandbox running), `volume_mounts` on create, several sandboxes sharing one volume, and
what a volume must survive (kill, pause/resume, forks and snapshots, a server SIGKILL).

The SDK reaches the content API at E2B_VOLUME_API_URL (set here to the server, as a user
without domain mode would; in domain mode it is https://api.<domain> by default)."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
import requests
from e2b import Sandbox, Volume
from e2b.exceptions import NotFoundException


@pytest.fixture(autouse=True)
def _volume_api(server):
    os.environ["E2B_VOLUME_API_URL"] = server.url
    yield


def new_volume(**quota) -> Volume:
    name = f"v-{uuid.uuid4().hex[:10]}"
    if not quota:
        return Volume.create(name)
    r = requests.post(f"{os.environ['E2B_API_URL']}/volumes", json={"name": name, "quota": quota},
                      headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=30)
    assert r.status_code == 201, r.text
    return Volume.connect(r.json()["volumeID"])


def drop(vol: Volume) -> None:
    Volume.destroy(vol.volume_id)


def sh(sbx: Sandbox, cmd: str, user: str | None = None):
    kw = {"user": user} if user else {}
    return sbx.commands.run(cmd, timeout=60, **kw)


def test_volume_api_without_a_sandbox():
    vol = new_volume()
    try:
        assert any(v.volume_id == vol.volume_id and v.name == vol.name for v in Volume.list())
        info = Volume.get_info(vol.volume_id)
        assert info.name == vol.name and info.token
        # The SDK names no size: the volume gets the server's --volume-size-mb (support.warren: 1024).
        r = requests.get(f"{os.environ['E2B_API_URL']}/volumes/{vol.volume_id}",
                         headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=30)
        assert r.json()["quota"]["bytes"] == 1024 * 1024 * 1024, r.text
        vol.write_file("/hello.txt", "hi there")
        assert vol.read_file("/hello.txt") == "hi there"
        st = vol.get_info("/hello.txt")
        assert (st.type.value if hasattr(st.type, "value") else st.type) == "file"
        assert st.size == 8 and st.uid == 1000 and st.gid == 1000
        # Overwrite needs force; a missing parent is an error unless asked to make it.
        with pytest.raises(Exception):
            vol.write_file("/hello.txt", "again")
        vol.write_file("/hello.txt", "again", force=True)
        assert vol.read_file("/hello.txt") == "again"
        vol.make_dir("/a/b/c", force=True)
        vol.write_file("/a/b/c/d.bin", b"\x00\x01" * 1000)
        names = sorted(e.path for e in vol.list("/a", depth=3))
        assert names == ["/a/b", "/a/b/c", "/a/b/c/d.bin"], names
        vol.update_metadata("/a/b/c/d.bin", mode=0o600, uid=0, gid=0)
        st = vol.get_info("/a/b/c/d.bin")
        assert (st.mode & 0o777, st.uid) == (0o600, 0)
        assert vol.exists("/a/b") and not vol.exists("/nope")
        vol.remove("/a")
        assert not vol.exists("/a/b/c/d.bin")
        # A token is the volume's alone.
        r = requests.get(f"{os.environ['E2B_API_URL']}/volumecontent/{vol.volume_id}/path",
                         params={"path": "/"}, headers={"Authorization": "Bearer wvt_wrong"}, timeout=10)
        assert r.status_code == 403 and r.json()["code"] == "403", r.text
    finally:
        drop(vol)
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id)


def test_names_are_checked_and_unique():
    bad = requests.post(f"{os.environ['E2B_API_URL']}/volumes", json={"name": "no spaces"},
                        headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
    assert bad.status_code == 400 and "name" in bad.json()["message"]
    vol = new_volume()
    try:
        again = requests.post(f"{os.environ['E2B_API_URL']}/volumes", json={"name": vol.name},
                              headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
        assert again.status_code == 400 and "exists" in again.json()["message"]
    finally:
        drop(vol)


def test_two_sandboxes_share_a_volume_and_see_the_same_owners():
    vol = new_volume()
    a = Sandbox.create(volume_mounts={"/mnt/data": vol}, timeout=300)
    b = Sandbox.create(volume_mounts={"/data": vol.name}, timeout=300)
    try:
        # The default user writes into the volume's root; the other sandbox and the content
        # API see the same file with the same owner (ids are the sandbox's own in each).
        assert sh(a, "echo from-a > /mnt/data/a.txt && id -u").stdout.strip() == "1000"
        assert sh(b, "cat /data/a.txt").stdout == "from-a\n"
        assert sh(b, "stat -c %u:%g /data/a.txt").stdout.strip() == "1000:1000"
        sh(b, "mkdir /data/dir && echo from-root > /data/dir/r.txt", user="root")
        assert sh(a, "stat -c %u /mnt/data/dir/r.txt").stdout.strip() == "0"
        assert vol.read_file("/a.txt") == "from-a\n"
        assert vol.get_info("/dir/r.txt").uid == 0
        vol.write_file("/from-api.txt", "api")
        assert sh(a, "cat /mnt/data/from-api.txt").stdout == "api"
        # Set-id bits and device nodes mean nothing in a volume.
        mounts = sh(a, "grep ' /mnt/data ' /proc/self/mounts").stdout
        assert "nosuid" in mounts and "nodev" in mounts, mounts
        # Details echo the mounts.
        detail = requests.get(f"{os.environ['E2B_API_URL']}/sandboxes/{a.sandbox_id}",
                              headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10).json()
        assert detail["volumeMounts"] == [{"name": vol.name, "path": "/mnt/data"}], detail
        # A volume in use cannot be deleted.
        r = requests.delete(f"{os.environ['E2B_API_URL']}/volumes/{vol.volume_id}",
                            headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
        assert r.status_code == 409, r.text
    finally:
        a.kill()
        b.kill()
    # Killing the sandboxes leaves the files.
    assert vol.read_file("/a.txt") == "from-a\n"
    drop(vol)


def test_read_only_mounts_and_bad_mounts():
    vol = new_volume()
    base = os.environ["E2B_API_URL"]
    hdr = {"X-API-KEY": os.environ["E2B_API_KEY"]}
    try:
        vol.write_file("/x", "x")
        r = requests.post(f"{base}/v2/sandboxes", headers=hdr, timeout=120, json={
            "templateID": "base", "volumeMounts": [{"name": vol.name, "path": "/ro", "readOnly": True}]})
        assert r.status_code == 201, r.text
        sbx = Sandbox.connect(r.json()["sandboxID"])
        try:
            assert sh(sbx, "cat /ro/x").stdout == "x"
            try:
                sh(sbx, "echo y > /ro/y", user="root")
                raise AssertionError("a read-only volume took a write")
            except Exception as e:  # CommandExitException
                assert "Read-only file system" in str(e), e
        finally:
            sbx.kill()
        for mounts, why in [
            ([{"name": vol.name, "path": "relative"}], "absolute"),
            ([{"name": vol.name, "path": "/proc/x"}], "reserved"),
            ([{"name": vol.name, "path": "/a"}, {"name": vol.name, "path": "/a"}], "twice"),
            ([{"name": "no-such-volume", "path": "/a"}], "not found"),
        ]:
            r = requests.post(f"{base}/v2/sandboxes", headers=hdr, timeout=60,
                              json={"templateID": "base", "volumeMounts": mounts})
            assert r.status_code == 400 and why in r.json()["message"], r.text
    finally:
        drop(vol)


def test_subpath_mounts_show_one_directory_and_no_planted_link(server):
    """`subpath` mounts one directory of a volume (made if missing). It is found beneath the
    volume without following links, so a link another sandbox planted in its place makes the
    create fail instead of mounting whatever the link names."""
    vol = new_volume()
    base = os.environ["E2B_API_URL"]
    hdr = {"X-API-KEY": os.environ["E2B_API_KEY"]}

    def create(subpath):
        return requests.post(f"{base}/v2/sandboxes", headers=hdr, timeout=120, json={
            "templateID": "base", "volumeMounts": [{"name": vol.name, "path": "/p", "subpath": subpath}]})

    try:
        vol.write_file("/top.txt", "top")
        r = create("projects/a")
        assert r.status_code == 201, r.text
        sbx = Sandbox.connect(r.json()["sandboxID"])
        try:
            sh(sbx, "echo in-a > /p/file")
            assert sh(sbx, "ls -A /p").stdout.split() == ["file"]
            assert vol.read_file("/projects/a/file") == "in-a\n"
            # Plant a link where another sandbox's subpath will be looked up.
            sh(sbx, "ln -s / /p/evil")
        finally:
            sbx.kill()
        r = create("projects/a/evil")
        assert r.status_code == 400, r.text
        r = create("projects/a/evil/etc")
        assert r.status_code == 400, r.text
        for bad in ["../x", "/abs", "a//b"]:
            r = create(bad)
            assert r.status_code == 400 and "subpath" in r.json()["message"], (bad, r.text)
    finally:
        drop(vol)


def test_quota_gives_enospc_inside_and_a_clear_error_outside():
    vol = new_volume(bytes=32 * 1024 * 1024, inodes=2048)
    sbx = Sandbox.create(volume_mounts={"/q": vol}, timeout=300)
    try:
        r = sbx.commands.run("dd if=/dev/zero of=/q/big bs=1M count=64 2>&1; echo rc=$?", timeout=120)
        assert "No space left on device" in r.stdout and "rc=1" in r.stdout, r.stdout
        sh(sbx, "rm /q/big")
        r = requests.put(f"{os.environ['E2B_API_URL']}/volumecontent/{vol.volume_id}/file",
                         params={"path": "/too-big"}, data=b"\0" * (40 * 1024 * 1024),
                         headers={"Authorization": f"Bearer {Volume.get_info(vol.volume_id).token}"}, timeout=60)
        assert r.status_code == 507, r.text
        assert not vol.exists("/too-big")
        info = requests.get(f"{os.environ['E2B_API_URL']}/volumes/{vol.volume_id}",
                            headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10).json()
        assert info["quota"] == {"bytes": 32 * 1024 * 1024, "inodes": 2048}
        assert 0 < info["usage"]["bytesTotal"] <= 32 * 1024 * 1024, info
    finally:
        sbx.kill()
        drop(vol)


def test_hostile_links_in_a_volume_lead_nowhere():
    vol = new_volume()
    sbx = Sandbox.create(volume_mounts={"/v": vol}, timeout=300)
    try:
        sh(sbx, "ln -s /etc/passwd /v/abs && ln -s ../../../../../../etc /v/rel && mkfifo /v/fifo")
        st = vol.get_info("/abs")
        assert (st.type.value if hasattr(st.type, "value") else st.type) == "symlink" and st.target == "/etc/passwd"
        for path in ["/abs", "/rel/passwd", "/fifo"]:
            with pytest.raises(Exception):
                vol.read_file(path)
        with pytest.raises(Exception):
            vol.write_file("/rel/warren-was-here", "x")
        assert not os.path.exists("/etc/warren-was-here")
        with pytest.raises(Exception):
            vol.update_metadata("/rel/passwd", mode=0o777)
        assert os.stat("/etc/passwd").st_mode & 0o777 == 0o644
    finally:
        sbx.kill()
        drop(vol)


def checksum(sbx: Sandbox, path: str) -> str:
    return sh(sbx, f"sha256sum {path} | cut -d' ' -f1").stdout.strip()


def test_volume_survives_pause_resume_fork_and_a_server_kill(server):
    vol = new_volume()
    sbx = Sandbox.create(volume_mounts={"/v": vol}, timeout=300)
    try:
        sh(sbx, "head -c 3000000 /dev/urandom > /v/blob && sync")
        want = checksum(sbx, "/v/blob")
        sbx.pause()
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert checksum(resumed, "/v/blob") == want
        # A snapshot's sandboxes mount the same volume (live, shared).
        snap = resumed.create_snapshot()
        child = Sandbox.create(snap.snapshot_id, timeout=120)
        try:
            assert checksum(child, "/v/blob") == want
            sh(child, "echo child > /v/child.txt")
            assert sh(resumed, "cat /v/child.txt").stdout == "child\n"
        finally:
            child.kill()
            Sandbox.delete_snapshot(snap.snapshot_id)
        # Writes in flight when the server dies: what a sandbox fsync'd is there afterwards,
        # and the sandbox and its mount are taken back.
        sh(resumed, "for i in $(seq 1 50); do head -c 100000 /dev/urandom > /v/f$i; done; sync")
        sums = sh(resumed, "cd /v && sha256sum f* | sha256sum").stdout
        server.proc.kill()
        server.proc.wait()
        server.start()
        again = Sandbox.connect(sbx.sandbox_id)
        assert sh(again, "cd /v && sha256sum f* | sha256sum").stdout == sums
        assert vol.read_file("/blob", format="bytes") is not None
        assert hashlib.sha256(bytes(vol.read_file("/blob", format="bytes"))).hexdigest() == want
    finally:
        Sandbox.kill(sbx.sandbox_id)
        drop(vol)


# A MOUNT v3 EXPORT call (AUTH_NONE) to the VM's NFS server: prints the export paths it has.
EXPORTS_PY = r"""
import socket, struct
s = socket.create_connection(("169.254.0.22", 2049), timeout=10)
call = struct.pack(">6I", 7, 0, 2, 100005, 3, 5) + struct.pack(">4I", 0, 0, 0, 0)
s.sendall(struct.pack(">I", 0x80000000 | len(call)) + call)
data = b""
while True:
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    data += s.recv(n & 0x7FFFFFFF, socket.MSG_WAITALL)
    if n & 0x80000000:
        break
_, mtype, stat, _, vlen = struct.unpack(">5I", data[:20])
off = 20 + ((vlen + 3) & ~3)
assert (mtype, stat, struct.unpack(">I", data[off:off + 4])[0]) == (1, 0, 0)
off += 4
def u32():
    global off
    off += 4
    return struct.unpack(">I", data[off - 4:off])[0]
def string():
    global off
    n = u32()
    v = data[off:off + n].decode()
    off += (n + 3) & ~3
    return v
while u32():
    print(string())
    while u32():
        string()
"""


def test_a_vm_reaches_only_its_own_volumes():
    """In the vm runtime each VM's volumes come from an NFS server of its own on its gateway
    address: it exports exactly the volumes mounted in that VM (another sandbox's volume is
    not there to mount), it works with the internet cut off and with name rules (which send
    the VM's other TCP through the egress proxy), and a VM without volumes has no server."""
    if os.environ.get("WARREN_E2E_RUNTIME", "ns") != "vm":
        pytest.skip("the ns runtime bind-mounts volumes: no server is involved")
    va, vb = new_volume(), new_volume()
    a = Sandbox.create(volume_mounts={"/a": va}, allow_internet_access=False, timeout=300)
    b = Sandbox.create(volume_mounts={"/b": vb}, network={"deny_out": ["denied.example.test"]},
                       timeout=300)
    c = Sandbox.create(timeout=300)
    try:
        exported = {}
        for sbx, path in [(a, "/a"), (b, "/b")]:
            sbx.files.write("/tmp/exports.py", EXPORTS_PY)
            exported[path] = sh(sbx, "python3 /tmp/exports.py").stdout.split()
            mounts = sh(sbx, f"grep ' {path} nfs ' /proc/self/mounts").stdout
            source = mounts.split()[0]
            assert exported[path] == [source.split(":", 1)[1]], (exported, mounts)
            sh(sbx, f"echo hi > {path}/x")
        assert exported["/a"] != exported["/b"]
        assert va.read_file("/x") == "hi\n" and vb.read_file("/x") == "hi\n"
        c.files.write("/tmp/exports.py", EXPORTS_PY)
        r = c.commands.run("python3 /tmp/exports.py 2>&1; echo rc=$?", timeout=60)
        assert "ConnectionRefusedError" in r.stdout and "rc=1" in r.stdout, r.stdout
    finally:
        for sbx in (a, b, c):
            sbx.kill()
        drop(va)
        drop(vb)


def test_cli_files_and_snapshots(server, tmp_path):
    """`warren volume ...`: create with a quota, files in and out, a snapshot, a volume made
    from it that has the old content while the original moves on, and the CLI's sandbox
    mount flag."""
    from test_cli import warren

    def ok(*args):
        r = warren(server, "volume", *args)
        assert r.returncode == 0, (args, r.stderr)
        return r.stdout

    name = f"cli-{uuid.uuid4().hex[:8]}"
    vid = ok("create", name, "--size", "64M", "--inodes", "4096").strip()
    copy = None
    try:
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(300_000))
        ok("mkdir", name, "/d/e", "-p")
        ok("put", name, str(src), "/d/e/in.bin")
        assert "/d/e/in.bin" in ok("ls", name, "/d", "--depth", "3")
        ok("get", name, "/d/e/in.bin", str(tmp_path / "out.bin"))
        assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
        info = ok("info", name)
        assert "quota 67108864" in info and "quota 4096" in info, info
        snap = ok("snapshot", name).strip()
        assert snap in ok("snapshots", name)
        ok("rm", name, "/d")
        copy = f"{name}-copy"
        ok("create", copy, "--from-snapshot", snap)
        ok("get", copy, "/d/e/in.bin", str(tmp_path / "copy.bin"))
        assert (tmp_path / "copy.bin").read_bytes() == src.read_bytes()
        assert "/d/e/in.bin" in ok("ls", copy, "/", "--depth", "3")
        assert "/d" not in ok("ls", name, "/")
        sid = warren(server, "sandbox", "create", "--volume", f"{copy}:/c:ro").stdout.strip()
        try:
            out = warren(server, "sandbox", "exec", sid, "--", "sha256sum", "/c/d/e/in.bin").stdout
            assert hashlib.sha256(src.read_bytes()).hexdigest() in out, out
        finally:
            warren(server, "sandbox", "kill", sid)
        ok("delete-snapshot", snap)
        assert snap not in ok("snapshots", name)
    finally:
        if copy:
            warren(server, "volume", "delete", copy)
        ok("delete", vid)
    assert name not in ok("list")


def test_a_filesystem_pause_mounts_the_volume_again_on_resume():
    """A filesystem-only pause ends the sandbox's processes and a resume starts it afresh on
    its saved files: the volume must be mounted again (not copied into the saved layer), with
    what was written to it meanwhile through the content API."""
    vol = new_volume()
    base = os.environ["E2B_API_URL"]
    hdr = {"X-API-KEY": os.environ["E2B_API_KEY"]}
    sbx = Sandbox.create(volume_mounts={"/v": vol}, timeout=300)
    try:
        sh(sbx, "echo before > /v/a && echo own > /tmp/own")
        r = requests.post(f"{base}/sandboxes/{sbx.sandbox_id}/pause", headers=hdr, timeout=120,
                          json={"memory": False})
        assert r.status_code == 204, r.text
        vol.write_file("/b", "while paused\n")
        again = Sandbox.connect(sbx.sandbox_id)
        assert sh(again, "cat /v/a /v/b /tmp/own").stdout == "before\nwhile paused\nown\n"
        assert "/v " in sh(again, "awk '{print $2\" \"}' /proc/self/mounts").stdout
        sh(again, "echo after > /v/c")
        assert vol.read_file("/c") == "after\n"
    finally:
        Sandbox.kill(sbx.sandbox_id)
        drop(vol)


def test_forks_mount_their_parents_volumes():
    """A fork's children mount the same volumes as the parent (the volume is shared and live,
    not copied): each child's write is seen by the parent and the others."""
    vol = new_volume()
    base = os.environ["E2B_API_URL"]
    hdr = {"X-API-KEY": os.environ["E2B_API_KEY"]}
    parent = Sandbox.create(volume_mounts={"/v": vol}, timeout=300)
    children = []
    try:
        sh(parent, "echo parent > /v/p")
        r = requests.post(f"{base}/sandboxes/{parent.sandbox_id}/fork", headers=hdr, timeout=300,
                          json={"count": 2, "timeout": 120})
        assert r.status_code in (200, 201), r.text
        children = [item["sandbox"]["sandboxID"] for item in r.json()]
        assert len(children) == 2, r.text
        for i, cid in enumerate(children):
            child = Sandbox.connect(cid)
            assert sh(child, "cat /v/p").stdout == "parent\n"
            sh(child, f"echo child{i} > /v/c{i}")
        assert sh(parent, "cat /v/c0 /v/c1").stdout == "child0\nchild1\n"
        detail = requests.get(f"{base}/sandboxes/{children[0]}", headers=hdr, timeout=10).json()
        assert detail["volumeMounts"] == [{"name": vol.name, "path": "/v"}], detail
    finally:
        for cid in children:
            Sandbox.kill(cid)
        parent.kill()
        drop(vol)

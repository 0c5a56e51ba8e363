"""Threat model W3-H1 and W3-H2: a tenant's template image never gives the host anything.

- W3-H1: the host's mounts of template images are private to root, `nosuid` and `nodev`; a
  setuid file of a tenant's template runs as root in no host process (while it still works
  inside the tenant's sandbox), and a device node in a registry image is never made.
- W3-H2: a registry image whose `tmp` and `usr` are symlinks to host paths leaves those paths
  untouched when the server prepares the image and when a sandbox of it starts (nsinit sets
  up the root before it pivots into it).

The images come from the shared loopback registry (tests/support/registry.py). Only the
ns runtime mounts templates on the host and runs nsinit, and the unpacking is the same code
for both runtimes, so these run with ns (a printed skip under vm).
"""

from __future__ import annotations

import os
import stat
import subprocess
import tarfile
import uuid

from e2b import Sandbox, Template

from conftest import sh
from support.registry import Layer, busybox_layer
from support.warren import same_on_every_runtime

TEMPLATES_DIR = "/run/warren/templates"


def _template_mounts() -> list[tuple[str, str]]:
    """(mount point, options) of every template image the server has mounted on the host."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ")
            if fields[4].startswith(TEMPLATES_DIR + "/"):
                out.append((fields[4], fields[5]))
    return out


def _build(tpl, name: str, logs: list[str] | None = None) -> list[str]:
    logs = [] if logs is None else logs
    Template.build(tpl, name, on_build_logs=lambda l: logs.append(l.message))
    return logs


def _as_nobody(*argv: str) -> subprocess.CompletedProcess:
    # Through a shell: setpriv opens the program it runs before it changes ids.
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/bin/sh", "-c", 'exec "$@"', "sh", *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _assert_private(mount: str, opts: str) -> None:
    for o in ("ro", "nosuid", "nodev"):
        assert o in opts.split(","), f"{mount} is mounted {opts}"
    # The mount's own root shows the image's `/`; the directories holding it keep others out.
    d = os.path.dirname(mount)
    while True:
        st = os.stat(d)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700, f"{d}: {oct(st.st_mode)}"
        if d == TEMPLATES_DIR:
            break
        d = os.path.dirname(d)


def test_a_tenants_setuid_file_is_root_only_inside_its_sandbox(server):
    same_on_every_runtime("only the ns runtime mounts template images on the host")
    nonce = uuid.uuid4().hex[:8]
    name = f"sec-suid-{nonce}"
    planted = f"/usr/local/bin/rootid-{nonce}"
    _build(
        Template()
        .from_template("base")
        .run_cmd(f"cp /usr/bin/id {planted} && chmod 4755 {planted}", user="root"),
        name,
    )
    sbx = Sandbox.create(name, timeout=120)
    try:
        # Inside the sandbox the tenant's setuid file works: euid 0 of the sandbox.
        assert sh(sbx, f"{planted} -u").strip() == "0"
        assert sh(sbx, "id -u").strip() != "0"
        # On the host, where the template may be mounted: nobody cannot reach it, let alone
        # run it as root.
        mounts = _template_mounts()
        assert mounts, "the ns runtime makes sandboxes from a host mount of the template"
        found = False
        for mount, opts in mounts:
            host_copy = mount + planted
            if not os.path.exists(host_copy):
                continue
            found = True
            _assert_private(mount, opts)
            r = _as_nobody(host_copy, "-u")
            assert r.returncode != 0 and r.stdout.strip() != "0", (r.stdout, r.stderr)
            assert "Permission denied" in r.stderr, r.stderr
        assert found, f"{planted} in none of {mounts}"
        # The stock setuid su of every template is no host setuid binary either.
        for mount, _ in mounts:
            su = mount + "/usr/bin/su"
            if os.path.exists(su):
                r = _as_nobody(su, "--version")
                assert r.returncode != 0, (r.stdout, r.stderr)
    finally:
        sbx.kill()


def test_device_nodes_of_a_registry_image_are_never_made(server, registry):
    same_on_every_runtime("registry layers are unpacked on the host by the same code for both")
    nonce = uuid.uuid4().hex[:8]
    layer = Layer().dir("srv")
    # /dev/kmsg's numbers, mode 0666: on the host, anyone could write the kernel log through it.
    ti = tarfile.TarInfo("srv/kmsg")
    ti.type, ti.mode, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 0o666, 1, 11
    layer.tf.addfile(ti)
    layer.file("srv/kept.txt", b"kept\n")
    registry.push("library/sec-dev", nonce, [busybox_layer(), layer.gz()], {"Cmd": ["sh"]})
    name = f"sec-dev-{nonce}"
    _build(Template().from_image(f"sec-dev:{nonce}").run_cmd("true"), name)
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sh(sbx, "cat /srv/kept.txt").strip() == "kept"
        assert sh(sbx, "test -e /srv/kmsg && echo present || echo absent").strip() == "absent"
        for mount, opts in _template_mounts():
            _assert_private(mount, opts)
            assert not os.path.lexists(mount + "/srv/kmsg"), mount
    finally:
        sbx.kill()


def test_image_symlinks_to_host_paths_leave_the_host_untouched(server, registry, tmp_path):
    same_on_every_runtime("the builder's fix-ups are the same for both; nsinit is the ns runtime's")
    nonce = uuid.uuid4().hex[:8]
    canary = tmp_path / f"canary-{nonce}"
    canary.write_text("host secret\n")
    os.chmod(canary, 0o600)
    # World-writable, as /tmp is: whoever follows the link could make directories there.
    canary_dir = tmp_path / f"canarydir-{nonce}"
    canary_dir.mkdir()
    os.chmod(canary_dir, 0o1777)
    os.chmod(tmp_path, 0o755)
    # Over the lower layer's real directories: /tmp a host file, /usr a host directory.
    top = Layer().link("tmp", str(canary)).link("usr", str(canary_dir)).gz()
    digest = registry.push("library/sec-links", nonce, [busybox_layer(), top], {"Cmd": ["sh"]})
    logs: list[str] = []
    name = f"sec-links-{nonce}"
    try:
        _build(Template().from_image(f"sec-links:{nonce}").run_cmd("ls /usr/local/bin"), name, logs)
    finally:
        assert stat.S_IMODE(os.stat(canary).st_mode) == 0o600, oct(os.stat(canary).st_mode)
        assert canary.read_text() == "host secret\n"
        assert list(canary_dir.iterdir()) == [], list(canary_dir.iterdir())
    assert any(digest in l for l in logs), logs
    # The image's links mean its own paths: a sandbox of it runs, with /tmp a directory of its own.
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sh(sbx, "test -d /tmp && test ! -L /tmp && echo dir").strip() == "dir"
        assert sh(sbx, "readlink /usr").strip() == str(canary_dir)
    finally:
        sbx.kill()
    assert list(canary_dir.iterdir()) == [], list(canary_dir.iterdir())

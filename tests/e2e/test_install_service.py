"""`scripts/install-service.sh` into a scratch root (`ROOT=`): the binaries side by side, the
`warren` link, the unit with KillMode=process (sandboxes outlive a stop or an upgrade), and
a flags file of its own that a second install (an upgrade) never overwrites."""

from __future__ import annotations

import os
import stat
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def install(dest: str) -> None:
    r = subprocess.run([os.path.join(ROOT, "scripts", "install-service.sh")],
                       env=dict(os.environ, ROOT=dest), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_service_installs_and_an_upgrade_keeps_the_flags(tmp_path):
    dest = str(tmp_path)
    install(dest)
    lib = os.path.join(dest, "usr/local/lib/warren")
    for b in ("warren", "warren-agent", "warren-nsinit", "warren-nfsd", "warren-vminit"):
        assert os.access(os.path.join(lib, b), os.X_OK), b
    assert os.readlink(os.path.join(dest, "usr/local/bin/warren")) == "/usr/local/lib/warren/warren"
    unit = open(os.path.join(dest, "etc/systemd/system/warren.service")).read()
    assert "KillMode=process" in unit and "Restart=on-failure" in unit
    assert "EnvironmentFile=/etc/warren/warren.env" in unit
    env = os.path.join(dest, "etc/warren/warren.env")
    assert stat.S_IMODE(os.stat(env).st_mode) == 0o600
    assert "WARREN_ARGS=" in open(env).read()

    # An operator's flags survive the next install (an upgrade); the binaries are replaced.
    with open(env, "w") as f:
        f.write("WARREN_ARGS=--listen 127.0.0.1:3999 --data-dir /srv/warren\n")
    before = os.stat(os.path.join(lib, "warren")).st_ino
    install(dest)
    assert open(env).read() == "WARREN_ARGS=--listen 127.0.0.1:3999 --data-dir /srv/warren\n"
    assert os.stat(os.path.join(lib, "warren")).st_ino != before, "the binary was written in place"
    assert not [n for n in os.listdir(lib) if n.endswith(".new")]

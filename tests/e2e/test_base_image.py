"""The base template has the tools E2B's base image has and that SDK docs and tests use."""

from __future__ import annotations

from e2b import Sandbox



def test_base_image_tools(server):
    sbx = Sandbox.create(timeout=120)
    try:
        checks = {
            "python --version": "Python 3",
            "python3 --version": "Python 3",
            "pip --version": "pip",
            "node --version": "v",
            "npm --version": "",
            "git --version": "git version",
            "curl --version": "curl",
            "sudo -n true && echo sudo-ok": "sudo-ok",
            "ss -V": "iproute2",
            "ip -V": "iproute2",
            "ps --version": "procps",
        }
        for cmd, want in checks.items():
            r = sbx.commands.run(f"{cmd} 2>&1")
            assert want in r.stdout, (cmd, r.stdout)
    finally:
        sbx.kill()

"""The JS SDK version matrix: tests/compat/js/flow.mjs run by pinned `e2b` JS releases (the last
1.x, the oldest 2.x, the 2.x the other JS tests use) against the server in domain mode, as
test_domain.py sets it up (HTTPS on 127.0.0.1:443, names resolved by the stub DNS server inside
the client's own mount namespace): releases before 2.x have no sandbox URL setting, so domain
mode is how their users reach any server. Each release is installed from the npm registry into
target/sdk-matrix/js-e2b-<release> on first use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from support.warren import ROOT, require
from test_domain import DOMAIN, client_env, domain_server, isolated  # noqa: F401 (fixture)

RELEASES = ["1.13.2", "2.0.1", "2.51.0"]
FLOW = os.path.join(ROOT, "tests", "compat", "js", "flow.mjs")


def _node_is_new_enough() -> bool:
    if shutil.which("node") is None:
        return False
    out = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    major, minor = (int(p) for p in out.lstrip("v").split(".")[:2])
    return (major, minor) >= (20, 18)


def _install(release: str) -> str:
    target = os.path.join(ROOT, "target", "sdk-matrix", f"js-e2b-{release}")
    if not os.path.isfile(os.path.join(target, "node_modules", "e2b", "package.json")):
        os.makedirs(target, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--no-save", f"e2b@{release}"],
            cwd=target, check=True, timeout=600,
        )
    return target


@pytest.mark.parametrize("release", RELEASES)
def test_js_release_flow_in_domain_mode(domain_server, release):
    require("node >= 20.18.1 and npm", _node_is_new_enough() and shutil.which("npm") is not None)
    sdk_dir = _install(release)
    env = client_env(domain_server)
    env.update(NODE_EXTRA_CA_CERTS=domain_server.ca, WARREN_COMPAT_JS_SDK_DIR=sdk_dir)
    proc = subprocess.run(
        isolated(domain_server, ["node", FLOW]), env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["version"] == release
    assert seen["host"] == f"8000-{seen['id']}.{DOMAIN}"
    assert seen["env"] == "from-create\n"
    assert seen["bgPid"] > 0 and seen["bgKilled"] is True
    assert seen["read"] == "kept across pause"
    assert "kept.txt" in seen["listedFiles"]
    assert "pty-42" in seen["pty"]
    assert seen["listed"] is True
    assert seen["metadata"].get("matrix") == "js"
    assert seen["paused"] is (not release.startswith("1."))
    assert seen["afterResume"] == "kept across pause"
    assert seen["resumedRun"] == "resumed\n"
    assert seen["listedAfterKill"] is False

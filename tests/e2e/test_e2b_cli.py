"""The official `e2b` CLI (npm `@e2b/cli` 2.19.0, installed by scripts/test.sh into
tests/e2e/e2b-cli) against the suite's server: `template create` (the CLI parses the
Dockerfile with the JS SDK and builds it), `template list` and `template delete`."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from e2b import Sandbox

from support.warren import API_KEY, ROOT, require

CLI = os.path.join(ROOT, "tests", "e2e", "e2b-cli", "node_modules", ".bin", "e2b")


@pytest.fixture
def e2b(server):
    if os.environ.get("WARREN_E2E_RUNTIME", "ns") == "vm":
        # What the CLI sends does not depend on the runtime; its builds are minutes under TCG.
        pytest.skip("the e2b CLI's wire protocol is tested with the ns runtime")
    require("the e2b CLI (npm ci in tests/e2e/e2b-cli; Node.js >= 20.18.1)", os.path.exists(CLI))
    env = dict(
        os.environ,
        E2B_API_KEY=API_KEY,
        E2B_API_URL=server.url,
        E2B_SANDBOX_URL=server.url,
        # The CLI wants an access token for some commands; template commands use the key.
        E2B_ACCESS_TOKEN="sk_e2b_" + "0" * 40,
        NO_COLOR="1",
    )

    def run(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)

    # For the interactive commands, which want a terminal of their own.
    run.argv, run.env = [CLI], env
    return run


def test_template_create_list_and_delete(e2b, tmp_path):
    nonce = uuid.uuid4().hex
    (tmp_path / "hello.txt").write_text("from the e2b CLI\n")
    (tmp_path / "Dockerfile").write_text(
        f"FROM e2bdev/base\nCOPY hello.txt /srv/hello.txt\nRUN echo {nonce} > /srv/nonce\nWORKDIR /srv\n"
    )
    name = f"e2bcli-{nonce[:8]}"
    r = e2b("template", "create", name, "-p", str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "finished" in r.stdout, r.stdout
    r = e2b("template", "list", "-f", "json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    listed = [t for t in json.loads(r.stdout) if name in t.get("aliases", [])]
    assert listed and listed[0]["buildStatus"] == "ready", r.stdout
    sb = Sandbox.create(name, timeout=60)
    try:
        assert sb.commands.run("cat hello.txt nonce").stdout == f"from the e2b CLI\n{nonce}\n"
    finally:
        sb.kill()
    r = e2b("template", "delete", name, "-y")
    assert r.returncode == 0, (r.stdout, r.stderr)
    r = e2b("template", "list", "-f", "json")
    assert not [t for t in json.loads(r.stdout) if name in t.get("aliases", [])], r.stdout

"""Threat model H3 and L3: the server's state on the host is private, and secrets in the store
are encrypted at rest."""

from __future__ import annotations

import os
import stat

from e2b import Sandbox


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_data_dir_store_and_keys_are_private(server):
    d = server.data_dir
    assert _mode(d) & 0o077 == 0, oct(_mode(d))
    for name in ("warren.db", "warren.key"):
        p = os.path.join(d, name)
        assert _mode(p) & 0o077 == 0, f"{name} is {oct(_mode(p))}"
    for name in ("warren.db-wal", "warren.db-shm", "api-key"):
        p = os.path.join(d, name)
        if os.path.exists(p):
            assert _mode(p) & 0o077 == 0, f"{name} is {oct(_mode(p))}"


def test_tokens_and_env_vars_are_encrypted_at_rest(server):
    secret = "correct-horse-battery-staple-7f3a"
    sbx = Sandbox.create(timeout=120, envs={"DB_PASSWORD": secret})
    try:
        raw = b""
        for name in ("warren.db", "warren.db-wal"):
            p = os.path.join(server.data_dir, name)
            if os.path.exists(p):
                with open(p, "rb") as f:
                    raw += f.read()
        assert secret.encode() not in raw
        assert sbx._envd_access_token.encode() not in raw
        assert sbx.traffic_access_token.encode() not in raw
        # And the sandbox still gets its env var.
        assert sbx.commands.run("echo $DB_PASSWORD").stdout.strip() == secret
    finally:
        sbx.kill()

"""Threat model H3 and L3: the server's state on the host is private, and secrets in the store
are encrypted at rest."""

from __future__ import annotations

import os
import stat

import requests
from e2b import Sandbox

from support.warren import API_KEY


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _store_bytes(server) -> bytes:
    """The store's database and write-ahead log, as bytes on the disk."""
    raw = b""
    for name in ("warren.db", "warren.db-wal"):
        p = os.path.join(server.data_dir, name)
        if os.path.exists(p):
            with open(p, "rb") as f:
                raw += f.read()
    return raw


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
        raw = _store_bytes(server)
        assert secret.encode() not in raw
        assert sbx._envd_access_token.encode() not in raw
        assert sbx.traffic_access_token.encode() not in raw
        # And the sandbox still gets its env var.
        assert sbx.commands.run("echo $DB_PASSWORD").stdout.strip() == secret
    finally:
        sbx.kill()


def test_env_values_printed_by_commands_are_masked_in_the_audit_trail(server):
    """The audit trail keeps commands' output and argv; the values of the sandbox's and of a
    command's environment variables must not reach it (nor the store) in the clear."""
    secret = "sandbox-wide-secret-5b1c"
    own = "command-own-secret-9e2d"
    sbx = Sandbox.create(timeout=120, envs={"DB_PASSWORD": secret})
    try:
        out = sbx.commands.run(
            'echo "$DB_PASSWORD $OWN"; /bin/echo "$DB_PASSWORD"', envs={"OWN": own}
        ).stdout
        assert secret in out and own in out
        r = requests.get(
            f"{server.url}/v1/sandboxes/{sbx.sandbox_id}/audit",
            headers={"X-API-Key": API_KEY},
            params={"kind": "process", "limit": 10000},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        trail = r.text
        assert "[masked:DB_PASSWORD]" in trail and "[masked:OWN]" in trail, trail
        assert secret not in trail and own not in trail
        raw = _store_bytes(server)
        assert secret.encode() not in raw and own.encode() not in raw
    finally:
        sbx.kill()

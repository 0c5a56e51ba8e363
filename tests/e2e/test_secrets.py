"""Secrets through the unmodified E2B SDK (`Secret`): create, get by id or name, paged list,
update (versions, metadata kept or cleared), delete; the value never comes back in any
response and is not in the store's files in the clear."""

from __future__ import annotations

import glob
import os
import uuid

import pytest
import requests
from e2b import Secret
from e2b.exceptions import SecretNotFoundException


def api(method: str, path: str, **kw):
    return requests.request(method, os.environ["E2B_API_URL"] + path, timeout=30,
                            headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, **kw)


def test_secret_lifecycle_with_the_sdk(server):
    name = f"Key_{uuid.uuid4().hex[:8]}"
    value = f"sk-{uuid.uuid4().hex}"
    s = Secret.create(name, value, metadata={"owner": "team-a"})
    try:
        assert s.secret_id.startswith("sec_") and s.name == name.lower() and s.version == 1
        assert s.metadata == {"owner": "team-a"}
        by_name = Secret.get_info(name.upper())
        assert by_name.secret_id == s.secret_id
        assert Secret.exists(s.secret_id) and not Secret.exists("no-such-secret")
        # Update: a new version; metadata kept when omitted, replaced when given.
        u = Secret.update(s.secret_id, value + "-2")
        assert u.version == 2 and u.metadata == {"owner": "team-a"}
        u = Secret.update(name, value + "-3", metadata={})
        assert u.version == 3 and u.metadata == {}
        # The value is in no answer, and not in the store's files in the clear.
        for r in [api("GET", f"/secrets/{s.secret_id}"), api("GET", "/secrets"), api("GET", f"/secrets/{name}")]:
            assert r.status_code == 200 and value not in r.text, r.text
        data_dir = os.path.dirname(server.log.name)
        for f in glob.glob(os.path.join(data_dir, "warren.db*")) + [server.log.name]:
            with open(f, "rb") as fh:
                assert value.encode() not in fh.read(), f
        # Names are unique in a team, and checked.
        again = api("POST", "/secrets", json={"name": name.lower(), "value": "x"})
        assert again.status_code == 409, again.text
        for bad in ["sec_x", "no spaces", ""]:
            r = api("POST", "/secrets", json={"name": bad, "value": "x"})
            assert r.status_code == 400, (bad, r.text)
        assert api("POST", "/secrets", json={"name": "empty-value", "value": ""}).status_code == 400
    finally:
        assert Secret.destroy(s.secret_id)
    assert not Secret.destroy(s.secret_id)
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(s.secret_id)


def test_listing_pages_with_the_next_token():
    made = [Secret.create(f"page-{uuid.uuid4().hex[:8]}", "v") for _ in range(5)]
    try:
        seen, pager = [], Secret.list(limit=2)
        while pager.has_next:
            page = pager.next_items()
            assert len(page) <= 2
            seen.extend(s.secret_id for s in page)
        assert len(seen) == len(set(seen))
        assert {s.secret_id for s in made} <= set(seen)
        assert api("GET", "/secrets", params={"limit": 0}).status_code == 400
        assert api("GET", "/secrets", params={"nextToken": "sec_nope"}).status_code == 400
    finally:
        for s in made:
            Secret.destroy(s.secret_id)


def test_key_rotation_keeps_every_secret_and_needs_the_server_stopped(server):
    """`warren store rotate-key`: refused while the server runs; with it stopped, every
    sealed value is sealed again under a new key and everything still works after a start."""
    import subprocess

    from e2b import Sandbox

    from support.warren import warren_bin

    binary = warren_bin()
    data_dir = os.path.dirname(server.log.name)
    rotate = [binary, "store", "--data-dir", data_dir, "rotate-key"]
    s = Secret.create(f"rot-{uuid.uuid4().hex[:8]}", "rotate-me")
    sbx = Sandbox.create(envs={"ROT": "env-value"}, timeout=300)
    try:
        busy = subprocess.run(rotate, capture_output=True, text=True, timeout=60)
        assert busy.returncode != 0 and "stop it first" in busy.stderr, busy.stderr
        with open(os.path.join(data_dir, "warren.key"), "rb") as f:
            old = f.read()
        server.stop()
        try:
            done = subprocess.run(rotate, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and "under a new key" in done.stdout, done.stderr
        finally:
            server.start()
        with open(os.path.join(data_dir, "warren.key"), "rb") as f:
            assert f.read() != old
        assert Secret.get_info(s.secret_id).name == s.name
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("echo $ROT").stdout.strip() == "env-value"
    finally:
        Secret.destroy(s.secret_id)
        Sandbox.kill(sbx.sandbox_id)

"""Private networks end to end, on the server's runtime: sandboxes joined at create (the
unmodified SDK through the `warren.networks` metadata key, the create extension, the CLI) or
later reach each other by name (`<id>.<network>.internal`, aliases) and by a stable address,
see each other at those addresses, keep them across pause/resume and a server restart, a
fork joins its parent's networks with an address of its own, and nobody outside the network
reaches a member. Every address involved exists only inside the sandboxes' network slots;
nothing leaves the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
import requests
from e2b import Sandbox

from support.warren import API_KEY, warren_bin

# In the sandbox: a TCP server on 8000 that answers each connection with the address it
# came from, then closes.
WHO = r"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8000)); s.listen(16)
while True:
    c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()
"""

# In the sandbox: connect to argv[1]:8000 and print what the server said, or how it failed.
ASK = r"""
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8000), timeout=3)
    print("ok:" + s.recv(64).decode())
except socket.timeout:
    print("timeout")
except OSError as e:
    print("error:%s" % e.strerror)
"""


def api(server, method: str, path: str, body=None) -> requests.Response:
    return requests.request(method, server.url + path, json=body, headers={"X-API-KEY": API_KEY}, timeout=120)


def start_who(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/who.py", WHO)
    sbx.files.write("/tmp/ask.py", ASK)
    sbx.commands.run("python3 /tmp/who.py", background=True)
    sbx.commands.run(
        "for i in $(seq 100); do python3 /tmp/ask.py 127.0.0.1 | grep -q ^ok && exit 0; sleep 0.1; done; exit 1"
    )


def ask(sbx: Sandbox, host: str, port: int = 8000) -> str:
    sbx.files.write("/tmp/ask.py", ASK)
    return sbx.commands.run(f"python3 /tmp/ask.py {host} {port}", timeout=60).stdout.strip()


def resolve(sbx: Sandbox, name: str) -> str:
    r = sbx.commands.run(f"getent hosts {name} || true", timeout=30)
    return r.stdout.split()[0] if r.stdout.strip() else ""


@pytest.fixture
def network(server):
    name = "n" + uuid.uuid4().hex[:10]
    r = api(server, "POST", "/v1/networks", {"name": name})
    assert r.status_code == 201, r.text
    yield r.json()
    # Members are killed by the tests; the network goes with them.
    api(server, "DELETE", f"/v1/networks/{name}")


def members(server, name: str) -> dict:
    r = api(server, "GET", f"/v1/networks/{name}")
    assert r.status_code == 200, r.text
    return {m["sandboxID"]: m for m in r.json()["members"]}


def test_members_reach_each_other_by_name_and_nobody_else_does(server, network):
    name = network["name"]
    a = Sandbox.create(timeout=300, metadata={"warren.networks": f"{name}:db"})
    b = Sandbox.create(timeout=300, metadata={"warren.networks": name})
    # The outsider is in a network of its own: membership of one opens no other.
    other = "n" + uuid.uuid4().hex[:10]
    assert api(server, "POST", "/v1/networks", {"name": other}).status_code == 201
    outsider = Sandbox.create(timeout=300, metadata={"warren.networks": other})
    try:
        m = members(server, name)
        a_addr, b_addr = m[a.sandbox_id]["address"], m[b.sandbox_id]["address"]
        assert m[a.sandbox_id]["names"] == [f"{a.sandbox_id}.{name}.internal", f"db.{name}.internal"]
        start_who(a)
        # By alias, by id, by address; a sees b at b's network address.
        assert resolve(b, f"db.{name}.internal") == a_addr
        assert resolve(b, f"{a.sandbox_id}.{name}.internal") == a_addr
        assert ask(b, f"db.{name}.internal") == f"ok:{b_addr}"
        assert ask(b, a_addr) == f"ok:{b_addr}"
        # Unknown names in the network: no answer, and nothing asked outside.
        assert resolve(b, f"nobody.{name}.internal") == ""
        # The outsider reaches neither the address nor a's names.
        out = ask(outsider, a_addr)
        assert not out.startswith("ok"), out
        assert resolve(outsider, f"db.{name}.internal") == ""
        assert resolve(outsider, f"{outsider.sandbox_id}.{other}.internal") == members(server, other)[outsider.sandbox_id]["address"]
        # b leaves: it no longer reaches a, and the open door closes at once.
        r = api(server, "DELETE", f"/v1/networks/{name}/members/{b.sandbox_id}")
        assert r.status_code == 204, r.text
        assert not ask(b, a_addr).startswith("ok")
        # ... and joins again through the API, with an address (maybe another) of its own.
        r = api(server, "POST", f"/v1/networks/{name}/members", {"sandboxID": b.sandbox_id, "alias": "web"})
        assert r.status_code == 201, r.text
        b_addr = r.json()["address"]
        assert ask(b, f"db.{name}.internal") == f"ok:{b_addr}"
        assert resolve(a, f"web.{name}.internal") == b_addr
        # A network with members is not deleted.
        assert api(server, "DELETE", f"/v1/networks/{name}").status_code == 409
    finally:
        for s in (a, b, outsider):
            s.kill()
    assert members(server, name) == {}, "killed sandboxes leave their networks"
    assert api(server, "DELETE", f"/v1/networks/{name}").status_code == 204
    assert api(server, "DELETE", f"/v1/networks/{other}").status_code == 204
    assert api(server, "GET", f"/v1/networks/{name}").status_code == 404


def test_addresses_survive_pause_resume_and_a_fork_joins_with_its_own(server, network):
    name = network["name"]
    a = Sandbox.create(timeout=300, metadata={"warren.networks": name})
    b = Sandbox.create(timeout=300, metadata={"warren.networks": name})
    children = []
    try:
        start_who(a)
        a_addr = members(server, name)[a.sandbox_id]["address"]
        b_addr = members(server, name)[b.sandbox_id]["address"]
        a.pause()
        assert not ask(b, a_addr).startswith("ok"), "a paused sandbox answers nothing"
        a = Sandbox.connect(a.sandbox_id, timeout=300)
        # Its server may have been restarted by a filesystem-only resume; start it again.
        if not ask(a, "127.0.0.1").startswith("ok"):
            start_who(a)
        assert members(server, name)[a.sandbox_id]["address"] == a_addr
        assert ask(b, f"{a.sandbox_id}.{name}.internal") == f"ok:{b_addr}"
        # A fork of b is in the network at a new address, and a sees it there.
        children = b.fork()
        child = children[0]
        child_addr = members(server, name)[child.sandbox_id]["address"]
        assert child_addr not in (a_addr, b_addr)
        assert ask(child, a_addr) == f"ok:{child_addr}"
    finally:
        for s in (a, b, *children):
            s.kill()


def test_the_create_extension_the_cli_and_bad_input(server, network):
    name = network["name"]
    warren = warren_bin()
    env = dict(os.environ, WARREN_API_KEY=API_KEY)
    cli = lambda *args: subprocess.run(  # noqa: E731
        [warren, *args, "--server", server.url], env=env, capture_output=True, text=True, timeout=300
    )
    r = api(server, "POST", "/v2/sandboxes", {"templateID": "base", "timeout": 300, "networks": [{"network": name, "alias": "api"}]})
    assert r.status_code == 201, r.text
    a_id = r.json()["sandboxID"]
    made = cli("sandbox", "create", "--network", name)
    assert made.returncode == 0, made.stderr
    b_id = made.stdout.strip()
    try:
        info = cli("network", "info", name)
        assert info.returncode == 0 and f"api.{name}.internal" in info.stdout and b_id in info.stdout, info.stdout
        listed = json.loads(cli("network", "list", "--json").stdout)
        assert any(n["name"] == name and len(n["members"]) == 2 for n in listed)
        left = cli("network", "leave", name, b_id)
        assert left.returncode == 0, left.stderr
        joined = cli("network", "join", name, b_id, "--alias", "worker")
        assert joined.returncode == 0 and joined.stdout.strip().startswith("10."), joined.stdout + joined.stderr
        # Bad input: a clear error, nothing created.
        assert api(server, "POST", "/v1/networks", {"name": "Not A Label"}).status_code == 400
        assert api(server, "POST", "/v1/networks", {"name": name}).status_code == 409
        assert api(server, "POST", "/v1/networks", {"name": "x", "ports": [0]}).status_code == 400
        assert api(server, "POST", "/v1/networks", {"name": "y", "bogus": 1}).status_code in (400, 422)
        r = api(server, "POST", f"/v1/networks/{name}/members", {"sandboxID": b_id, "alias": "api"})
        assert r.status_code == 409, r.text
        r = api(server, "POST", "/v2/sandboxes", {"templateID": "base", "networks": ["no-such-net"]})
        assert r.status_code == 404 and "no-such-net" in r.json()["message"], r.text
        r = api(server, "POST", "/v2/sandboxes", {"templateID": "base", "metadata": {"warren.networks": ":x"}})
        assert r.status_code == 400, r.text
        assert api(server, "GET", "/v1/networks/nope").status_code == 404
    finally:
        for i in (a_id, b_id):
            api(server, "DELETE", f"/sandboxes/{i}")


def test_networks_and_their_peers_survive_a_server_restart(server, network):
    name = network["name"]
    a = Sandbox.create(timeout=600, metadata={"warren.networks": name})
    b = Sandbox.create(timeout=600, metadata={"warren.networks": name})
    try:
        start_who(a)
        m = members(server, name)
        server.restart()
        assert members(server, name) == m
        b = Sandbox.connect(b.sandbox_id)
        assert ask(b, f"{a.sandbox_id}.{name}.internal") == f"ok:{m[b.sandbox_id]['address']}"
    finally:
        for s in (a, b):
            s.kill()

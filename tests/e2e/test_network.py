"""Egress policy end to end through the unmodified E2B SDK, on the server's runtime.

"The internet" is a network namespace this module creates: two servers on TEST-NET addresses
(198.51.100.2 on the link, 203.0.113.7 routed through it), each answering TCP on 8080 with the
address it was reached at and echoing UDP on 5353. The host routes only those two addresses
to it, and every test checks that before sending anything; nothing goes anywhere else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import requests
from e2b import Sandbox

from support.warren import require

NEAR = "198.51.100.2"
FAR = "203.0.113.7"
HOST_SIDE = "198.51.100.1"

SERVER = r"""
import socket, sys, threading
def tcp(addr):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 8080)); s.listen(64)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c, addr), daemon=True).start()
def serve(c, addr):
    with c:
        f = c.makefile("rwb")
        for line in f:
            f.write(("%s %s" % (addr, line.decode().strip())).encode() + b"\n"); f.flush()
def udp(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, 5353))
    while True:
        d, peer = s.recvfrom(512); s.sendto(d, peer)
for a in sys.argv[1:]:
    threading.Thread(target=tcp, args=(a,), daemon=True).start()
    threading.Thread(target=udp, args=(a,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

# Run inside the sandbox: one probe, its outcome and how long it took, as JSON.
PROBE = r"""
import json, socket, sys, time
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.monotonic()
try:
    if kind == "tcp":
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"hi\n"); out = "ok:" + s.makefile().readline().strip()
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
        out = "timeout"
        for _ in range(3):
            try:
                s.sendto(b"ping", (host, port)); s.recvfrom(64); out = "ok"; break
            except socket.timeout:
                pass
except ConnectionRefusedError:
    out = "refused"
except socket.timeout:
    out = "timeout"
except OSError as e:
    out = "error:%d" % e.errno
print(json.dumps({"out": out, "secs": time.monotonic() - t}))
"""

# Run inside the sandbox: one DNS question (type A) for a name to the first nameserver of
# /etc/resolv.conf, over UDP or TCP; prints the answer's response code (5: REFUSED).
ASK = r"""
import random, socket, struct, sys
name, via = sys.argv[1], sys.argv[2]
server = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
qid = random.randrange(65536)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
if via == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    s.sendto(q, (server, 53)); a = s.recv(1500)
else:
    s = socket.create_connection((server, 53), timeout=5)
    s.sendall(struct.pack(">H", len(q)) + q)
    n = struct.unpack(">H", s.recv(2))[0]; a = s.recv(n)
assert struct.unpack(">H", a[:2])[0] == qid
print(a[3] & 0x0F)
"""

# Run in the background inside the sandbox: holds one connection open, sending a line every
# 0.2 s, and writes how it ended to a file.
HOLD = r"""
import errno, socket, sys, time
host, out = sys.argv[1], sys.argv[2]
s = socket.create_connection((host, 8080), timeout=5); f = s.makefile("rwb")
def say(w): open(out, "w").write(w)
try:
    while True:
        f.write(b"x\n"); f.flush()
        if not f.readline():
            say("closed"); break
        say("connected"); time.sleep(0.2)
except OSError as e:
    say("cut:" + errno.errorcode.get(e.errno, str(e.errno)))
"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


@pytest.fixture(scope="module")
def internet(server):
    require("iproute2 (`ip`)", shutil.which("ip") is not None)
    name = "wti" + uuid.uuid4().hex[:8]
    proc = None
    try:
        sh("ip", "netns", "add", name)
        sh("ip", "link", "add", "name", name, "type", "veth", "peer", "name", "eth0", "netns", name)
        sh("ip", "address", "add", f"{HOST_SIDE}/30", "dev", name)
        sh("ip", "link", "set", "dev", name, "up")
        sh("ip", "route", "add", f"{FAR}/32", "via", NEAR, "dev", name)
        # Replies to the sandboxes come back through this link (forwarding is per link here).
        sh("sysctl", "-qw", f"net.ipv4.conf.{name}.forwarding=1")
        for cmd in (
            ["link", "set", "dev", "lo", "up"],
            ["address", "add", f"{NEAR}/30", "dev", "eth0"],
            ["address", "add", f"{FAR}/32", "dev", "eth0"],
            ["link", "set", "dev", "eth0", "up"],
        ):
            sh("ip", "-n", name, *cmd)
        # The safety net: both addresses must lead into our namespace, nowhere else.
        for target in (NEAR, FAR):
            route = sh("ip", "route", "get", target).stdout
            assert f"dev {name} " in route, f"{target} is not routed to the test namespace: {route}"
        proc = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", SERVER, NEAR, FAR],
            stdout=subprocess.PIPE, text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        yield name
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        sh("ip", "link", "del", "dev", name, check=False)
        sh("ip", "netns", "del", name, check=False)


def probe(sbx: Sandbox, kind: str, host: str, port: int) -> dict:
    r = sbx.commands.run(f"python3 /tmp/probe.py {kind} {host} {port}", timeout=30)
    return json.loads(r.stdout)


def new_sandbox(**kw) -> Sandbox:
    sbx = Sandbox.create(timeout=300, **kw)
    sbx.files.write("/tmp/probe.py", PROBE)
    sbx.files.write("/tmp/hold.py", HOLD)
    return sbx


def assert_reached(sbx: Sandbox, host: str) -> None:
    got = probe(sbx, "tcp", host, 8080)
    assert got["out"] == f"ok:{host} hi", got
    assert probe(sbx, "udp", host, 5353)["out"] == "ok"


def assert_refused(sbx: Sandbox, host: str) -> None:
    got = probe(sbx, "tcp", host, 8080)
    # A reset at once: the client fails instead of hanging until its timeout.
    assert got["out"] == "refused", got
    assert got["secs"] < 2, got
    assert probe(sbx, "udp", host, 5353)["out"] != "ok"


def flows_of(sbx: Sandbox, until) -> list:
    """The sandbox's flow log through the API, once `until(entries)` holds (entries decided by
    address come from the kernel's log a moment after the packet), or as it is after 10 s."""
    url = f"{os.environ['E2B_API_URL']}/sandboxes/{sbx.sandbox_id}/network/flows"
    for _ in range(100):
        got = requests.get(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
        assert got.status_code == 200, got.text
        flows = got.json()["flows"]
        if until(flows):
            break
        time.sleep(0.1)
    return flows


def test_deny_out_refuses_at_once_and_allow_beats_deny(internet):
    sbx = new_sandbox(network={"deny_out": [FAR]})
    try:
        assert_reached(sbx, NEAR)
        assert_refused(sbx, FAR)
        assert sbx.get_info().network.get("deny_out") == [FAR]
        # What nftables alone decided (no name involved) is in the flow log too, TCP and UDP.
        want = {("tcp", f"{NEAR}:8080", "allowed"), ("udp", f"{NEAR}:5353", "allowed"),
                ("tcp", f"{FAR}:8080", "denied"), ("udp", f"{FAR}:5353", "denied")}
        seen = lambda fs: {(f["kind"], f.get("destination"), f["verdict"]) for f in fs if f["via"] == "address"}
        flows = flows_of(sbx, lambda fs: want <= seen(fs))
        assert want <= seen(flows), flows
        assert all("policy" in f["reason"] for f in flows if f["verdict"] == "denied"), flows
    finally:
        sbx.kill()
    only_far = new_sandbox(network={"allow_out": [f"{FAR}/32"], "deny_out": ["0.0.0.0/0"]})
    try:
        assert_reached(only_far, FAR)
        assert_refused(only_far, NEAR)
    finally:
        only_far.kill()


def test_internet_access_off_keeps_allow_out(internet):
    sbx = new_sandbox(allow_internet_access=False, network={"allow_out": [NEAR]})
    try:
        assert_reached(sbx, NEAR)
        assert_refused(sbx, FAR)
    finally:
        sbx.kill()


def wait_for_file(sbx: Sandbox, path: str, prefix: str, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline:
        text = sbx.commands.run(f"cat {path} 2>/dev/null || true").stdout
        if text.startswith(prefix):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{path} never started with {prefix!r}: {text!r}")


def test_update_network_replaces_the_policy_and_cuts_open_connections(internet, server):
    sbx = new_sandbox()
    try:
        assert_reached(sbx, NEAR)
        sbx.commands.run("python3 /tmp/hold.py %s /tmp/hold.out" % NEAR, background=True)
        wait_for_file(sbx, "/tmp/hold.out", "connected")

        sbx.update_network({"deny_out": [NEAR]})
        # The open connection's next packet is refused: the sandbox sees a reset.
        assert wait_for_file(sbx, "/tmp/hold.out", "cut:") == "cut:ECONNRESET"
        assert_refused(sbx, NEAR)
        assert_reached(sbx, FAR)

        # The policy is the server's record: a restart puts it back on the same sandbox.
        server.restart()
        again = Sandbox.connect(sbx.sandbox_id)
        assert_refused(again, NEAR)
        assert again.get_info().network.get("deny_out") == [NEAR]

        # A second update replaces the first: nothing is denied any more.
        again.update_network({})
        assert_reached(again, NEAR)
        assert again.get_info().network.get("deny_out") is None
    finally:
        sbx.kill()


def test_paused_sandbox_gets_its_new_policy_on_resume(internet):
    sbx = new_sandbox()
    try:
        assert_reached(sbx, FAR)
        sbx.pause()
        # Stored while paused, applied before the sandbox runs again.
        sbx.update_network({"deny_out": [FAR]})
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert_refused(resumed, FAR)
        assert_reached(resumed, NEAR)
    finally:
        sbx.kill()


def test_cli_sets_and_replaces_the_policy(internet, server):
    from test_cli import warren

    created = warren(server, "sandbox", "create", "--deny-out", FAR, "--timeout", "300")
    assert created.returncode == 0, created.stderr
    sid = created.stdout.strip()
    try:
        sbx = Sandbox.connect(sid)
        sbx.files.write("/tmp/probe.py", PROBE)
        assert_refused(sbx, FAR)
        assert_reached(sbx, NEAR)
        changed = warren(server, "sandbox", "network", sid, "--allow-out", FAR, "--no-internet")
        assert changed.returncode == 0, changed.stderr
        assert_reached(sbx, FAR)
        assert_refused(sbx, NEAR)
        bad = warren(server, "sandbox", "network", sid, "--deny-out", "198.51.100.0/33")
        assert bad.returncode != 0 and "invalid denyOut entry" in bad.stderr, bad.stderr
    finally:
        warren(server, "sandbox", "kill", sid)


def test_domain_rules_refuse_other_names_without_asking_anyone(internet):
    """With rules by name, every DNS query goes to the server's per-sandbox resolver: a name the
    policy does not allow is REFUSED there and never forwarded (no exfiltration by query), over
    UDP and TCP. Allowed names are resolved upstream and pinned (crates/warren-net/tests/names.rs,
    against a test DNS server; here upstream is the host's real resolver, which no test may ask
    for anything)."""
    sbx = new_sandbox(network={"allow_out": ["allowed.example.test", NEAR], "deny_out": ["0.0.0.0/0"]})
    try:
        sbx.files.write("/tmp/ask.py", ASK)
        for via in ("udp", "tcp"):
            r = sbx.commands.run(f"python3 /tmp/ask.py denied.example.test {via}", timeout=30)
            assert r.stdout.strip() == "5", (via, r.stdout, r.stderr)
        # Addresses: only allowOut's; an address known from elsewhere (/etc/hosts) is refused.
        assert_reached(sbx, NEAR)
        assert_refused(sbx, FAR)
        assert sbx.get_info().network.get("allow_out") == ["allowed.example.test", NEAR]
    finally:
        sbx.kill()


# Run inside the sandbox: one connection that names `name` first, as HTTP Host or TLS SNI;
# prints how it ended.
NAMED = r"""
import socket, ssl, sys
how, name, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s = socket.create_connection((host, port), timeout=5)
try:
    if how == "host":
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name).encode())
        print("answer:" + s.recv(100).decode().strip())
    else:
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        ctx.wrap_socket(s, server_hostname=name)
        print("handshake")
except ConnectionResetError:
    print("reset")
except (ssl.SSLError, OSError) as e:
    print("error:%s" % e)
"""


def test_tcp_names_are_checked_by_host_and_sni(internet, server):
    """With rules by name, TCP that may pass goes through the server's egress proxy: a
    connection whose HTTP Host or TLS SNI names a denied name is reset, whatever address it
    went to; one without a name (here the test server's line protocol) goes on by address.
    The re-dial of allowed names by their own addresses needs a DNS answer, which only a test
    DNS server may give (crates/warren-net/tests/names.rs)."""
    sbx = new_sandbox(network={"deny_out": ["denied.example.test"]})
    try:
        sbx.files.write("/tmp/named.py", NAMED)
        assert probe(sbx, "tcp", FAR, 8080)["out"] == f"ok:{FAR} hi"
        for how in ("host", "sni"):
            r = sbx.commands.run(f"python3 /tmp/named.py {how} denied.example.test {FAR} 8080", timeout=30)
            assert r.stdout.strip() == "reset", (how, r.stdout, r.stderr)
        # A connection that names nobody reaches the server (which answers the request line).
        r = sbx.commands.run(f"python3 /tmp/named.py host {FAR} {FAR} 8080", timeout=30)
        assert r.stdout.startswith(f"answer:{FAR} GET / HTTP/1.1"), r.stdout
        # Each decision is in the sandbox's flow log, through the API and the CLI.
        url = f"{os.environ['E2B_API_URL']}/sandboxes/{sbx.sandbox_id}/network/flows"
        got = requests.get(url, headers={"X-API-KEY": os.environ["E2B_API_KEY"]}, timeout=10)
        assert got.status_code == 200, got.text
        flows = got.json()["flows"]
        denied = {(f["via"], f["name"]) for f in flows if f["verdict"] == "denied"}
        assert denied == {("http-host", "denied.example.test"), ("tls-sni", "denied.example.test")}, flows
        assert any(f["via"] == "address" and f["destination"] == f"{FAR}:8080" and f["verdict"] == "allowed"
                   for f in flows), flows
        from test_cli import warren

        cli = warren(server, "sandbox", "flows", sbx.sandbox_id)
        assert cli.returncode == 0, cli.stderr
        assert "tcp denied  denied.example.test at" in cli.stdout, cli.stdout
    finally:
        sbx.kill()

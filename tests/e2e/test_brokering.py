"""Secrets brokered at egress, end to end with the unmodified SDK (`Secret`, `network.rules`).

"The internet" is a network namespace this module creates, holding TEST-NET address
198.51.100.2: an HTTPS server there (its certificate from a CA the test makes, given to
`warren serve --egress-ca`) records the `Authorization` header of every request, and a DNS
stub beside it answers names under `brokered.test` with that address (`warren serve --dns`). The host routes only
that address to the namespace, checked before anything is sent.

What is checked: the rule's host receives the secret's value (of the moment: an update
applies to the next request); a host without a rule receives the placeholder; the value is
nowhere in the sandbox (environment, files, processes) nor in a paused sandbox's memory
image or anything else the server wrote.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
from e2b import Sandbox, Secret

from support.warren import Server, require

NEAR = "198.51.100.2"
HOST_SIDE = "198.51.100.1"
DOMAIN = "brokered.test"

# Run in the test namespace: HTTPS on 443 printing the Authorization header of every GET (one
# line each, for the test) and answering with its SHA-256, so the sandbox never sees a value.
SERVER = r"""
import hashlib, http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        got = self.headers.get("Authorization", "-")
        print(got, flush=True)
        body = hashlib.sha256(got.encode()).hexdigest().encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[2], sys.argv[3])
s = http.server.ThreadingHTTPServer((sys.argv[1], 443), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print("ready", flush=True)
s.serve_forever()
"""

# Run inside the sandbox: GET https://<host>/ with the placeholder as its Authorization, print
# the answer (the header the server saw). Python's ssl module uses the store the agent set,
# or the CA file given as a third argument (a host the proxy does not intercept).
FETCH = r"""
import ssl, sys, urllib.request
req = urllib.request.Request("https://%s/" % sys.argv[1], headers={"Authorization": "Bearer ${e2b.secrets.%s}" % sys.argv[2]})
ctx = ssl.create_default_context(cafile=sys.argv[3] if len(sys.argv) > 3 else None)
try:
    print(urllib.request.urlopen(req, timeout=20, context=ctx).read().decode())
except Exception as e:
    print("error:", e)
"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def make_certs(d: str) -> tuple[str, str, str]:
    """A CA and a leaf for *.brokered.test it signs, with openssl."""
    require("openssl", shutil.which("openssl") is not None)
    ca_key, ca, key, csr, crt = (os.path.join(d, n) for n in ("ca.key", "ca.crt", "leaf.key", "leaf.csr", "leaf.crt"))
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=brokering test CA",
       "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", key, "-out", csr, "-subj", f"/CN=api.{DOMAIN}")
    ext = os.path.join(d, "ext.cnf")
    with open(ext, "w") as f:
        f.write(f"subjectAltName=DNS:api.{DOMAIN},DNS:other.{DOMAIN}\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    sh("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
       "-out", crt, "-days", "2", "-extfile", ext)
    return ca, crt, key


@pytest.fixture(scope="module")
def internet(server):
    require("iproute2 (`ip`)", shutil.which("ip") is not None)
    name = "wtb" + uuid.uuid4().hex[:8]
    work = tempfile.mkdtemp(prefix="warren-brokering-")
    proc = stub = srv = None
    try:
        ca, crt, key = make_certs(work)
        sh("ip", "netns", "add", name)
        sh("ip", "link", "add", "name", name, "type", "veth", "peer", "name", "eth0", "netns", name)
        sh("ip", "address", "add", f"{HOST_SIDE}/30", "dev", name)
        sh("ip", "link", "set", "dev", name, "up")
        sh("sysctl", "-qw", f"net.ipv4.conf.{name}.forwarding=1")
        for cmd in (["link", "set", "dev", "lo", "up"], ["address", "add", f"{NEAR}/30", "dev", "eth0"],
                    ["link", "set", "dev", "eth0", "up"]):
            sh("ip", "-n", name, *cmd)
        route = sh("ip", "route", "get", NEAR).stdout
        assert f"dev {name} " in route, f"{NEAR} is not routed to the test namespace: {route}"
        proc = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", SERVER, NEAR, crt, key],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        # The sandboxes' DNS server (and the egress proxy's) in the namespace too.
        here = os.path.dirname(os.path.abspath(__file__))
        stub = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c",
             "import sys, threading; sys.path.insert(0, sys.argv[1]); from dnsstub import StubDns; "
             "StubDns(sys.argv[2], sys.argv[3], sys.argv[2]); print('ready', flush=True); threading.Event().wait()",
             here, NEAR, DOMAIN],
            stdout=subprocess.PIPE, text=True)
        assert stub.stdout.readline().strip() == "ready"
        server.stop()
        srv = Server(server.data_dir, server.extra_args + ("--dns", NEAR, "--egress-ca", ca))
        srv.port, srv.url = server.port, server.url
        srv.start()
        proc.ca = ca
        yield proc
    finally:
        if srv is not None:
            srv.stop()
        if proc is not None:
            proc.kill()
            proc.wait()
        if stub is not None:
            stub.kill()
            stub.wait()
        sh("ip", "link", "del", "dev", name, check=False)
        sh("ip", "netns", "del", name, check=False)
        shutil.rmtree(work, ignore_errors=True)
        if srv is not None:
            server.start()


def brokered_sandbox():
    """A new secret and a sandbox whose rule sets it as api.<DOMAIN>'s Authorization."""
    name = f"key_{uuid.uuid4().hex[:8]}"
    value = f"sk-{uuid.uuid4().hex}"
    secret = Secret.create(name, value)
    rules = {f"api.{DOMAIN}": [{"transform": {"headers": {"Authorization": "Bearer " + Secret.fill(name)}}}]}
    try:
        return name, value, secret, rules, Sandbox.create(timeout=300, network={"rules": rules})
    except BaseException:
        Secret.destroy(secret.secret_id)
        raise


def digest(header: str) -> str:
    return hashlib.sha256(header.encode()).hexdigest()


def heard(proc, n: int) -> list[str]:
    return [proc.stdout.readline().strip() for _ in range(n)]


def test_the_rule_host_gets_the_value_and_the_sandbox_never_holds_it(internet, server):
    name, value, secret, rules, sbx = brokered_sandbox()
    try:
        sbx.files.write("/tmp/fetch.py", FETCH)
        assert sbx.get_info().network.get("rules") == rules

        got = sbx.commands.run(f"python3 /tmp/fetch.py api.{DOMAIN} {name}", timeout=60).stdout.strip()
        assert got == digest(f"Bearer {value}"), got
        assert heard(internet, 1) == [f"Bearer {value}"]

        # Updated while the sandbox runs: the next request carries the new value.
        Secret.update(secret.secret_id, value + "-2")
        got = sbx.commands.run(f"python3 /tmp/fetch.py api.{DOMAIN} {name}", timeout=60).stdout.strip()
        assert got == digest(f"Bearer {value}-2"), got
        assert heard(internet, 1) == [f"Bearer {value}-2"]

        # A host without a rule (the same server) is not intercepted: its own certificate
        # (the test CA's) reaches the sandbox, and it gets the placeholder, not the value.
        with open(internet.ca) as f:
            sbx.files.write("/tmp/test-ca.pem", f.read())
        got = sbx.commands.run(f"python3 /tmp/fetch.py other.{DOMAIN} {name} /tmp/test-ca.pem", timeout=60).stdout.strip()
        assert got == digest("Bearer ${e2b.secrets.%s}" % name), got
        assert heard(internet, 1) == ["Bearer ${e2b.secrets.%s}" % name]

        # The value is nowhere in the sandbox: environment, processes, files. Nothing in the
        # sandbox may be given the whole value to look for (it would then be in its memory):
        # it looks for the first half, and the host reads what it finds.
        for check in ["env", "cat /proc/*/environ /proc/*/cmdline 2>/dev/null; true"]:
            out = sbx.commands.run(check, timeout=120, user="root").stdout
            assert value not in out, check
        half = value[: len(value) // 2]
        # Everywhere a sandbox writes (the image below is the template's).
        listed = sbx.commands.run(
            f"grep -rlF -- '{half}' /etc /home /root /tmp /var /run /usr/local 2>/dev/null; true",
            timeout=120, user="root").stdout.split()
        for path in listed:
            assert value not in sbx.files.read(path, user="root"), path
        # Nor in what the server keeps of a paused sandbox (its memory image on the vm
        # runtime), its store or its log.
        sbx.pause()
        kept = [p for p in glob.glob(os.path.join(server.data_dir, "warren.db*")) + [server.log.name]]
        for top in (server.data_dir, "/run/warren"):
            for d, dirs, files in os.walk(top):
                dirs[:] = [x for x in dirs if x not in ("images", "templates", "oci")]
                if sbx.sandbox_id in d:
                    kept += [os.path.join(d, f) for f in files]
        assert len(kept) > 2, kept
        found = sh("grep", "-laF", "--", value, *kept, check=False)
        assert found.stdout == "", found.stdout
        sbx = Sandbox.connect(sbx.sandbox_id)
        got = sbx.commands.run(f"python3 /tmp/fetch.py api.{DOMAIN} {name}", timeout=60).stdout.strip()
        assert got == digest(f"Bearer {value}-2"), got
        assert heard(internet, 1) == [f"Bearer {value}-2"]

        # A deleted secret: the request is answered 502, the host hears nothing.
        Secret.destroy(secret.secret_id)
        got = sbx.commands.run(f"python3 /tmp/fetch.py api.{DOMAIN} {name}", timeout=60).stdout.strip()
        assert got.startswith("error:") and "502" in got, got
    finally:
        sbx.kill()
        Secret.destroy(secret.secret_id)


# Run inside the sandbox: requests on one TLS connection to the rule host (`argv[1]`), the
# second naming another host (`argv[2]`) in its `Host`; then a new connection whose first
# request names the other host. Prints what each got.
PROBE = r"""
import http.client, ssl, sys
host, other, name = sys.argv[1], sys.argv[2], sys.argv[3]
def get(conn, h):
    conn.putrequest("GET", "/", skip_host=True)
    conn.putheader("Host", h)
    conn.putheader("Authorization", "Bearer ${e2b.secrets.%s}" % name)
    conn.endheaders()
    return conn.getresponse().read().decode()
for label, hosts in (("same", (host, other)), ("sni", (other,))):
    conn = http.client.HTTPSConnection(host, 443, timeout=20, context=ssl.create_default_context())
    for i, h in enumerate(hosts):
        try:
            print(label, i, get(conn, h))
        except Exception as e:
            print(label, i, "error", type(e).__name__)
"""


def test_the_value_goes_only_with_requests_for_the_rule_host(internet, server):
    """Threat model W3-H3: a front end that routes by `Host` (a CDN, shared hosting) would hand
    a request naming another host to that host's site, so such a request on a brokered
    connection, or one whose `Host` differs from the TLS server name, must never leave with
    the value: the connection is reset instead."""
    name, value, secret, rules, sbx = brokered_sandbox()
    try:
        sbx.files.write("/tmp/probe.py", PROBE)
        out = sbx.commands.run(f"python3 /tmp/probe.py api.{DOMAIN} other.{DOMAIN} {name}", timeout=90).stdout
        lines = out.strip().splitlines()
        assert lines[0] == f"same 0 {digest(f'Bearer {value}')}", out
        assert lines[1].startswith("same 1 error"), out
        assert lines[2].startswith("sni 0 error"), out
        # What the server heard: the first request only. A marker request (its own
        # placeholder, to a host without a rule) comes next, so nothing arrived in between.
        with open(internet.ca) as f:
            sbx.files.write("/tmp/test-ca.pem", f.read())
        sbx.files.write("/tmp/fetch.py", FETCH)
        sbx.commands.run(f"python3 /tmp/fetch.py other.{DOMAIN} marker /tmp/test-ca.pem", timeout=60)
        assert heard(internet, 2) == [f"Bearer {value}", "Bearer ${e2b.secrets.marker}"]
    finally:
        sbx.kill()
        Secret.destroy(secret.secret_id)

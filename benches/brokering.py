#!/usr/bin/env python3
"""Brokering benchmark: what a header rule (`network.rules`, a secret set at egress) costs a
sandbox's requests, beside the same requests without one, in one run.

  sudo .venv/bin/python benches/brokering.py                # ns runtime
  sudo .venv/bin/python benches/brokering.py --runtime vm --smoke

Creates a stand-in internet (a network namespace holding 198.51.100.2 with an HTTP server on
port 80, the same over TLS on 443 with a certificate from a CA this run makes, and a DNS server
answering `api.bench.test`), starts its own `warren serve --dns 198.51.100.2 --egress-ca <CA>`,
and measures from inside two sandboxes, one without rules (it reaches the server directly
and trusts the test CA) and one with a rule setting `Authorization` from a secret (the egress
proxy terminates its TLS with a leaf of the egress CA, dials the host itself, verifies it
and rewrites every request): a new connection + GET, and a GET on a kept-alive connection,
over HTTP and HTTPS. Prints medians and the ratio of the rule's to the plain one's; asserts
nothing but that numbers came out. Writes results.json to --out. Nothing is sent outside
the namespace: its route is checked first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.common import API_KEY, REPO_ROOT, Server  # noqa: E402

NEAR, HOST_SIDE, NAME = "198.51.100.2", "198.51.100.1", "api.bench.test"

# Runs inside the stand-in internet: DNS for argv[2] on argv[1]:53, HTTP on :80, HTTPS on :443
# (certificate argv[3], key argv[4]); every GET answers "ok" on a kept-alive connection.
INTERNET = r"""
import http.server, socket, ssl, sys, threading
addr, name, crt, key = sys.argv[1:5]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(1500)
        i, labels = 12, []
        while q[i]:
            labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
        question = q[12:i + 5]
        if ".".join(labels).lower() == name and q[i + 1:i + 3] == b"\x00\x01":
            a = (q[:2] + b"\x81\x80" + b"\x00\x01\x00\x01\x00\x00\x00\x00" + question
                 + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(addr))
        else:
            a = q[:2] + b"\x81\x80" + b"\x00\x01\x00\x00\x00\x00\x00\x00" + question
        s.sendto(a, peer)
threading.Thread(target=dns, daemon=True).start()
plain = http.server.ThreadingHTTPServer((addr, 80), H)
threading.Thread(target=plain.serve_forever, daemon=True).start()
tls = http.server.ThreadingHTTPServer((addr, 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(crt, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
print("ready", flush=True)
tls.serve_forever()
"""

# Runs in a sandbox: samples (ms) of new connection + GET and kept-alive GETs, as JSON.
PROBE = r"""
import http.client, json, ssl, sys, time
host, scheme, cafile, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl.create_default_context(cafile=None if cafile == "-" else cafile)
HDR = {"Authorization": "Bearer ${e2b.secrets.bench_key}"}
def conn():
    if scheme == "https":
        return http.client.HTTPSConnection(host, 443, context=ctx, timeout=30)
    return http.client.HTTPConnection(host, 80, timeout=30)
def get(c):
    c.request("GET", "/", headers=HDR); r = c.getresponse(); body = r.read()
    assert r.status == 200 and body == b"ok", (r.status, body)
new = []
for _ in range(n):
    t = time.perf_counter(); c = conn(); get(c); c.close(); new.append((time.perf_counter() - t) * 1000)
keep = []
c = conn(); get(c)
for _ in range(n * 4):
    t = time.perf_counter(); get(c); keep.append((time.perf_counter() - t) * 1000)
print(json.dumps({"new_ms": new, "keep_ms": keep}))
"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def make_certs(d: str) -> tuple[str, str, str]:
    ca_key, ca, key, csr, crt, ext = (os.path.join(d, n) for n in
                                      ("ca.key", "ca.crt", "leaf.key", "leaf.csr", "leaf.crt", "ext.cnf"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=bench CA",
       "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    sh("openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={NAME}")
    with open(ext, "w") as f:
        f.write(f"subjectAltName=DNS:{NAME}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    sh("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", crt,
       "-days", "2", "-extfile", ext)
    return ca, crt, key


class Internet:
    def __init__(self, crt: str, key: str) -> None:
        self.name = "wbb" + uuid.uuid4().hex[:8]
        self.crt, self.key, self.proc = crt, key, None

    def __enter__(self) -> "Internet":
        n = self.name
        sh("ip", "netns", "add", n)
        sh("ip", "link", "add", "name", n, "type", "veth", "peer", "name", "eth0", "netns", n)
        sh("ip", "address", "add", f"{HOST_SIDE}/30", "dev", n)
        sh("ip", "link", "set", "dev", n, "up")
        sh("sysctl", "-qw", f"net.ipv4.conf.{n}.forwarding=1")
        for cmd in (["link", "set", "dev", "lo", "up"], ["address", "add", f"{NEAR}/30", "dev", "eth0"],
                    ["link", "set", "dev", "eth0", "up"]):
            sh("ip", "-n", n, *cmd)
        route = sh("ip", "route", "get", NEAR).stdout
        if f"dev {n} " not in route:
            raise SystemExit(f"{NEAR} is not routed to the benchmark namespace: {route}")
        self.proc = subprocess.Popen(["ip", "netns", "exec", n, sys.executable, "-c", INTERNET, NEAR, NAME,
                                      self.crt, self.key], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        sh("ip", "link", "del", "dev", self.name, check=False)
        sh("ip", "netns", "del", self.name, check=False)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["ns", "vm"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="tiny counts; exit non-zero if numbers are missing")
    ap.add_argument("--out")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("openssl") is None:
        print("benches/brokering.py must run as root with iproute2 and openssl", file=sys.stderr)
        return 2
    n = 3 if args.smoke else 50
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", "brokering-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="warren-bench-brokering-")
    results: dict = {"runtime": args.runtime, "smoke": args.smoke, "n": n}
    try:
        ca, crt, key = make_certs(work)
        with Internet(crt, key):
            server = Server(args.bin, args.data_dir, os.path.join(out, "serve.log"), 8, args.runtime,
                            extra_args=["--dns", NEAR, "--egress-ca", ca])
            server.start()
            os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
            from e2b import Sandbox, Secret
            secret = Secret.create(f"bench_key_{uuid.uuid4().hex[:6]}", "sk-" + uuid.uuid4().hex)
            # "scheme": "http" so the plain HTTP rows are brokered too (rules are TLS-only by default).
            rules = {NAME: [{"transform": {"headers": {"Authorization": "Bearer " + Secret.fill(secret.name)}},
                             "scheme": "http"}]}
            try:
                with open(ca) as f:
                    ca_pem = f.read()
                for label, kw, cafile in (("plain", {}, "/tmp/bench-ca.pem"),
                                          ("rule", {"network": {"rules": rules}}, "-")):
                    sbx = Sandbox.create(timeout=900, **kw)
                    try:
                        sbx.files.write("/tmp/probe.py", PROBE)
                        sbx.files.write("/tmp/bench-ca.pem", ca_pem)
                        for scheme in ("http", "https"):
                            r = sbx.commands.run(f"python3 /tmp/probe.py {NAME} {scheme} {cafile} {n}", timeout=900)
                            results[f"{label}_{scheme}"] = json.loads(r.stdout)
                    finally:
                        sbx.kill()
            finally:
                Secret.destroy(secret.secret_id)
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nbrokering benchmark, {args.runtime} runtime{' (smoke)' if args.smoke else ''}; medians (ms),"
          " ratio of the rule's to the plain request's")
    print(f"{'':34}{'no rule':>10}{'header rule':>14}{'ratio':>8}")
    missing = False
    for scheme in ("http", "https"):
        for key, title in (("new_ms", "new connection + GET"), ("keep_ms", "GET, kept-alive connection")):
            a = median(results[f"plain_{scheme}"][key])
            b = median(results[f"rule_{scheme}"][key])
            missing |= a != a or b != b
            print(f"{scheme.upper() + ' ' + title:34}{a:10.2f}{b:14.2f}{b / a if a else float('nan'):7.1f}x")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {out}/results.json")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Network benchmark: a sandbox's egress under each kind of policy, beside the host itself.

  sudo .venv/bin/python benches/network.py                  # ns runtime
  sudo .venv/bin/python benches/network.py --runtime vm --smoke

Creates a stand-in internet (a network namespace with an HTTP server on 203.0.113.7:80 and a
DNS server on 198.51.100.2 that answers `bench.test`), starts its own `warren serve` with
`--dns 198.51.100.2`, and measures from inside a sandbox with no policy, with a CIDR policy
(allowOut 203.0.113.7 and the DNS server, denyOut 0.0.0.0/0) and with a domain policy (allowOut bench.test:
the resolver pins it, and TCP goes through the egress proxy), and the same probe run on the
host: connection + empty GET (time to the response), GET of 1 MiB, GET of 100 MiB (MB/s), and
a DNS answer (through the sandbox's resolver beside a direct query). Then ingress: requests
per second to a web server in a sandbox (a 1 KiB file, one keep-alive connection, sequential)
through the proxy with E2B's routing headers (plain HTTP), and in domain mode through the TLS
listener (`{port}-{id}.<domain>` by Host and SNI) over HTTP/1.1 and HTTP/2. Prints medians
and the ratio of each to the host's (for ingress: to header routing); asserts nothing but
that numbers came out. Writes results.json
to --out (default benches/results/network-<timestamp>/). Nothing is sent outside the
namespace: its routes are checked before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.common import API_KEY, REPO_ROOT, Server  # noqa: E402

NEAR, FAR, HOST_SIDE, NAME = "198.51.100.2", "203.0.113.7", "198.51.100.1", "bench.test"

# Runs inside the stand-in internet: DNS on argv[1], HTTP on argv[2]:80 (`GET /<MiB>`).
INTERNET = r"""
import socket, sys, threading
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
BLOCK = bytes(range(256)) * 4096
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        mib = int(self.path.strip("/") or "0")
        self.send_response(200); self.send_header("Content-Length", str(mib << 20)); self.end_headers()
        for _ in range(mib):
            self.wfile.write(BLOCK)
    def log_message(self, *a):
        pass
def dns(addr, answer, known):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(1500)
        i, labels = 12, []
        while q[i]:
            labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
        question = q[12:i + 5]
        if ".".join(labels).lower() == known:
            a = (q[:2] + b"\x81\x80" + b"\x00\x01\x00\x01\x00\x00\x00\x00" + question
                 + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton(answer))
        else:
            a = q[:2] + b"\x81\x83" + b"\x00\x01\x00\x00\x00\x00\x00\x00" + question
        s.sendto(a, peer)
threading.Thread(target=dns, args=(sys.argv[1], sys.argv[2], sys.argv[3]), daemon=True).start()
srv = ThreadingHTTPServer((sys.argv[2], 80), H)
print("ready", flush=True)
srv.serve_forever()
"""

# Runs in a sandbox and on the host: prints the samples as JSON.
PROBE = r"""
import json, random, socket, struct, sys, time
target, name, dns_server, n_conn, n_small, n_big = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7])
def get(mib):
    t = time.perf_counter()
    s = socket.create_connection((target, 80), timeout=30)
    s.sendall(("GET /%d HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (mib, name)).encode())
    got = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got += len(b)
    s.close()
    assert got >= mib << 20, got
    return time.perf_counter() - t
def ask():
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    t = time.perf_counter(); s.sendto(q, (dns_server, 53)); a = s.recv(1500); dt = time.perf_counter() - t
    assert a[:2] == q[:2] and a[3] & 0x0F == 0, a
    return dt
out = {
    "dns_ms": [ask() * 1000 for _ in range(n_conn)],
    "conn_ms": [get(0) * 1000 for _ in range(n_conn)],
    "get1_ms": [get(1) * 1000 for _ in range(n_small)],
    "get100_mbps": [100 * 1.048576 / get(100) for _ in range(n_big)],
}
print(json.dumps(out))
"""


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


class Internet:
    def __init__(self) -> None:
        self.name = "wnb" + uuid.uuid4().hex[:8]
        self.proc = None

    def __enter__(self) -> "Internet":
        n = self.name
        sh("ip", "netns", "add", n)
        sh("ip", "link", "add", "name", n, "type", "veth", "peer", "name", "eth0", "netns", n)
        sh("ip", "address", "add", f"{HOST_SIDE}/30", "dev", n)
        sh("ip", "link", "set", "dev", n, "up")
        sh("ip", "route", "add", f"{FAR}/32", "via", NEAR, "dev", n)
        sh("sysctl", "-qw", f"net.ipv4.conf.{n}.forwarding=1")
        for cmd in (["link", "set", "dev", "lo", "up"], ["address", "add", f"{NEAR}/30", "dev", "eth0"],
                    ["address", "add", f"{FAR}/32", "dev", "eth0"], ["link", "set", "dev", "eth0", "up"]):
            sh("ip", "-n", n, *cmd)
        for target in (NEAR, FAR):
            route = sh("ip", "route", "get", target).stdout
            if f"dev {n} " not in route:
                raise SystemExit(f"{target} is not routed to the benchmark namespace: {route}")
        self.proc = subprocess.Popen(["ip", "netns", "exec", n, sys.executable, "-c", INTERNET, NEAR, FAR, NAME],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        sh("ip", "link", "del", "dev", self.name, check=False)
        sh("ip", "netns", "del", self.name, check=False)


INGRESS_DOMAIN = "bench.ingress.test"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def requests_per_second(client, url: str, n: int, **kw) -> float:
    client.get(url, **kw).raise_for_status()  # connect and warm up
    t = time.perf_counter()
    for _ in range(n):
        r = client.get(url, **kw)
        assert r.status_code == 200 and len(r.content) == 1024, r.status_code
    return n / (time.perf_counter() - t)


def measure_ingress(server, tls_port: int, data_dir: str, n: int) -> dict:
    """Requests/s to a web server in a sandbox through the proxy by headers, and in domain
    mode over TLS (names given as Host and SNI to 127.0.0.1: nothing is resolved)."""
    import httpx
    from e2b import Sandbox
    sbx = Sandbox.create(timeout=900)
    try:
        sbx.commands.run("head -c 1024 /dev/zero > /tmp/f && cd /tmp && python3 -m http.server 8000", background=True)
        sbx.commands.run("for i in $(seq 100); do python3 -c \"import urllib.request; "
                         "urllib.request.urlopen('http://127.0.0.1:8000/f')\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1")
        name = f"8000-{sbx.sandbox_id}.{INGRESS_DOMAIN}"
        ca = os.path.join(data_dir, "tls", INGRESS_DOMAIN, "ca.crt")
        out = {}
        with httpx.Client() as c:
            out["headers"] = requests_per_second(
                c, f"{server.url}/f", n,
                headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"})
        tls = dict(headers={"Host": name}, extensions={"sni_hostname": name})
        with httpx.Client(verify=ca) as c:
            out["tls_h1"] = requests_per_second(c, f"https://127.0.0.1:{tls_port}/f", n, **tls)
        with httpx.Client(verify=ca, http1=False, http2=True) as c:
            out["tls_h2"] = requests_per_second(c, f"https://127.0.0.1:{tls_port}/f", n, **tls)
        return out
    finally:
        sbx.kill()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def run_probe_in(sbx, target: str, dns: str, counts) -> dict:
    sbx.files.write("/tmp/netprobe.py", PROBE)
    r = sbx.commands.run(f"python3 /tmp/netprobe.py {target} {NAME} {dns} {' '.join(map(str, counts))}",
                         timeout=600)
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["ns", "vm"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="tiny counts; exit non-zero if numbers are missing")
    ap.add_argument("--out")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    args = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("benches/network.py must run as root with iproute2", file=sys.stderr)
        return 2
    counts = (3, 2, 1) if args.smoke else (50, 20, 3)
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", "network-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    results: dict = {"runtime": args.runtime, "smoke": args.smoke, "counts": counts}
    with Internet():
        host = subprocess.run([sys.executable, "-c", PROBE, FAR, NAME, NEAR, *map(str, counts)],
                              check=True, capture_output=True, text=True)
        results["host"] = json.loads(host.stdout)
        tls_port = free_port()
        server = Server(args.bin, args.data_dir, os.path.join(out, "serve.log"), 8, args.runtime,
                        extra_args=["--dns", NEAR, "--domain", INGRESS_DOMAIN,
                                    "--tls-listen", f"127.0.0.1:{tls_port}"])
        server.start()
        os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
        from e2b import Sandbox
        policies = {
            "none": {},
            "cidr": {"network": {"allow_out": [FAR, NEAR], "deny_out": ["0.0.0.0/0"]}},
            "domain": {"network": {"allow_out": [NAME], "deny_out": ["0.0.0.0/0"]}},
        }
        try:
            for label, kw in policies.items():
                sbx = Sandbox.create(timeout=900, **kw)
                try:
                    # The domain policy connects by name (its resolver pins the address, the
                    # proxy re-dials the name); the others by address.
                    dns = sbx.commands.run("awk '/^nameserver/{print $2; exit}' /etc/resolv.conf").stdout.strip()
                    results[label] = run_probe_in(sbx, FAR, dns, counts)
                finally:
                    sbx.kill()
            results["ingress"] = measure_ingress(server, tls_port, args.data_dir, 30 if args.smoke else 2000)
        finally:
            server.stop()
    rows = [("DNS answer (ms)", "dns_ms", False), ("connection + empty GET (ms)", "conn_ms", False),
            ("GET 1 MiB (ms)", "get1_ms", False), ("GET 100 MiB (MB/s)", "get100_mbps", True)]
    labels = ["host", "none", "cidr", "domain"]
    print(f"\nnetwork benchmark, {args.runtime} runtime{' (smoke)' if args.smoke else ''}; medians, ratio to the host")
    print(f"{'':30}" + "".join(f"{lab:>18}" for lab in labels))
    missing = False
    for title, key, higher_better in rows:
        base = median(results["host"][key])
        cells = []
        for lab in labels:
            m = median(results[lab][key])
            missing |= m != m
            ratio = (base / m if higher_better else m / base) if base and m == m else float("nan")
            cells.append(f"{m:9.2f} ({ratio:4.1f}x)" if lab != "host" else f"{m:9.2f}        ")
        print(f"{title:30}" + "".join(f"{c:>18}" for c in cells))
    print("(ratios: how many times slower than the host; DNS: the sandbox asks its resolv.conf server,"
          " which with the domain policy is redirected to the per-sandbox resolver)")
    ing = results["ingress"]
    print(f"\ningress to a sandbox's web server (1 KiB GET, one keep-alive connection), requests/s,"
          f" ratio to header routing")
    base = ing["headers"]
    for label, title in (("headers", "proxy, routing headers (HTTP)"),
                         ("tls_h1", "domain mode, TLS, HTTP/1.1"), ("tls_h2", "domain mode, TLS, HTTP/2")):
        v = ing[label]
        missing |= not v or v != v
        print(f"  {title:36} {v:9.0f}  ({base / v if v else float('nan'):4.1f}x)")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {out}/results.json")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Observability benchmark: what the audit trail and tracing cost, and how long a Prometheus
scrape takes with many sandboxes, in one run.

  sudo .venv/bin/python benches/observability.py                 # ns runtime, 1,000 sandboxes
  sudo .venv/bin/python benches/observability.py --smoke         # tiny counts
  sudo .venv/bin/python benches/observability.py --sandboxes 200 --runtime ns

Part 1 starts `warren serve` three times on the same data dir: with `--no-audit` (nothing is
read from the agents), with the audit trail (the default), and with the trail and tracing
(`--otlp-endpoint` to an OTLP/HTTP sink this script runs on loopback, every SDK call carrying a
W3C `traceparent`, so the server exports a span per call and one per command). Each measures
SDK create + first command and `commands.run("true")` round trips. Part 2 starts one server,
creates `--sandboxes` sandboxes and times `GET /metrics` (the Prometheus text), with and
without `--metrics-per-sandbox`. Prints medians and ratios to the first column; asserts
nothing but that numbers came out. Writes results.json to --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.server
import json
import os
import secrets
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.common import API_KEY, REPO_ROOT, Server  # noqa: E402


def median(xs: list) -> float:
    return statistics.median(xs) if xs else float("nan")


class Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that takes everything and keeps count."""

    requests = 0
    bytes = 0

    def do_POST(self):  # noqa: N802
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        Sink.requests += 1
        Sink.bytes += n
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def start_sink() -> tuple[http.server.ThreadingHTTPServer, str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def measure_commands(creates: int, commands: int, traced: bool) -> dict:
    from e2b import Sandbox

    def headers():
        return {"traceparent": traceparent()} if traced else None

    create_ms = []
    for _ in range(creates):
        t = time.perf_counter()
        sbx = Sandbox.create(timeout=300, headers=headers())
        sbx.commands.run("true")
        create_ms.append((time.perf_counter() - t) * 1000)
        sbx.kill()
    sbx = Sandbox.create(timeout=600, headers=headers())
    try:
        for _ in range(3):
            sbx.commands.run("true")
        run_ms = []
        for _ in range(commands):
            t = time.perf_counter()
            sbx.commands.run("true")
            run_ms.append((time.perf_counter() - t) * 1000)
    finally:
        sbx.kill()
    return {"create_first_command_ms": create_ms, "command_ms": run_ms}


def scrape(server: Server, times: int) -> list[float]:
    out = []
    for _ in range(times):
        t = time.perf_counter()
        r = server.session.get(server.url + "/metrics", timeout=120)
        r.raise_for_status()
        out.append((time.perf_counter() - t) * 1000)
    return out


def many_sandboxes(count: int) -> list:
    from e2b import Sandbox

    made = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(Sandbox.create, timeout=1800) for _ in range(count)]
        for f in concurrent.futures.as_completed(futures):
            try:
                made.append(f.result())
            except Exception as e:  # a host that cannot hold so many: measure with what exists
                print(f"  create failed: {e}", flush=True)
    return made


def kill_all(sandboxes: list) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda s: s.kill(), sandboxes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["ns", "vm"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="tiny counts; exit non-zero if numbers are missing")
    ap.add_argument("--sandboxes", type=int, help="sandboxes running while /metrics is scraped (default 1000)")
    ap.add_argument("--out")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("benches/observability.py must run as root (it starts warren serve)", file=sys.stderr)
        return 2
    creates, commands = (3, 10) if args.smoke else (20, 200)
    count = args.sandboxes or (10 if args.smoke else 1000)
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", "observability-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "serve.log")
    results: dict = {"runtime": args.runtime, "smoke": args.smoke, "creates": creates, "commands": commands}
    sink, sink_url = start_sink()
    try:
        modes = [("audit off", ["--no-audit"], False), ("audit on", [], False),
                 ("audit + tracing", ["--otlp-endpoint", sink_url], True)]
        for label, extra, traced in modes:
            server = Server(args.bin, args.data_dir, log, 16, args.runtime, extra_args=extra)
            server.start()
            os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
            try:
                print(f"  {label}: measuring", flush=True)
                results[label] = measure_commands(creates, commands, traced)
            finally:
                server.stop()
        results["otlp_requests"] = Sink.requests
        results["otlp_bytes"] = Sink.bytes

        server = Server(args.bin, args.data_dir, log, count + 8, args.runtime,
                        extra_args=["--metrics-per-sandbox"])
        server.start()
        os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
        try:
            print(f"  creating {count} sandboxes", flush=True)
            t = time.perf_counter()
            made = many_sandboxes(count)
            results["sandboxes"] = len(made)
            results["sandboxes_created_s"] = time.perf_counter() - t
            # One sampling round so the per-sandbox series have values.
            time.sleep(6)
            results["scrape_ms"] = scrape(server, 3 if args.smoke else 20)
            results["scrape_bytes"] = len(server.session.get(server.url + "/metrics", timeout=120).content)
            kill_all(made)
        finally:
            server.stop()
    finally:
        sink.shutdown()

    print(f"\nobservability benchmark, {args.runtime} runtime{' (smoke)' if args.smoke else ''}; medians (ms),"
          " ratio to the audit off column")
    labels = [m[0] for m in modes]
    print(f"{'':32}" + "".join(f"{label:>18}" for label in labels))
    missing = False
    for key, title in (("create_first_command_ms", "create + first command"),
                       ("command_ms", "commands.run('true')")):
        base = median(results[labels[0]][key])
        cells = []
        for label in labels:
            m = median(results[label][key])
            missing |= m != m
            cells.append(f"{m:9.2f} ({m / base if base else float('nan'):4.2f}x)")
        print(f"{title:32}" + "".join(f"{c:>18}" for c in cells))
    print(f"OTLP requests received while tracing: {results['otlp_requests']} ({results['otlp_bytes']} bytes)")
    s = median(results["scrape_ms"])
    missing |= s != s
    print(f"GET /metrics with {results['sandboxes']} sandboxes running (per-sandbox series on): "
          f"{s:.1f} ms median, {results['scrape_bytes']} bytes")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {out}/results.json")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

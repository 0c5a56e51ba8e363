#!/usr/bin/env python3
"""Code interpreter timings: create of code-interpreter-v1 until the first run_code result,
a warm run_code round trip, and the same create for `base` as the baseline from this run.

  sudo .venv/bin/python benches/interp_bench.py [--runs N] [--data-dir /var/lib/warren]

Starts its own `warren serve` (the test suites' harness, tests/support/warren.py) on a free
loopback port; the code-interpreter-v1 image must be built (`warren template build
code-interpreter-v1`).
Prints min / median / max per figure. Run it alone: one Warren host per machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the test suites' package `support`

from support.warren import Server, point_sdk_at  # noqa: E402


def summary(name, values):
    ms = sorted(v * 1000 for v in values)
    print(f"{name:<46} min {ms[0]:8.1f} ms  median {statistics.median(ms):8.1f} ms  max {ms[-1]:8.1f} ms  (n={len(ms)})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--data-dir", default="/var/lib/warren")
    args = parser.parse_args()
    server = Server(args.data_dir)
    point_sdk_at(server)
    server.start()
    from e2b import Sandbox as BaseSandbox
    from e2b_code_interpreter import Sandbox

    try:
        # One unmeasured create of each: mounts the images, warms the page cache.
        Sandbox.create(request_timeout=600).kill()
        BaseSandbox.create(request_timeout=600).kill()
        create_to_result, create_only, warm, base_create = [], [], [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            sbx = Sandbox.create()
            t1 = time.perf_counter()
            assert sbx.run_code("1 + 1").text == "2"
            t2 = time.perf_counter()
            create_only.append(t1 - t0)
            create_to_result.append(t2 - t0)
            for _ in range(5):
                t3 = time.perf_counter()
                sbx.run_code("x = 1")
                warm.append(time.perf_counter() - t3)
            sbx.kill()
            t4 = time.perf_counter()
            b = BaseSandbox.create()
            b.commands.run("true")
            base_create.append(time.perf_counter() - t4)
            b.kill()
        summary("code-interpreter-v1: create -> first result", create_to_result)
        summary("code-interpreter-v1: create (returns when ready)", create_only)
        summary("run_code('x = 1'), warm", warm)
        summary("base: create -> first command (baseline)", base_create)
    finally:
        server.stop()


if __name__ == "__main__":
    main()

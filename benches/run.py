#!/usr/bin/env python3
"""Warren benchmark harness: one command, every figure beside a baseline from the same run.

  sudo .venv/bin/python benches/run.py                         # every scenario, ns runtime
  sudo .venv/bin/python benches/run.py --scenario create --scenario idle
  sudo .venv/bin/python benches/run.py --smoke                 # tiny counts; asserts numbers come out
  sudo .venv/bin/python benches/run.py --scenario idle --max-idle --max-idle-cap 1000
  sudo .venv/bin/python benches/run.py --compare               # and against the previous run
  .venv/bin/python benches/run.py --compare-files OLD/results.json NEW/results.json

Starts its own `warren serve` (as root) on a free loopback port with --data-dir (default
/var/lib/warren, which must hold or will build the base image), runs the scenarios, and writes
results.json, results.md and latency.png to --out (default benches/results/<timestamp>/).
Scenarios: create, command, files, pty, idle, pause, fork, confinement. See docs/performance.md.
The confinement scenario (ns runtime only) restarts the server with --ns-confinement baseline
(the earlier seccomp deny-list and full capabilities; for measurement only) and without it, in
alternating rounds, and prints the medians of create + first command and of commands.run('true')
under both, with their ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import compare  # noqa: E402
from harness.common import API_KEY, REPO_ROOT, Results, Server, cgroup_layout, meminfo  # noqa: E402
from harness.report import table, write_all  # noqa: E402
from harness.common import Metric, percentile, time_calls  # noqa: E402
from harness.scenarios import SCENARIOS, Ctx, kill, sdk_create  # noqa: E402


def scenario_confinement(ctx: Ctx) -> None:
    """Cost of the ns runtime's confinement: the same operations under the baseline (earlier)
    confinement and the full one, on servers restarted between alternating rounds."""
    res, S = ctx.results, "confinement"
    if ctx.server.runtime != "ns":
        res.note(S, "ns runtime only")
        return
    rounds, creates, cmds, warm = (1, 2, 5, 1) if ctx.smoke else (4, 10, 100, 5)
    samples = {(mode, what): [] for mode in ("baseline", "full") for what in ("create", "cmd")}

    def measure(mode: str) -> None:
        for _ in range(warm):
            sbx = sdk_create(ctx)
            sbx.commands.run("true")
            kill(ctx, sbx.sandbox_id)
        for _ in range(creates):
            t0 = time.perf_counter()
            sbx = sdk_create(ctx)
            sbx.commands.run("true")
            samples[(mode, "create")].append((time.perf_counter() - t0) * 1000)
            kill(ctx, sbx.sandbox_id)
        sbx = sdk_create(ctx)
        try:
            samples[(mode, "cmd")] += time_calls(lambda: sbx.commands.run("true"), cmds, warm)
        finally:
            kill(ctx, sbx.sandbox_id)

    weaker = ["--ns-confinement", "baseline"]

    def restart(mode: str) -> None:
        ctx.server.stop()
        args = [a for a in ctx.server.extra_args if a not in weaker]
        ctx.server.extra_args = args + weaker if mode == "baseline" else args
        ctx.server.start()
        os.environ.update(E2B_API_URL=ctx.server.url, E2B_SANDBOX_URL=ctx.server.url)

    try:
        for i in range(rounds):
            # Alternate which mode goes first, so drift on a shared host hits both alike.
            for mode in ("baseline", "full") if i % 2 == 0 else ("full", "baseline"):
                restart(mode)
                measure(mode)
    finally:
        if "baseline" in ctx.server.extra_args:
            restart("full")
    labels = {"create": "SDK create + run('true')", "cmd": "SDK commands.run('true')"}
    for what, label in labels.items():
        base, full = samples[("baseline", what)], samples[("full", what)]
        res.add(Metric(S, f"{label}, baseline confinement", "ms", base))
        res.add(Metric(S, f"{label}, full confinement", "ms", full,
                       baseline=f"{label}, baseline confinement"))
        mb, mf = percentile(base, 0.5), percentile(full, 0.5)
        ratio = mf / mb if mb else float("nan")
        print(f"  {label}: median {mb:.2f} ms baseline, {mf:.2f} ms full (x{ratio:.3f})", flush=True)


SCENARIOS["confinement"] = scenario_confinement


def machine() -> str:
    mem = meminfo()["MemTotal"] / 1024 / 1024
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return (f"nproc {os.cpu_count()}, {cpu}, memory {mem:.1f} GiB, kernel {platform.release()}, "
            f"cgroups {cgroup_layout()}")


def print_comparison(current: dict, previous_path: str | None, threshold: float,
                     write_to: str | None = None) -> int:
    """Prints (and writes) the comparison table; regressions are listed, not fatal: one noisy
    run on a shared host is not a verdict."""
    previous = compare.load(previous_path) if previous_path else None
    text, regressions = compare.compare(current, previous, threshold)
    head = f"compared with {previous_path}" if previous_path else "no previous results file to compare with"
    print(f"\n{head}\n\n{text}\n")
    for r in regressions:
        print(f"REGRESSION (worse than the previous run by more than {threshold:.0%}): {r}")
    if write_to:
        with open(write_to, "w") as f:
            f.write(f"# Comparison\n\n{head}\n\n{text}\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all")
    ap.add_argument("--runtime", choices=["ns", "vm"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="tiny counts; exit non-zero if a scenario produced no numbers")
    ap.add_argument("--out", help="output directory (default benches/results/<timestamp>/)")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    ap.add_argument("--idle", type=int, default=50, help="idle sandboxes for the idle scenario")
    ap.add_argument("--max-idle", action="store_true",
                    help="idle: keep adding sandboxes until 90%% host memory, the latency limit or the cap")
    ap.add_argument("--max-idle-cap", type=int, default=1000)
    ap.add_argument("--idle-latency-limit-ms", type=float, default=100.0,
                    help="idle --max-idle: stop when a command round trip p50 exceeds this")
    ap.add_argument("--tmpdir", default=tempfile.gettempdir())
    ap.add_argument("--vm-memory-mb", type=int,
                    help="--runtime vm: guest RAM of every VM (default 512; the pause scenario "
                         "touches up to 1 GiB when the guest has 1536)")
    ap.add_argument("--compare", action="store_true",
                    help="after the run, print every metric beside its baseline and the previous "
                         "results file (--previous, default the newest under benches/results)")
    ap.add_argument("--previous", help="results.json to compare with (implies --compare)")
    ap.add_argument("--compare-files", nargs=2, metavar=("OLD", "NEW"),
                    help="compare two results.json files and exit (no run, no root needed)")
    ap.add_argument("--threshold", type=float, default=0.10,
                    help="--compare: a ratio worse by more than this fraction is a regression")
    args = ap.parse_args()
    names = args.scenario or list(SCENARIOS)
    if args.compare_files:
        old, new = args.compare_files
        return print_comparison(compare.load(new), old, args.threshold)

    # The vm runtime's raw QEMU restore baseline is measured by its own benchmark:
    # `cargo run --release -p warren-runtime-vm --example vm_bench`.
    if os.geteuid() != 0:
        print("benches/run.py must run as root: `warren serve` with the ns runtime needs root "
              "(try: sudo .venv/bin/python benches/run.py).", file=sys.stderr)
        return 2
    if not os.path.isfile(args.bin):
        print(f"warren binary not found at {args.bin}: cd {REPO_ROOT} && cargo build --release --workspace",
              file=sys.stderr)
        return 2

    started = time.strftime("%Y-%m-%dT%H-%M-%S")
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", started)
    os.makedirs(out, exist_ok=True)
    max_sbx = max(200, args.idle + 60, (args.max_idle_cap + 60) if args.max_idle else 0)
    vm_args = ["--vm-memory-mb", str(args.vm_memory_mb)] if args.vm_memory_mb else []
    server = Server(args.bin, args.data_dir, os.path.join(out, "serve.log"), max_sbx, args.runtime, vm_args)
    results = Results()
    failed: list[str] = []
    empty: list[str] = []
    t_all = time.monotonic()
    ctx = None
    try:
        print(f"starting warren serve (log {out}/serve.log)", flush=True)
        server.start()
        os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
        print(f"warren serve at {server.url} (pid {server.proc.pid}); runtime {args.runtime}; smoke={args.smoke}", flush=True)
        ctx = Ctx(server=server, results=results, smoke=args.smoke, data_dir=args.data_dir,
                  idle_count=args.idle, max_idle=args.max_idle, max_idle_cap=args.max_idle_cap,
                  idle_latency_limit_ms=args.idle_latency_limit_ms, tmpdir=args.tmpdir,
                  created=[], lock=threading.Lock())
        for name in names:
            t0 = time.monotonic()
            print(f"\n== {name}", flush=True)
            try:
                SCENARIOS[name](ctx)
            except Exception:  # noqa: BLE001 - report and go on with the next scenario
                traceback.print_exc()
                failed.append(name)
                results.note(name, "scenario failed: " + traceback.format_exc().strip().splitlines()[-1][:300])
            if not [m for m in results.by_scenario(name)
                    if not m.name.startswith("baseline") and any(m.samples)]:
                empty.append(name)
            print(f"== {name}: {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        if server.proc is not None:
            server.kill_all(ctx.created if ctx else [])
        server.stop()

    meta = {
        "started": started,
        "runtime": args.runtime,
        "smoke": args.smoke,
        "scenarios": names,
        "vm_memory_mb": (args.vm_memory_mb or 512) if args.runtime == "vm" else None,
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": machine(),
        "warren_commit": subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip(),
        "duration_s": round(time.monotonic() - t_all, 1),
        "failed": failed,
    }
    write_all(results, out, meta)
    print("\n" + table(results) + "\n")
    for sc, notes in results.notes.items():
        for n in notes:
            print(f"- {sc}: {n}")
    print(f"\nwrote {out}/results.json, results.md, latency.png ({meta['duration_s']} s)")
    if args.compare or args.previous:
        previous = args.previous or compare.previous_results(os.path.join(REPO_ROOT, "benches", "results"), out)
        print_comparison(compare.load(os.path.join(out, "results.json")), previous, args.threshold,
                         os.path.join(out, "compare.md"))
    if empty:
        print(f"FAILED: no numbers from: {', '.join(empty)}", file=sys.stderr)
        return 1
    if failed:
        print(f"FAILED: scenarios raised: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

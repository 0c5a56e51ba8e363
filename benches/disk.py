#!/usr/bin/env python3
"""Sandbox disk benchmark: what a sandbox's files cost its pauses, forks and writes.

  sudo .venv/bin/python benches/disk.py                  # ns runtime
  sudo .venv/bin/python benches/disk.py --runtime vm
  sudo .venv/bin/python benches/disk.py --smoke

Starts its own `warren serve` and measures, through the unmodified E2B SDK:
- a memory pause plus resume of a sandbox holding 0 MiB, then 256 MiB, then 1 GiB of files
  (the ratio to 0 MiB is what its files cost a pause: a pause keeps the disk, copying nothing);
- a fork into 10 children of a sandbox holding 256 MiB of files (each child gets a copy of
  the data, or a reflink where the data filesystem has them);
- sequential write + fsync inside a sandbox, on its own disk, beside the same written by
  this process to a file on the data disk (the baseline).
Prints medians and ratios; asserts nothing but that numbers came out. Writes results.json to
--out (default benches/results/disk-<timestamp>/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.common import API_KEY, REPO_ROOT, Server  # noqa: E402

# Runs in the sandbox, and on the host for the baseline: argv = file, MiB. Prints MB/s.
WRITE = r"""
import os, sys, time
path, mib = sys.argv[1], int(sys.argv[2])
block = os.urandom(1 << 20)
t = time.perf_counter()
with open(path, "wb") as f:
    for _ in range(mib):
        f.write(block)
    f.flush(); os.fsync(f.fileno())
print(mib / max(time.perf_counter() - t, 1e-9))
os.remove(path)
"""


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fill(sbx, mib: int) -> None:
    if mib:
        sbx.commands.run(f"head -c {mib}M /dev/urandom > /home/user/files.bin && sync", timeout=1800)


def pause_resume(Sandbox, sbx, rounds: int) -> tuple[list[float], list[float]]:
    pauses, resumes = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        assert sbx.pause() is True
        pauses.append(time.perf_counter() - t)
        t = time.perf_counter()
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=1800)
        sbx.commands.run("true")
        resumes.append(time.perf_counter() - t)
    return pauses, resumes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["ns", "vm"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; exit non-zero if numbers are missing")
    ap.add_argument("--out")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("benches/disk.py must run as root", file=sys.stderr)
        return 2
    sizes, fork_mib, children, rounds, write_mib = (
        ([0, 16], 16, 2, 1, 16) if args.smoke else ([0, 256, 1024], 256, 10, 3, 512)
    )
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", "disk-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    results: dict = {"runtime": args.runtime, "smoke": args.smoke, "pause": {}, "fork": {}, "write": {}}
    server = Server(args.bin, args.data_dir, os.path.join(out, "serve.log"), children + 2, args.runtime)
    server.start()
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
    from e2b import Sandbox
    try:
        for mib in sizes:
            sbx = Sandbox.create(timeout=3600)
            try:
                fill(sbx, mib)
                p, r = pause_resume(Sandbox, sbx, rounds)
                results["pause"][str(mib)] = {"pause_s": p, "resume_s": r}
            finally:
                Sandbox.kill(sbx.sandbox_id)

        sbx = Sandbox.create(timeout=3600)
        try:
            fill(sbx, fork_mib)
            t = time.perf_counter()
            forks = sbx.fork(count=children, timeout=1800)
            results["fork"] = {"mib": fork_mib, "children": children, "total_s": time.perf_counter() - t,
                               "failed": sum(isinstance(f, Exception) for f in forks)}
            for f in forks:
                if not isinstance(f, Exception):
                    f.kill()

            sbx.files.write("/tmp/write.py", WRITE)
            inside = [float(sbx.commands.run(f"python3 /tmp/write.py /home/user/w.bin {write_mib}",
                                             timeout=1800).stdout) for _ in range(rounds)]
        finally:
            sbx.kill()
        host_file = os.path.join(args.data_dir, f".bench-write-{os.getpid()}")
        script = os.path.join(out, "write.py")
        with open(script, "w") as f:
            f.write(WRITE)
        import subprocess
        host = [float(subprocess.run([sys.executable, script, host_file, str(write_mib)], check=True,
                                     capture_output=True, text=True).stdout) for _ in range(rounds)]
        results["write"] = {"mib": write_mib, "sandbox_mbps": inside, "data_disk_mbps": host}
    finally:
        server.stop()

    missing = False
    print(f"\nsandbox disk benchmark, {args.runtime} runtime{' (smoke)' if args.smoke else ''}; medians")
    base = None
    print("memory pause + resume, by the files the sandbox holds (ratio to 0 MiB)")
    for mib in sizes:
        r = results["pause"][str(mib)]
        total = median(r["pause_s"]) + median(r["resume_s"])
        base = base or total
        missing |= total != total
        print(f"  {mib:5d} MiB   pause {median(r['pause_s']):7.3f} s   resume {median(r['resume_s']):7.3f} s"
              f"   ({total / base:4.2f}x)")
    fk = results["fork"]
    missing |= fk["failed"] > 0
    print(f"fork x{fk['children']} of a sandbox with {fk['mib']} MiB of files: {fk['total_s']:.2f} s"
          f" ({fk['total_s'] / fk['children']:.3f} s per child, {fk['failed']} failed)")
    w = results["write"]
    inside, host = median(w["sandbox_mbps"]), median(w["data_disk_mbps"])
    missing |= inside != inside or host != host
    print(f"sequential write + fsync, {w['mib']} MiB: sandbox disk {inside:.0f} MB/s, data disk {host:.0f} MB/s"
          f" ({inside / host:4.2f}x)")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {out}/results.json")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

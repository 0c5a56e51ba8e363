#!/usr/bin/env python3
"""Volume benchmark: file I/O inside a sandbox on a mounted volume beside the same on the
sandbox's own disk (its writable layer; a VM's own virtio disk), and the volume content API beside a local copy (fsynced, as an upload is).

  sudo .venv/bin/python benches/volumes.py            # ns runtime
  sudo .venv/bin/python benches/volumes.py --runtime vm   # vm runtime (volumes over NFS)
  sudo .venv/bin/python benches/volumes.py --smoke

Starts its own `warren serve`, creates a volume and a sandbox mounting it at /v, and runs the
same probe in /v and in /tmp: sequential write with fsync (MB/s), sequential read of what was
written (MB/s, from the page cache: no sandbox may drop the host's), and small files (4 KiB
each, created, then stat'ed, then removed: files/s). Then uploads and downloads a file through
the content API (the SDK's `Volume.write_file` / `read_file`) beside `cp` of the same file on
the host. Prints medians and the ratio to the baseline; asserts nothing but that numbers came
out. Writes results.json to --out (default benches/results/volumes-<timestamp>/).
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

# Runs inside the sandbox: argv = dir, MiB, files, rounds. Prints JSON lists.
PROBE = r"""
import json, os, sys, time
d, mib, files, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
block = os.urandom(1 << 20)
out = {"write_mbps": [], "read_mbps": [], "create_per_s": [], "stat_per_s": [], "remove_per_s": []}
# A guest without a fine clocksource (a VM under TCG can fall back to jiffies) may see no time
# pass over a short loop: count at least one tick of what the clock says it resolves.
TICK = max(time.get_clock_info("perf_counter").resolution, 1e-9)
def since(t):
    return max(time.perf_counter() - t, TICK)
for r in range(rounds):
    p = os.path.join(d, "seq.bin")
    t = time.perf_counter()
    with open(p, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush(); os.fsync(f.fileno())
    out["write_mbps"].append(mib / since(t))
    t = time.perf_counter()
    with open(p, "rb") as f:
        while f.read(1 << 20):
            pass
    out["read_mbps"].append(mib / since(t))
    os.remove(p)
    sd = os.path.join(d, "small-%d" % r)
    os.makedirs(sd)
    small = os.urandom(4096)
    t = time.perf_counter()
    for i in range(files):
        with open(os.path.join(sd, str(i)), "wb") as f:
            f.write(small)
    out["create_per_s"].append(files / since(t))
    t = time.perf_counter()
    for i in range(files):
        os.stat(os.path.join(sd, str(i)))
    out["stat_per_s"].append(files / since(t))
    t = time.perf_counter()
    for i in range(files):
        os.remove(os.path.join(sd, str(i)))
    out["remove_per_s"].append(files / since(t))
    os.rmdir(sd)
print(json.dumps(out))
"""


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
    if os.geteuid() != 0:
        print("benches/volumes.py must run as root", file=sys.stderr)
        return 2
    mib, files, rounds, api_mib = (8, 100, 2, 4) if args.smoke else (256, 2000, 5, 128)
    if args.runtime == "vm" and not args.smoke:
        rounds = 3  # the same sizes, fewer rounds: a VM under TCG is slow
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", "volumes-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    results: dict = {"runtime": args.runtime, "smoke": args.smoke,
                     "counts": {"mib": mib, "files": files, "rounds": rounds, "api_mib": api_mib}}
    server = Server(args.bin, args.data_dir, os.path.join(out, "serve.log"), 4, args.runtime)
    server.start()
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url,
                      E2B_VOLUME_API_URL=server.url)
    from e2b import Sandbox, Volume
    vol = Volume.create(f"bench-{uuid.uuid4().hex[:8]}")
    try:
        sbx = Sandbox.create(timeout=1800, volume_mounts={"/v": vol})
        try:
            sbx.files.write("/tmp/probe.py", PROBE)
            for label, d in (("own_disk", "/tmp/bench"), ("volume", "/v/bench")):
                r = sbx.commands.run(f"python3 /tmp/probe.py {d} {mib} {files} {rounds}", timeout=1800)
                results[label] = json.loads(r.stdout)
        finally:
            sbx.kill()
        # The content API beside a local copy of the same bytes.
        payload = os.urandom(api_mib << 20)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
            with open(src, "wb") as f:
                f.write(payload)
            api = {"upload_s": [], "download_s": [], "cp_s": []}
            for _ in range(rounds):
                t = time.perf_counter()
                subprocess.run(["cp", src, dst], check=True)
                fd = os.open(dst, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
                api["cp_s"].append(time.perf_counter() - t)
                os.remove(dst)
                t = time.perf_counter()
                vol.write_file("/api.bin", payload, force=True)
                api["upload_s"].append(time.perf_counter() - t)
                t = time.perf_counter()
                got = vol.read_file("/api.bin", format="bytes")
                api["download_s"].append(time.perf_counter() - t)
                assert len(got) == len(payload)
            results["api"] = api
    finally:
        Volume.destroy(vol.volume_id)
        server.stop()

    missing = False
    print(f"\nvolume benchmark, {args.runtime} runtime{' (smoke)' if args.smoke else ''}; medians,"
          f" ratio volume / own disk (higher is better for all)")
    for title, key in (("sequential write + fsync (MB/s)", "write_mbps"), ("sequential read (MB/s)", "read_mbps"),
                       ("create 4 KiB files (/s)", "create_per_s"), ("stat (/s)", "stat_per_s"),
                       ("remove (/s)", "remove_per_s")):
        own, v = median(results["own_disk"][key]), median(results["volume"][key])
        missing |= own != own or v != v
        print(f"  {title:34} own disk {own:10.0f}   volume {v:10.0f}   ({v / own:4.2f}x)")
    api = results["api"]
    cp = median(api["cp_s"])
    print(f"\ncontent API, {api_mib} MiB (seconds, ratio to a local cp + fsync; uploads are fsynced too)")
    for title, key in (("local cp + fsync", "cp_s"), ("SDK write_file", "upload_s"), ("SDK read_file", "download_s")):
        m = median(api[key])
        missing |= m != m
        print(f"  {title:34} {m:8.3f}   ({m / cp:4.1f}x)")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {out}/results.json")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

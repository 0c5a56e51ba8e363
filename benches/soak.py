#!/usr/bin/env python3
"""Soak benchmark: many sandbox lives against one `warren serve`, then what is lost and what
is leaked.

  sudo .venv/bin/python benches/soak.py                 # ns: 1000 cycles, 20 bursts of 50, 100 pauses, 30 crashes
  sudo .venv/bin/python benches/soak.py --runtime vm    # smaller counts (a VM under TCG is slow)
  sudo .venv/bin/python benches/soak.py --smoke         # a few minutes; scripts/test.sh runs it
  sudo .venv/bin/python benches/soak.py --seed 7        # the same crash points again

Starts its own server and runs, with the official E2B SDK:
  1. sequential create / run `true` / kill cycles (create+run and kill times);
  2. bursts of concurrent creates, each sandbox killed after its burst (per-create times);
  3. memory pause / resume cycles of one sandbox that runs a counter and keeps checksummed
     files: after every resume the counter must have gone on from where it was and every
     file must read back the same (a loss is counted, never ignored);
  4. crashes (`harness/faults.py`): the server SIGKILLed at a random point of a create, pause,
     resume, fork, upload, kill or snapshot, in turn, and restarted on the same data dir:
     every sandbox, file and snapshot it acknowledged must be there, what the cut operation
     made must be whole, and once all is deleted the host must hold what it held before;
  5. a full data disk (`harness/fulldisk.py`): a server on a small loop-mounted data dir,
     filled from outside, must answer 507 with the cause and work again once space is freed.
Around it, what the host holds is counted: the server's zombie children, its open descriptors
(but sockets and the vm jails' cached user namespaces),
mounts under the data and run dirs, network namespaces, sandbox cgroups, sandbox state dirs
(with the ns runtime's prepared pool off, as its stock follows demand).
Prints medians and p99s (no time is asserted); exits 1 if anything was lost or leaked, so the
smoke run in scripts/test.sh is a test of those two. Writes results.json to --out.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import glob
import hashlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.common import API_KEY, REPO_ROOT, Server, percentile  # noqa: E402
from harness import fulldisk  # noqa: E402
from harness.faults import Crashes  # noqa: E402

COUNTER = "nohup sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done' >/dev/null 2>&1 &"


def host_counts(server_pid: int, data_dir: str) -> dict:
    """What the server holds on the host, counted (see the module's description)."""
    zombies = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()
        if rest[0] == "Z" and int(rest[1]) == server_pid:
            zombies += 1
    fds = sum(server_files(server_pid).values())
    ours = (os.path.realpath(data_dir), "/run/warren")
    with open("/proc/self/mountinfo") as f:
        mounts = sum(1 for line in f if line.split(" ")[4].startswith(ours))
    netns = len(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else 0
    cgroups = 0
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"):
        if os.path.isdir(root):
            # The server's own parents (`HostConfig::cgroup_parent`, and the vm runtime's).
            for parent in ("warren", "warren-vm"):
                d = os.path.join(root, parent)
                if os.path.isdir(d):
                    cgroups += sum(1 for e in os.scandir(d) if e.is_dir())
    state = 0
    for d in ("/run/warren/sandboxes", os.path.join(data_dir, "paused")):
        if os.path.isdir(d):
            state += len(os.listdir(d))
    # The ns runtime's sandbox disks (but the blank images it copies them from) and the loop
    # devices backed by anything in the data dir.
    disks = 0
    for root, dirs, names in os.walk(os.path.join(data_dir, "disks")):
        dirs[:] = [d for d in dirs if d != "blank"]
        disks += sum(1 for n in names if n.endswith(".img"))
    loops = 0
    for backing in glob.glob("/sys/block/loop*/loop/backing_file"):
        with contextlib.suppress(OSError), open(backing) as f:
            loops += f.read().startswith(os.path.realpath(data_dir) + "/")
    return {"zombies": zombies, "server_files": fds, "mounts": mounts, "netns": netns,
            "sandbox_cgroups": cgroups, "sandbox_state": state, "disks": disks, "loops": loops}


def zombies_of(server_pid: int) -> list:
    """The server's zombie children, as `pid comm` (what a leak report names)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            rest = stat[stat.rfind(")") + 2:].split()
            if rest[0] == "Z" and int(rest[1]) == server_pid:
                out.append(f"{pid} {stat[stat.find('(') + 1:stat.rfind(')')]}")
    return out


def server_files(server_pid: int) -> dict:
    """The server's descriptors by what they point at, but for two kinds that are not its to
    give back: sockets (the SDK's own connection pool keeps connections to the server open, as
    many as it ran concurrently) and user namespaces (the vm runtime keeps one per jail uid,
    that is per network slot, made on a slot's first use: bounded by the slots)."""
    out: dict = {}
    for fd in os.listdir(f"/proc/{server_pid}/fd"):
        try:
            target = os.readlink(f"/proc/{server_pid}/fd/{fd}")
        except OSError:
            continue
        if not target.startswith(("socket:", "user:")):
            key = target.split(":[")[0] if ":[" in target else target
            out[key] = out.get(key, 0) + 1
    return out


def settle(server_pid: int, data_dir: str, want: dict, seconds: float = 15.0) -> dict:
    """Counts again until they match `want` or `seconds` pass: pools refill, connections close."""
    deadline = time.monotonic() + seconds
    now = host_counts(server_pid, data_dir)
    while now != want and time.monotonic() < deadline:
        time.sleep(0.25)
        now = host_counts(server_pid, data_dir)
    return now


def summary(xs: list) -> str:
    if not xs:
        return "n=0"
    return f"n={len(xs):4d}  median={statistics.median(xs):9.1f} ms  p99={percentile(xs, 0.99):9.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["ns", "vm"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="small counts (about a minute)")
    ap.add_argument("--out")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    ap.add_argument("--crashes", type=int, help="server SIGKILLs (default: 30, smoke 7)")
    ap.add_argument("--seed", type=int, default=int(time.time()), help="picks the crash points")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("benches/soak.py must run as root", file=sys.stderr)
        return 2
    if args.smoke:
        cycles, bursts, burst, pauses = (20, 2, 5, 3) if args.runtime == "ns" else (3, 1, 2, 2)
    else:
        cycles, bursts, burst, pauses = (1000, 20, 50, 100) if args.runtime == "ns" else (50, 5, 5, 20)
    crashes = args.crashes if args.crashes is not None else (7 if args.smoke else 30)
    out = args.out or os.path.join(REPO_ROOT, "benches", "results", "soak-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    # The ns runtime's prepared pool grows with demand (a burst of 50 leaves more sandboxes
    # prepared than a single create): off here, so that what it keeps is not counted a leak.
    server = Server(args.bin, args.data_dir, os.path.join(out, "serve.log"), max(burst + 2, 8), args.runtime,
                    ["--ns-prepared-max", "0"])
    server.start()
    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url)
    from e2b import Sandbox

    results: dict = {"runtime": args.runtime, "smoke": args.smoke,
                     "counts": {"cycles": cycles, "bursts": bursts, "burst": burst, "pauses": pauses,
                                "crashes": crashes, "seed": args.seed}}
    lost: list = []
    try:
        pid = server.proc.pid
        # Sandboxes an earlier run left (one cut off mid-burst) would be counted as this run's.
        left = server.session.get(f"{server.url}/v2/sandboxes?state=running,paused&limit=100", timeout=60).json()
        if left:
            print(f"  killing {len(left)} sandboxes an earlier run left in {args.data_dir}")
            server.kill_all([s["sandboxID"] for s in left])
        # One life first: what the first create sets up once is not a leak.
        Sandbox.create(timeout=300).kill()
        time.sleep(1)
        before = host_counts(pid, args.data_dir)
        files_before = server_files(pid)

        create_ms, kill_ms = [], []
        for _ in range(cycles):
            t = time.perf_counter()
            s = Sandbox.create(timeout=300)
            if s.commands.run("true").exit_code != 0:
                lost.append("a command failed in a fresh sandbox")
            create_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            s.kill()
            kill_ms.append((time.perf_counter() - t) * 1000)
        results["sequential"] = {"create_run_ms": create_ms, "kill_ms": kill_ms}

        burst_ms = []

        def one() -> tuple:
            t = time.perf_counter()
            s = Sandbox.create(timeout=300)
            return s, (time.perf_counter() - t) * 1000

        with concurrent.futures.ThreadPoolExecutor(burst) as pool:
            for _ in range(bursts):
                made = list(pool.map(lambda _: one(), range(burst)))
                burst_ms += [ms for _, ms in made]
                for s, _ in made:
                    s.kill()
        results["bursts"] = {"create_ms": burst_ms}

        pause_ms, resume_ms = [], []
        s = Sandbox.create(timeout=600)
        try:
            files = {f"/home/user/soak/{i}.bin": os.urandom(64 << 10) for i in range(8)}
            for path, data in files.items():
                s.files.write(path, data)
            want = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
            s.commands.run(COUNTER)
            time.sleep(0.5)
            last = int(s.files.read("/tmp/counter").strip() or 0)
            for _ in range(pauses):
                t = time.perf_counter()
                s.beta_pause()
                pause_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                s = Sandbox.connect(s.sandbox_id, timeout=600)
                resume_ms.append((time.perf_counter() - t) * 1000)
                time.sleep(0.3)
                now = int(s.files.read("/tmp/counter").strip() or 0)
                if now <= last:
                    lost.append(f"the counter did not go on after a resume ({last} -> {now})")
                last = now
                got = s.commands.run("sha256sum /home/user/soak/*.bin").stdout
                for path, digest in want.items():
                    if f"{digest}  {path}" not in got:
                        lost.append(f"{path} changed across a pause")
        finally:
            s.kill()
        results["pauses"] = {"pause_ms": pause_ms, "resume_ms": resume_ms}

        after = settle(pid, args.data_dir, before)
        files_after = server_files(pid)
        results["zombies"] = zombies_of(pid)

        # Crashes: a new server process each round, so only what the host holds is compared
        # (not the server's own descriptors), and no zombie may outlive a restart's adoption.
        crash = Crashes(server, lambda m, p, **kw: server.session.request(m, server.url + p, timeout=120, **kw),
                        crashes, args.seed)
        crash.run()
        crash.finish()
        lost += crash.report.lost
        host = ("mounts", "netns", "sandbox_cgroups", "sandbox_state", "disks", "loops")
        crash_want = {k: before[k] for k in host}
        crash_want["zombies"] = 0
        deadline = time.monotonic() + 15
        while True:
            now = host_counts(server.proc.pid, args.data_dir)
            crash_after = {k: now[k] for k in crash_want}
            if crash_after == crash_want or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        results["crashes"] = {"seed": args.seed, "cut": crash.report.cut, "finished": crash.report.done,
                              "restart_ms": crash.report.restart_ms, "host_after": crash_after,
                              "zombies": zombies_of(server.proc.pid)}
    finally:
        server.stop()
    # A data disk filled from outside: 507s with the cause, then recovery once freed.
    full = fulldisk.run(args.bin, args.data_dir, os.path.join(out, "serve-fulldisk.log"), args.runtime)
    results["full_disk"] = full
    lost += full
    results["host_before"], results["host_after"] = before, after
    results["lost"] = lost
    leaked = {k: (before[k], after[k]) for k in before if after[k] != before[k]}
    leaked.update({f"after crashes: {k}": (crash_want[k], v) for k, v in crash_after.items() if v != crash_want[k]})
    if "server_files" in leaked:
        leaked["server_files_by_target"] = {
            k: (files_before.get(k, 0), files_after.get(k, 0))
            for k in set(files_before) | set(files_after)
            if files_before.get(k, 0) != files_after.get(k, 0)
        }
    results["leaked"] = leaked

    print(f"\nsoak, {args.runtime} runtime{' (smoke)' if args.smoke else ''}")
    print(f"  create + run('true'), sequential  {summary(create_ms)}")
    print(f"  kill, sequential                  {summary(kill_ms)}")
    print(f"  create in bursts of {burst:3d}          {summary(burst_ms)}")
    print(f"  memory pause                      {summary(pause_ms)}")
    print(f"  resume (connect)                  {summary(resume_ms)}")
    print(f"  restart after a SIGKILL           {summary(crash.report.restart_ms)}")
    print(f"  crashes (seed {args.seed}): cut {crash.report.cut}, finished first {crash.report.done}")
    print(f"  host before {before}")
    print(f"  host after  {after}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"results in {out}/results.json")
    if lost or leaked:
        print(f"LOST: {lost}\nLEAKED (before, after): {leaked}", file=sys.stderr)
        if results.get("zombies"):
            print(f"zombies after the lives and pauses: {results['zombies']}", file=sys.stderr)
        if results.get("crashes", {}).get("zombies"):
            print(f"zombies after the crashes: {results['crashes']['zombies']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

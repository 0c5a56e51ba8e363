#!/usr/bin/env python3
"""Template build benchmark: every figure beside a baseline measured in the same run.

  sudo .venv/bin/python benches/templates.py                    # ns runtime, full sizes
  sudo .venv/bin/python benches/templates.py --runtime both     # ns, then vm (slow under TCG)
  sudo .venv/bin/python benches/templates.py --smoke            # tiny sizes, one repetition

Per runtime it starts its own `warren serve` (as root, on a free loopback port, --data-dir
default /var/lib/warren, which holds or will build the base image; it is never deleted) with
Docker Hub mirrored to a Debian `docker-registry` on loopback (tests/support/registry.py), and
measures through the unmodified E2B SDK:

1. build: a 5-step template (from_base_image + RUN/ENV/WORKDIR/COPY/RUN) cold (a fresh nonce
   in the first RUN and in the copied file, so no step is cached) and fully cached (the same
   template again), median of --build-reps; ratio cached/cold; where a cold build's time goes,
   from the server's build log (sandbox start + base phase, each step including its layer
   snapshot, packing the image).
2. pull: an image of --image-mib MiB of random (incompressible) data in 4 layers over a
   busybox root, pushed to the registry under a fresh tag with fresh bytes for every
   repetition (so every pull is cold), built as `Template().from_image(...)` with one trivial
   RUN step (the time Template.build takes; the log splits pull / unpack + erofs / the rest),
   beside the baseline `skopeo copy --src-tls-verify=false docker://... oci:DIR` followed by
   `tar -x` of each layer into a directory, on another fresh image of the same size.
3. create: Sandbox.create(<the built 5-step template>) + commands.run("true") vs the same
   for `base`, median of --create-reps (one discarded warm-up create of each first: on vm the
   first create of a template boots it and takes its snapshot), ratio.

It asserts nothing; it prints a table per runtime. It takes an exclusive flock on
/tmp/warren-serve.lock for the whole run (waiting for it), the lock every test that starts
`warren serve` holds, so it never runs beside them. At the end it deletes the templates it
built and prunes (POST /v1/templates/prune: images nothing uses, every cached build step
and every pulled layer of the data dir).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))  # the test suites' package `support`

import requests  # noqa: E402

from support import registry as reg  # noqa: E402  (tests/support/registry.py)
from harness.common import API_KEY, MIB, free_port, percentile  # noqa: E402

LOCK = "/tmp/warren-serve.lock"
DATA_LAYERS = 4


def median(xs: List[float]) -> float:
    return percentile(xs, 0.5)


# ---------------------------------------------------------------------------------------------
# warren serve with a registry mirror
# ---------------------------------------------------------------------------------------------


class Serve:
    """One `warren serve` on a free loopback port; stopped by its own PID only."""

    def __init__(self, binary: str, data_dir: str, runtime: str, log_path: str, extra: List[str]):
        self.cmd_tail = ["--data-dir", data_dir, "--runtime", runtime, "--max-sandboxes", "40", *extra]
        self.binary, self.log_path = binary, log_path
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self.http = requests.Session()
        self.http.headers["X-API-KEY"] = API_KEY

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = open(self.log_path, "ab")
        offset = log.tell()
        env = dict(os.environ, WARREN_API_KEY=API_KEY, WARREN_LOG=os.environ.get("WARREN_LOG", "info"))
        self.proc = subprocess.Popen([self.binary, "serve", "--listen", f"127.0.0.1:{port}", *self.cmd_tail],
                                     env=env, stdout=log, stderr=log)
        # A first start may build the base image (and, for vm, the guest kernel and snapshot).
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(self.log_path, "rb") as f:
                    f.seek(offset)
                    tail = f.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"warren serve exited ({self.proc.returncode}); {self.log_path}:\n{tail}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    os.environ.update(E2B_API_KEY=API_KEY, E2B_API_URL=self.url, E2B_SANDBOX_URL=self.url)
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("warren serve did not become healthy")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------------------------
# builds, timed by the client and split by the server's log
# ---------------------------------------------------------------------------------------------


def build(tpl, name: str) -> Tuple[float, List[Tuple[float, str]], object]:
    """Template.build; returns (seconds, [(server log time, message)], BuildInfo)."""
    from e2b import Template
    from e2b.template.logger import LogEntryEnd, LogEntryStart

    entries: List[Tuple[float, str]] = []

    def on_log(e) -> None:
        # The SDK's own start/end markers carry the client's clock; only the server's count.
        if not isinstance(e, (LogEntryStart, LogEntryEnd)):
            entries.append((e.timestamp.timestamp(), e.message))

    t0 = time.perf_counter()
    info = Template.build(tpl, name, on_build_logs=on_log)
    return time.perf_counter() - t0, entries, info


def mark(entries: List[Tuple[float, str]], prefix: str) -> Optional[float]:
    return next((t for t, m in entries if m.startswith(prefix)), None)


def span(entries, a: str, b: str) -> Optional[float]:
    ta, tb = mark(entries, a), mark(entries, b)
    return tb - ta if ta is not None and tb is not None else None


def five_step(ctx_dir: str, nonce: str):
    from e2b import Template

    with open(os.path.join(ctx_dir, "payload.bin"), "wb") as f:
        f.write(nonce.encode() + os.urandom(256 * 1024))
    return (Template(file_context_path=ctx_dir).from_base_image()
            .run_cmd(f"echo {nonce} > /tmp/nonce")
            .set_envs({"BENCH_NONCE": nonce, "BENCH_MODE": "templates"})
            .set_workdir("/home/user/app")
            .copy("payload.bin", "/home/user/app/payload.bin")
            .run_cmd("ls -la /home/user/app > /home/user/app/listing && sha256sum payload.bin > sum"))


STEP_PHASES = [
    ("sandbox start + base phase", "[base] FROM template", "[builder 1/5]"),
    ("step 1 RUN (+ layer snapshot)", "[builder 1/5]", "[builder 2/5]"),
    ("step 2 ENV (+ layer snapshot)", "[builder 2/5]", "[builder 3/5]"),
    ("step 3 WORKDIR (+ layer snapshot)", "[builder 3/5]", "[builder 4/5]"),
    ("step 4 COPY (+ layer snapshot)", "[builder 4/5]", "[builder 5/5]"),
    ("step 5 RUN (+ layer snapshot)", "[builder 5/5]", "Packing the template image"),
    ("pack the image (finalize)", "Packing the template image", "Template image "),
]

PULL_PHASES = [
    ("pull (registry -> layer cache)", "[base] FROM image", "Unpacking "),
    ("unpack + erofs of the pulled image", "Unpacking ", "Image "),
    ("build on it (sandbox, RUN true, pack)", "[base] FROM template", "Template image "),
    ("of which: pack the image (finalize)", "Packing the template image", "Template image "),
]


class Table:
    def __init__(self, runtime: str) -> None:
        self.runtime = runtime
        self.rows: List[Tuple[str, str, str, str, str]] = []

    def add(self, what: str, xs: List[float], unit: str = "s", base: Optional[List[float]] = None,
            base_label: str = "", indent: bool = False) -> None:
        fmt = (lambda v: f"{v:.2f} s") if unit == "s" else (lambda v: f"{v:.0f} ms")
        m = median(xs) if xs else float("nan")
        b = median(base) if base else None
        self.rows.append((("  " if indent else "") + what, fmt(m) if xs else "-", str(len(xs)),
                          f"{fmt(b)} ({base_label})" if b is not None else "",
                          f"{m / b:.2f}x" if b else ""))
        print(f"  {what}: median {fmt(m) if xs else '-'} (n={len(xs)})"
              + (f", baseline {fmt(b)} {base_label}, ratio {m / b:.2f}x" if b else ""), flush=True)

    def note(self, text: str) -> None:
        self.rows.append((text, "", "", "", ""))
        print(f"  {text}", flush=True)

    def render(self) -> str:
        head = ("metric", "median", "n", "baseline median", "ratio")
        w = [max(len(r[i]) for r in [head, *self.rows]) for i in range(5)]
        line = lambda r: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"
        out = [f"runtime {self.runtime}", line(head), "|" + "|".join("-" * (x + 2) for x in w) + "|"]
        return "\n".join(out + [line(r) for r in self.rows])


def bench_builds(t: Table, reps: int, run_id: str, ctx_dir: str) -> str:
    name = f"bench-steps-{run_id}"
    cold, cached, outside, phases = [], [], [], {p[0]: [] for p in STEP_PHASES}
    for i in range(reps):
        tpl = five_step(ctx_dir, uuid.uuid4().hex)
        secs, logs, _ = build(tpl, name)
        if any(m.startswith("CACHED [builder 1/") for _, m in logs):
            raise RuntimeError("a cold build hit the cache: the nonce did not reach step 1")
        cold.append(secs)
        outside.append(secs - (logs[-1][0] - logs[0][0]) if logs else float("nan"))
        for label, a, b in STEP_PHASES:
            d = span(logs, a, b)
            if d is not None:
                phases[label].append(d)
        secs2, logs2, _ = build(tpl, name)
        if not any(m.startswith("CACHED template image") for _, m in logs2):
            t.note(f"rep {i + 1}: the repeated build was not served from the cache")
        cached.append(secs2)
        print(f"  rep {i + 1}: cold {secs:.2f} s, cached {secs2:.2f} s", flush=True)
    t.add("build 5 steps, cold", cold)
    for label, _, _ in STEP_PHASES:
        t.add(label, phases[label], indent=True)
    # Uploading the COPY file, the API calls and the SDK's 0.2 s status polling.
    t.add("outside the server's build log (SDK, upload, polling)", outside, indent=True)
    t.add("build 5 steps, fully cached", cached, base=cold, base_label="cold")
    return name


def random_image(registry: reg.Registry, mib: int) -> Tuple[str, str]:
    """Pushes busybox + DATA_LAYERS layers of random bytes (gzip level 1: incompressible data
    stays its size) under a fresh tag; returns (repo, tag)."""
    tag = uuid.uuid4().hex[:16]
    layers = [reg.busybox_layer()]
    per = max(1, mib * MIB // DATA_LAYERS)
    for i in range(DATA_LAYERS):
        layer = reg.Layer().dir("data").file(f"data/blob{i}", os.urandom(per))
        layer.tf.close()
        layers.append(gzip.compress(layer.buf.getvalue(), compresslevel=1, mtime=0))
    registry.push("bench/pull", tag, layers, {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["sh"]})
    return "bench/pull", tag


def skopeo_baseline(registry: reg.Registry, repo: str, tag: str, work: str) -> Tuple[float, float]:
    """skopeo copy to an OCI layout, then tar -x of every layer in order: (copy s, untar s)."""
    oci, root = os.path.join(work, "oci"), os.path.join(work, "rootfs")
    os.makedirs(root)
    t0 = time.perf_counter()
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false",
                    f"docker://{registry.host}/{repo}:{tag}", f"oci:{oci}:{tag}"], check=True)
    t1 = time.perf_counter()
    with open(os.path.join(oci, "index.json")) as f:
        mdigest = json.load(f)["manifests"][0]["digest"]
    blob = lambda d: os.path.join(oci, "blobs", *d.split(":", 1))
    with open(blob(mdigest)) as f:
        manifest = json.load(f)
    for layer in manifest["layers"]:
        subprocess.run(["tar", "-x", "-z" if layer["mediaType"].endswith("gzip") else "-a",
                        "-f", blob(layer["digest"]), "-C", root], check=True)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def bench_pull(t: Table, reps: int, mib: int, run_id: str, registry: reg.Registry, tmp: str) -> str:
    from e2b import Template

    name = f"bench-pull-{run_id}"
    have_skopeo = shutil.which("skopeo") is not None
    total, phases = [], {p[0]: [] for p in PULL_PHASES}
    sk_copy, sk_tar, sk_total = [], [], []
    for i in range(reps):
        repo, tag = random_image(registry, mib)
        # docker.io/bench/pull is served by the mirror (the loopback registry).
        secs, logs, _ = build(Template().from_image(f"{repo}:{tag}").run_cmd("true"), name)
        if any(m.startswith("CACHED image") for _, m in logs):
            t.note(f"rep {i + 1}: the pulled image was already here (not a cold pull)")
        total.append(secs)
        for label, a, b in PULL_PHASES:
            d = span(logs, a, b)
            if d is not None:
                phases[label].append(d)
        line = f"  rep {i + 1}: warren {secs:.2f} s"
        if have_skopeo:
            repo2, tag2 = random_image(registry, mib)
            work = tempfile.mkdtemp(prefix="skopeo-", dir=tmp)
            try:
                c, x = skopeo_baseline(registry, repo2, tag2, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            sk_copy.append(c)
            sk_tar.append(x)
            sk_total.append(c + x)
            line += f", skopeo copy {c:.2f} s + tar -x {x:.2f} s"
        print(line, flush=True)
    label = f"from_image {mib} MiB ({DATA_LAYERS}+1 layers) + RUN true, cold"
    if have_skopeo:
        t.add(label, total, base=sk_total, base_label="skopeo copy + tar -x")
    else:
        t.add(label, total)
        t.note("SKIP baseline: skopeo not installed")
    for lbl, _, _ in PULL_PHASES:
        base = sk_copy if lbl.startswith("pull") else sk_tar if lbl.startswith("unpack") else None
        blabel = "skopeo copy" if lbl.startswith("pull") else "tar -x" if lbl.startswith("unpack") else ""
        t.add(lbl, phases[lbl], base=base or None, base_label=blabel, indent=True)
    if phases[PULL_PHASES[0][0]]:
        t.note(f"  pull throughput: {mib / median(phases[PULL_PHASES[0][0]]):.0f} MiB/s"
               + (f" (skopeo copy {mib / median(sk_copy):.0f} MiB/s)" if sk_copy else ""))
    return name


def bench_create(t: Table, reps: int, built: str) -> None:
    from e2b import Sandbox

    def one(tpl: str) -> float:
        t0 = time.perf_counter()
        sbx = Sandbox.create(tpl, timeout=120, request_timeout=900)
        try:
            sbx.commands.run("true")
            return time.perf_counter() - t0
        finally:
            sbx.kill()

    first_built, first_base = one(built), one("base")
    samples: Dict[str, List[float]] = {built: [], "base": []}
    for i in range(reps):
        # Alternate, so drift on a shared host hits both alike.
        for tpl in (built, "base") if i % 2 == 0 else ("base", built):
            samples[tpl].append(one(tpl) * 1000)
    t.add("first create + run('true'), built template (warm-up)", [first_built * 1000], unit="ms",
          base=[first_base * 1000], base_label="base")
    t.add("create + run('true'), built template", samples[built], unit="ms",
          base=samples["base"], base_label="base")


def cleanup(srv: Serve, names: List[str]) -> None:
    for n in names:
        try:
            r = srv.http.get(f"{srv.url}/templates/aliases/{n}", timeout=30)
            if r.status_code == 200:
                srv.http.delete(f"{srv.url}/templates/{r.json()['templateID']}", timeout=60)
        except requests.RequestException as e:
            print(f"  cleanup of {n}: {e}", flush=True)
    try:
        r = srv.http.post(f"{srv.url}/v1/templates/prune", timeout=900)
        print(f"  prune: {r.status_code} {r.text[:300]}", flush=True)
    except requests.RequestException as e:
        print(f"  prune: {e}", flush=True)


def run_runtime(runtime: str, args, registry: reg.Registry, out: str) -> Table:
    t = Table(runtime)
    srv = Serve(args.bin, args.data_dir, runtime, os.path.join(out, f"serve-{runtime}.log"),
                ["--registry-mirror", f"docker.io={registry.url}", "--registry-insecure", registry.host])
    run_id = uuid.uuid4().hex[:8]
    names: List[str] = []
    ctx_dir = tempfile.mkdtemp(prefix="ctx-", dir=out)
    try:
        print(f"\n== runtime {runtime}: starting warren serve (log {srv.log_path})", flush=True)
        srv.start()
        from e2b import Sandbox
        # The first create may build the base image (minutes); not part of any figure.
        Sandbox.create(timeout=60, request_timeout=900).kill()
        for section, fn in [
            ("build", lambda: names.append(bench_builds(t, args.build_reps, run_id, ctx_dir))),
            ("pull", lambda: names.append(bench_pull(t, args.pull_reps, args.image_mib, run_id,
                                                       registry, out))),
            ("create", lambda: bench_create(t, args.create_reps, names[0]) if names else
             t.note("create: SKIP (no built template)")),
        ]:
            t0 = time.monotonic()
            print(f"-- {section}", flush=True)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - report and go on with the next section
                import traceback
                traceback.print_exc()
                t.note(f"{section}: FAILED: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
            print(f"-- {section}: {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            cleanup(srv, names)
        srv.stop()
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime", choices=["ns", "vm", "both"], default="ns")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition")
    ap.add_argument("--data-dir", default="/var/lib/warren")
    ap.add_argument("--bin", default=os.environ.get("WARREN_BIN", os.path.join(REPO_ROOT, "target", "release", "warren")))
    ap.add_argument("--image-mib", type=int, default=200, help="random data in the pulled image")
    ap.add_argument("--build-reps", type=int, default=3, help="cold and cached builds, each")
    ap.add_argument("--pull-reps", type=int, default=3)
    ap.add_argument("--create-reps", type=int, default=10, help="creates of each template")
    ap.add_argument("--out", help="logs directory (default a temp dir under /tmp)")
    args = ap.parse_args()
    if args.smoke:
        args.image_mib, args.build_reps, args.pull_reps, args.create_reps = 8, 1, 1, 1
    if os.geteuid() != 0:
        print("benches/templates.py must run as root (the server's runtimes need it): "
              "sudo .venv/bin/python benches/templates.py", file=sys.stderr)
        return 2
    if not os.path.isfile(args.bin):
        print(f"warren binary not found at {args.bin}: cargo build --release -p warren-cli", file=sys.stderr)
        return 2
    if not reg.available():
        print("needs Debian's docker-registry and busybox-static (scripts/setup.sh installs them)", file=sys.stderr)
        return 2
    # A SIGTERM (e.g. from `timeout`) unwinds through the finally blocks, so the server and
    # the registry this run started are stopped rather than left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out or tempfile.mkdtemp(prefix="warren-bench-templates-")
    os.makedirs(out, exist_ok=True)
    lock = open(LOCK, "a")
    print(f"waiting for {LOCK} ...", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    t_all = time.monotonic()
    tables = []
    registry = reg.Registry()
    try:
        for rt in (["ns", "vm"] if args.runtime == "both" else [args.runtime]):
            tables.append(run_runtime(rt, args, registry, out))
    finally:
        registry.stop()
        fcntl.flock(lock, fcntl.LOCK_UN)
    commit = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, warren {commit}, "
          f"image {args.image_mib} MiB, reps build {args.build_reps} / pull {args.pull_reps} / "
          f"create {args.create_reps}, {time.monotonic() - t_all:.0f} s, logs in {out}\n")
    for t in tables:
        print(t.render() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

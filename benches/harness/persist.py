"""Pause, resume and fork scenarios, through the E2B Python SDK against `warren serve`.

A pause is measured against what it must do: the `ns` runtime saves the sandbox's written files
to disk durably, the `vm` runtime its memory (and disk), so the baseline is a local `cp -a` +
`sync` of the same bytes on the same disk in the same run. A fork is measured until every child
answers a command, beside the same number of plain creates (to a first command) at the same
concurrency.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List

from .common import MIB, Metric


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def _local_save_ms(ctx, size: int) -> float:
    """What a pause does to the files, done locally: copy a directory holding `size` bytes
    with every attribute kept, then flush the filesystem."""
    src = tempfile.mkdtemp(prefix="warren-bench-src-", dir=ctx.data_dir)
    dst = src + ".copy"
    try:
        with open(os.path.join(src, "blob"), "wb") as f:
            f.write(os.urandom(size))
        os.sync()
        return _timed(lambda: (subprocess.run(["cp", "-a", src, dst], check=True),
                               subprocess.run(["sync", "-f", dst], check=True)))
    finally:
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(dst, ignore_errors=True)


def _sizes(ctx) -> tuple[list[int], int]:
    """Touched-memory sizes (MiB) and rounds. A namespace sandbox's files and memory both count
    against its 512 MiB; a VM's guest RAM holds the touched memory beside its kernel and caches."""
    if ctx.smoke:
        return [1], 1
    if ctx.server.runtime != "vm":
        return [64, 200], 5
    args = ctx.server.extra_args
    guest = int(args[args.index("--vm-memory-mb") + 1]) if "--vm-memory-mb" in args else 512
    return [mib for mib in (64, 256, 1024) if mib + 384 <= guest], 3


def _touch(sbx, size: int, wait: float) -> None:
    """A process that holds `size` bytes of its own memory, every page written."""
    sbx.commands.run(
        f"python3 -c 'import time; b = bytearray({size}); "
        f"[b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; "
        f"open(\"/tmp/touched\", \"w\").close(); time.sleep(3600)'",
        background=True)
    deadline = time.monotonic() + 600
    while sbx.commands.run("test -e /tmp/touched && echo yes || true", timeout=60).stdout.strip() != "yes":
        if time.monotonic() > deadline:
            raise RuntimeError("the memory toucher never finished")
        time.sleep(wait)


def scenario_pause(ctx) -> None:
    from e2b import Sandbox

    from .scenarios import kill, sdk_create

    res, S = ctx.results, "pause"
    vm = ctx.server.runtime == "vm"
    sizes_mib, rounds = _sizes(ctx)
    for mib in sizes_mib:
        size = mib * MIB
        # A VM pause writes its touched memory; a namespace pause the written files.
        written = min(mib, 64) if vm else mib
        base = f"baseline: local cp -a + sync of {mib} MiB"
        res.add(Metric(S, base, "ms", [_local_save_ms(ctx, size) for _ in range(rounds)]))
        sbx = sdk_create(ctx)
        try:
            sbx.commands.run(f"head -c {written * MIB} /dev/urandom > /home/user/blob")
            _touch(sbx, size, 0.5 if ctx.smoke else 1.0)
            what = f"{mib} MiB touched + {written} MiB written" if vm else f"{mib} MiB written + touched"
            pause_ms: List[float] = []
            resume_ms: List[float] = []
            for _ in range(rounds):
                pause_ms.append(_timed(lambda: sbx.pause()))
                resume_ms.append(_timed(lambda: Sandbox.connect(sbx.sandbox_id, timeout=600)
                                        .commands.run("true")))
            res.add(Metric(S, f"memory pause, {what}", "ms", pause_ms, baseline=base))
            res.add(Metric(S, f"resume to first command, {mib} MiB (memory)", "ms", resume_ms))
            fs_pause: List[float] = []
            fs_resume: List[float] = []
            for _ in range(rounds):
                fs_pause.append(_timed(lambda: sbx.pause(mode="filesystem")))
                fs_resume.append(_timed(lambda: Sandbox.connect(sbx.sandbox_id, timeout=600)
                                        .commands.run("true")))
            res.add(Metric(S, f"filesystem pause, {written} MiB written", "ms", fs_pause,
                           baseline=base))
            res.add(Metric(S, f"resume to first command, {written} MiB (filesystem)", "ms",
                           fs_resume))
            if vm:
                res.note(S, "vm: a filesystem resume boots the guest kernel on the saved disk")
        finally:
            kill(ctx, sbx.sandbox_id)


def scenario_fork(ctx) -> None:
    from e2b import Sandbox

    from .scenarios import kill_many, sdk_create

    res, S = ctx.results, "fork"
    count, rounds = (2, 1) if ctx.smoke else (10, 3)
    base = f"baseline: {count} concurrent creates to first command"

    def creates() -> None:
        def one(_):
            s = sdk_create(ctx)
            s.commands.run("true")
            return s.sandbox_id
        with ThreadPoolExecutor(max_workers=count) as ex:
            ids = list(ex.map(one, range(count)))
        kill_many(ctx, ids)

    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        creates()
        samples.append((time.perf_counter() - t0) * 1000.0)
    res.add(Metric(S, base, "ms", samples))

    parent = sdk_create(ctx)
    try:
        parent.commands.run("head -c 16777216 /dev/urandom > /home/user/state")
        fork_ms: List[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            children = parent.fork(count=count)
            failed = [c for c in children if isinstance(c, Exception)]
            good: List[Sandbox] = [c for c in children if not isinstance(c, Exception)]
            with ctx.lock:
                ctx.created.extend(c.sandbox_id for c in good)
            with ThreadPoolExecutor(max_workers=count) as ex:
                list(ex.map(lambda c: c.commands.run("true"), good))
            elapsed = (time.perf_counter() - t0) * 1000.0
            kill_many(ctx, [c.sandbox_id for c in good])
            if failed:
                raise RuntimeError(f"{len(failed)} of {count} forks failed: {failed[0]}")
            fork_ms.append(elapsed)
        res.add(Metric(S, f"fork x{count} until every child answers (16 MiB written)", "ms",
                       fork_ms, baseline=base))
    finally:
        kill_many(ctx, [parent.sandbox_id])

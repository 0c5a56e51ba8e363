"""Server crashes at random points: `warren serve` is SIGKILLed while an operation is under way,
restarted on the same data dir and port, and what it had acknowledged is checked.

A ledger holds what the server acknowledged: each sandbox's state (running or paused) and the
checksums of the files uploaded into it, and the snapshots taken. An operation the kill cut
off may have happened or not; whichever it was, the result must be whole (a sandbox it made is
listed and works, a snapshot it made is listed and restores). Everything else is a loss:
an acknowledged sandbox missing or in another state, a file that reads back different, a
snapshot gone, a sandbox listed that no operation made. Orphans (mounts, cgroups, namespaces,
disks, state a restart did not take back or remove) show in the host counts the caller
compares once every sandbox and snapshot is deleted.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set

OPS = ("create", "pause", "resume", "fork", "upload", "kill", "snapshot")
# Sandboxes kept alive at once: enough for every operation to have a subject, few enough
# that a VM suite stays within memory.
POPULATION = 4


@dataclass
class Known:
    """One sandbox as the server acknowledged it."""

    state: str  # "running" or "paused"
    files: Dict[str, str] = field(default_factory=dict)  # path -> sha256


@dataclass
class Ledger:
    sandboxes: Dict[str, Known] = field(default_factory=dict)
    snapshots: Dict[str, Dict[str, str]] = field(default_factory=dict)  # id -> files in it


@dataclass
class Report:
    rounds: int = 0
    cut: Dict[str, int] = field(default_factory=dict)  # op -> rounds the kill interrupted
    done: Dict[str, int] = field(default_factory=dict)  # op -> rounds it finished first
    restart_ms: List[float] = field(default_factory=list)
    lost: List[str] = field(default_factory=list)


class Crashes:
    """Runs `rounds` crash rounds against `server` (a harness `Server`, restarted in place)."""

    def __init__(self, server, api, rounds: int, seed: int, timeout: int = 600):
        self.server = server
        self.api = api  # (method, path, **kw) -> requests.Response, against the current URL
        self.rounds = rounds
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.ledger = Ledger()
        self.report = Report()
        self.duration: Dict[str, float] = {}
        self.subject: Optional[str] = None  # the sandbox the current operation acts on

    # -- operations; each returns what the ledger learns if it is acknowledged -------------

    def _sandbox(self, sid: str):
        from e2b import Sandbox
        return Sandbox.connect(sid, timeout=self.timeout)

    def _subject(self, *states: str) -> Optional[str]:
        ids = sorted(s for s, k in self.ledger.sandboxes.items() if k.state in states)
        self.subject = self.rng.choice(ids) if ids else None
        return self.subject

    def _prepare(self, op: str) -> Optional[Callable[[], Callable[[], None]]]:
        """The operation as a callable that runs it and returns the ledger update to apply
        when it was acknowledged; None when the op has no subject now."""
        from e2b import Sandbox
        led = self.ledger
        self.subject = None
        if op == "create":
            def run():
                s = Sandbox.create(timeout=self.timeout)
                return lambda: led.sandboxes.__setitem__(s.sandbox_id, Known("running"))
            return run
        if op == "kill":  # any sandbox, running or paused
            sid = self._subject("running", "paused")
            if sid is None:
                return None

            def run():
                Sandbox.kill(sid)
                return lambda: led.sandboxes.pop(sid, None)
            return run
        if op == "resume":
            sid = self._subject("paused")
            if sid is None:
                return None

            def run():
                self._sandbox(sid)
                return lambda: setattr(led.sandboxes[sid], "state", "running")
            return run
        sid = self._subject("running")
        if sid is None:
            return None
        if op == "pause":
            def run():
                Sandbox.pause(sid)
                return lambda: setattr(led.sandboxes[sid], "state", "paused")
            return run
        if op == "fork":
            def run():
                children = self._sandbox(sid).fork(count=1, timeout=self.timeout)
                made = [c.sandbox_id for c in children if not isinstance(c, Exception)]
                files = dict(led.sandboxes[sid].files)
                return lambda: [led.sandboxes.__setitem__(c, Known("running", dict(files))) for c in made]
            return run
        if op == "upload":
            data = os.urandom(self.rng.choice((64 << 10, 4 << 20)))
            path = f"/home/user/crash/{self.report.rounds}.bin"

            def run():
                self._sandbox(sid).files.write(path, data)
                digest = hashlib.sha256(data).hexdigest()
                return lambda: led.sandboxes[sid].files.__setitem__(path, digest)
            return run
        if op == "snapshot":
            def run():
                snap = self._sandbox(sid).create_snapshot()
                files = dict(led.sandboxes[sid].files)
                return lambda: led.snapshots.__setitem__(snap.snapshot_id, files)
            return run
        raise ValueError(op)

    def _uncut(self, op: str) -> bool:
        """Runs `op` to the end (to give later rounds subjects); True if it had one."""
        run = self._prepare(op)
        if run is None:
            return False
        t = time.perf_counter()
        run()()
        self.duration[op] = max(self.duration.get(op, 0.0), time.perf_counter() - t)
        return True

    # -- the rounds -------------------------------------------------------------------------

    def run(self) -> Report:
        for op in OPS:  # one uncut run of each gives the kill's time window
            if op in ("resume",):
                self._uncut("pause")
            if not self._uncut(op):
                self._uncut("create")
                self._uncut(op)
        for i in range(self.rounds):
            self.report.rounds = i + 1
            op = OPS[i % len(OPS)]
            self._keep_population(op)
            self._round(op)
        return self.report

    def _keep_population(self, op: str) -> None:
        led = self.ledger.sandboxes
        while len(led) > POPULATION:
            self._uncut("kill")
        if op != "create" and not any(k.state == "running" for k in led.values()):
            self._uncut("create")
        if op == "resume" and not any(k.state == "paused" for k in led.values()):
            if not any(k.state == "running" for k in led.values()):
                self._uncut("create")
            self._uncut("pause")

    def _round(self, op: str) -> None:
        run = self._prepare(op)
        if run is None:
            return
        outcome: dict = {}

        def work():
            try:
                outcome["apply"] = run()
            except Exception as e:  # the kill cuts the request off: expected
                outcome["error"] = e

        subject = self.subject
        t = threading.Thread(target=work, daemon=True)
        t.start()
        time.sleep(self.rng.uniform(0, self.duration.get(op, 1.0)))
        self.server.proc.send_signal(signal.SIGKILL)  # this PID only
        self.server.proc.wait()
        t.join(120)
        if "apply" in outcome:
            outcome["apply"]()
            self.report.done[op] = self.report.done.get(op, 0) + 1
        else:
            self.report.cut[op] = self.report.cut.get(op, 0) + 1
        started = time.perf_counter()
        self.server.start(port=self.server.port)
        self.report.restart_ms.append((time.perf_counter() - started) * 1000)
        self._check(op, cut="apply" not in outcome, subject=subject)

    # -- what the restarted server must have ------------------------------------------------

    def _listed(self) -> Dict[str, str]:
        r = self.api("GET", "/v2/sandboxes?state=running,paused&limit=100")
        r.raise_for_status()
        return {s["sandboxID"]: s["state"] for s in r.json()}

    def _snapshots(self) -> Set[str]:
        r = self.api("GET", "/snapshots?limit=100")
        r.raise_for_status()
        return {s["snapshotID"] for s in r.json()}

    def _check(self, op: str, cut: bool, subject: Optional[str]) -> None:
        lost = self.report.lost
        where = f"round {self.report.rounds} ({op}, {'cut' if cut else 'finished'})"
        listed = self._listed()
        for sid, known in list(self.ledger.sandboxes.items()):
            got = listed.get(sid)
            if got == known.state:
                continue
            # The cut operation may have moved its subject; anything else is a loss.
            in_doubt = cut and op in ("pause", "resume", "kill") and sid == subject
            if in_doubt and (got is not None or op == "kill"):
                if got is None:
                    self.ledger.sandboxes.pop(sid)
                else:
                    known.state = got
                continue
            lost.append(f"{where}: {sid} was {known.state}, is {got or 'gone'}")
            self.ledger.sandboxes.pop(sid)
        made = 0  # a cut create or fork (of one child) may have made one sandbox
        for sid, state in listed.items():
            if sid in self.ledger.sandboxes:
                continue
            made += 1
            if cut and op in ("create", "fork") and made == 1:
                # A cut fork's child has its parent's files.
                parent = self.ledger.sandboxes.get(subject) if op == "fork" else None
                self.ledger.sandboxes[sid] = Known(state, dict(parent.files) if parent else {})
            else:
                lost.append(f"{where}: {sid} is listed ({state}) but no operation made it")
        for sid, known in self.ledger.sandboxes.items():
            if known.state == "running":
                self._check_files(where, sid, known)
        snaps = self._snapshots()
        for snap in list(self.ledger.snapshots):
            if snap not in snaps:
                lost.append(f"{where}: snapshot {snap} is gone")
                self.ledger.snapshots.pop(snap)
        for n, snap in enumerate(sorted(snaps - set(self.ledger.snapshots))):
            if cut and op == "snapshot" and n == 0:
                parent = self.ledger.sandboxes.get(subject)
                self.ledger.snapshots[snap] = dict(parent.files) if parent else {}
            else:
                lost.append(f"{where}: snapshot {snap} is listed but was never taken")

    def _check_files(self, where: str, sid: str, known: Known) -> None:
        try:
            s = self._sandbox(sid)
            r = s.commands.run("mkdir -p /home/user/crash && cd /home/user/crash && sha256sum -- *.bin 2>/dev/null; true",
                               timeout=120)
        except Exception as e:
            self.report.lost.append(f"{where}: {sid} does not answer: {e}")
            return
        for path, digest in known.files.items():
            if f"{digest}  {os.path.basename(path)}" not in r.stdout:
                self.report.lost.append(f"{where}: {path} in {sid} reads back different")

    def finish(self) -> None:
        """Resumes every paused sandbox and restores every snapshot once, checking files; then
        kills and deletes all of it."""
        from e2b import Sandbox
        where = "at the end"
        for sid, known in list(self.ledger.sandboxes.items()):
            if known.state == "paused":
                try:
                    self._sandbox(sid)
                    known.state = "running"
                except Exception as e:
                    self.report.lost.append(f"{where}: paused {sid} does not resume: {e}")
                    continue
            self._check_files(where, sid, known)
        for snap, files in list(self.ledger.snapshots.items()):
            try:
                s = Sandbox.create(snap, timeout=self.timeout)
                self._check_files(f"{where} (snapshot {snap})", s.sandbox_id, Known("running", files))
                s.kill()
            except Exception as e:
                self.report.lost.append(f"{where}: snapshot {snap} does not restore: {e}")
        for sid in self._listed():
            Sandbox.kill(sid)
        for snap in self._snapshots():
            Sandbox.delete_snapshot(snap)

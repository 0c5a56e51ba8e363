"""The official `e2b` CLI's sandbox commands (npm `@e2b/cli` 2.19.0) against the suite's server:
list, info, exec (foreground with exit codes, env, cwd, user; background), metrics, logs,
pause, resume, snapshot create/list/delete and kill, with the environment a user sets
(`E2B_API_KEY`, `E2B_API_URL`, `E2B_SANDBOX_URL`); and the interactive `sandbox create` and
`connect`, driven through a pseudo-terminal as a user's shell would run them."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
import uuid

from e2b import Sandbox

# The CLI and its environment, as the template commands' tests run it.
from test_e2b_cli import e2b  # noqa: E402,F401 - a pytest fixture, used by name


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def _json(r: subprocess.CompletedProcess):
    out = _ok(r)
    return json.loads(out[out.index(next(c for c in out if c in "[{")):])


def _id(item: dict, kind: str = "sandbox") -> str:
    """The CLI prints the SDK's objects (`sandboxId`); the API's names are `sandboxID`."""
    return item.get(f"{kind}Id") or item[f"{kind}ID"]


def test_sandbox_commands(e2b):
    marker = uuid.uuid4().hex[:12]
    sbx = Sandbox.create(timeout=300, metadata={"cli": marker})
    sid = sbx.sandbox_id
    try:
        listed = _json(e2b("sandbox", "list", "--metadata", f"cli={marker}", "--format", "json"))
        assert [_id(s) for s in listed] == [sid], listed
        info = _json(e2b("sandbox", "info", sid, "--format", "json"))
        assert _id(info) == sid and info["metadata"]["cli"] == marker, info

        # Options go before the sandbox id; what follows it is the command, run by a shell.
        out = _ok(e2b("sandbox", "exec", "-e", f"CLI_VAR={marker}", "-c", "/tmp", sid,
                      'echo "$CLI_VAR $(pwd) $(id -un)"'))
        assert f"{marker} /tmp user" in out, out
        root = _ok(e2b("sandbox", "exec", "-u", "root", sid, "id", "-u"))
        assert root.strip().endswith("0"), root
        failed = e2b("sandbox", "exec", sid, "exit 7")
        assert failed.returncode == 7, (failed.returncode, failed.stdout, failed.stderr)
        _ok(e2b("sandbox", "exec", "-b", sid, f"sleep 1; echo bg > /tmp/{marker}"))
        sbx.commands.run(f"for i in $(seq 100); do [ -f /tmp/{marker} ] && exit 0; sleep 0.1; done; exit 1")

        # One JSON object per line, one line per sample.
        out = _ok(e2b("sandbox", "metrics", sid, "--format", "json"))
        samples = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert samples and samples[-1]["cpuCount"] == 2 and samples[-1]["memTotal"] > 0, out
        logs = e2b("sandbox", "logs", sid, "--format", "json")
        _ok(logs)

        _ok(e2b("sandbox", "pause", sid))
        paused = _json(e2b("sandbox", "list", "--state", "paused", "--metadata", f"cli={marker}",
                           "--format", "json"))
        assert [_id(s) for s in paused] == [sid], paused
        _ok(e2b("sandbox", "resume", sid))
        assert f"{marker} /home/user" in _ok(
            e2b("sandbox", "exec", sid, f"cat /tmp/{marker} >/dev/null && echo {marker} $PWD")
        )

        snap_name = f"cli-snap-{marker}"
        _ok(e2b("sandbox", "snapshot", "create", sid, "--name", snap_name))
        snaps = _ok(e2b("sandbox", "snapshot", "list", "--name", snap_name, "--format", "json"))
        assert snap_name in snaps, snaps
        snap_ids = [_id(s, "snapshot") for s in json.loads(snaps[snaps.index("["):])]
        assert snap_ids, snaps
        _ok(e2b("sandbox", "snapshot", "delete", *snap_ids))

        _ok(e2b("sandbox", "kill", sid))
        gone = _json(e2b("sandbox", "list", "--metadata", f"cli={marker}", "--format", "json"))
        assert gone == [], gone
    finally:
        try:
            sbx.kill()
        except Exception:  # noqa: BLE001 - already killed by the CLI
            pass


def _interactive(e2b, args: list[str], typed: str, until: str, deadline_s: float = 180) -> str:
    """Runs the CLI on a pseudo-terminal, types `typed` once the remote shell has printed
    something, and returns everything it printed once `until` appeared and it exited."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*e2b.argv, *args], env=e2b.env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    out, sent = b"", False
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the CLI exited and closed its side
                    break
                if not data:
                    break
                out += data
                # The remote shell's prompt ends with "$ " (user) or "# " (root).
                if not sent and (b"$ " in out or b"# " in out):
                    os.write(master, typed.encode())
                    sent = True
            if proc.poll() is not None and not ready:
                break
        proc.wait(timeout=max(1.0, end - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = out.decode(errors="replace")
    assert sent, f"no shell prompt within {deadline_s} s:\n{text}"
    assert until in text, text
    return text


def test_interactive_create_and_connect(e2b):
    # `sandbox connect`: a terminal into a running sandbox, which outlives the session.
    sbx = Sandbox.create(timeout=300)
    try:
        marker = uuid.uuid4().hex[:8]
        _interactive(e2b, ["sandbox", "connect", sbx.sandbox_id],
                     f"echo {marker}-$((6*7)) > /tmp/cli-connect; echo {marker}-$((6*7)); exit\n",
                     f"{marker}-42")
        assert sbx.commands.run("cat /tmp/cli-connect").stdout == f"{marker}-42\n"
        assert sbx.is_running()
    finally:
        sbx.kill()

    # `sandbox create`: a new sandbox of the template with a terminal into it.
    marker = uuid.uuid4().hex[:8]
    text = _interactive(e2b, ["sandbox", "create", "base"],
                        f"echo {marker}-$((6*7)) $E2B_SANDBOX_ID; exit\n", f"{marker}-42 ")
    created = text.split(f"{marker}-42 ")[-1].split()[0]
    assert created, text
    # On exit the CLI gives the sandbox a 1 s timeout, so it ends on its own soon after.
    deadline = time.monotonic() + 60
    while created in [s.sandbox_id for s in Sandbox.list().next_items()]:
        assert time.monotonic() < deadline, f"{created} still running 60 s after the CLI exited"
        time.sleep(0.5)

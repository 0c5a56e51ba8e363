"""The audit trail (`GET /v1/sandboxes/{id}/audit`, `warren sandbox audit`) and E2B's sandbox
logs (`/sandboxes/{id}/logs` v1 and v2, the `e2b sandbox logs` CLI): processes started through
the SDK with their output and exit, programs run inside a terminal, files changed through the
SDK and lifecycle changes, kept after the sandbox ends."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest
from e2b import CommandExitException, Sandbox

from support.warren import API_KEY, ROOT, require, same_on_every_runtime, warren_bin

WARREN = warren_bin()
E2B_CLI = os.path.join(ROOT, "tests", "e2e", "e2b-cli", "node_modules", ".bin", "e2b")


def _audit(api, sid, **params):
    r = api.get(f"{api.base}/v1/sandboxes/{sid}/audit", params=params)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def _until(api, sid, pred, what, seconds=30, **params):
    """The trail once `pred` holds for it (entries from inside reach the server within a few
    seconds; a read of a running sandbox's trail reads its journals first)."""
    deadline = time.time() + seconds
    while True:
        got = _audit(api, sid, **params)
        if pred(got):
            return got
        if time.time() > deadline:
            pytest.fail(f"{what}: not in the trail after {seconds} s: {json.dumps(got)[:3000]}")
        time.sleep(0.5)


def _of(entries, kind):
    return [e for e in entries if e["kind"] == kind]


def test_commands_their_output_and_files_are_in_the_trail(server, api):
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    marker = uuid.uuid4().hex[:12]
    try:
        r = sbx.commands.run(f"echo out-{marker}; echo err-{marker} >&2", cwd="/tmp")
        assert r.exit_code == 0
        with pytest.raises(CommandExitException):
            sbx.commands.run(f"echo failing-{marker}; exit 3")
        sbx.files.write(f"/tmp/{marker}.txt", "hello")
        sbx.files.rename(f"/tmp/{marker}.txt", f"/tmp/{marker}-moved.txt")
        sbx.files.make_dir(f"/tmp/dir-{marker}")
        sbx.files.remove(f"/tmp/{marker}-moved.txt")

        got = _until(api, sid, lambda g: any(e["fields"].get("path") == f"/tmp/{marker}-moved.txt"
                                             for e in _of(g, "file.remove")), "the remove")
        starts = [e for e in _of(got, "process.start") if marker in e["fields"]["argv"]]
        assert len(starts) == 2, starts
        first = starts[0]["fields"]
        assert json.loads(first["argv"])[:2] == ["/bin/bash", "-l"]
        assert first["cwd"] == "/tmp" and first["user"] == "user" and first["via"] == "api"
        ends = {e["fields"]["pid"]: e for e in _of(got, "process.end")}
        codes = sorted(ends[s["fields"]["pid"]]["fields"]["exit_code"] for s in starts)
        assert codes == ["0", "3"], ends
        assert all(int(ends[s["fields"]["pid"]]["fields"]["duration_ms"]) >= 0 for s in starts)
        lines = {(e["fields"]["stream"], e["message"]) for e in _of(got, "process.output")}
        assert ("stdout", f"out-{marker}") in lines and ("stderr", f"err-{marker}") in lines, lines
        assert ("stdout", f"failing-{marker}") in lines
        writes = [e["fields"]["path"] for e in _of(got, "file.write")]
        assert f"/tmp/{marker}.txt" in writes, writes
        renames = _of(got, "file.rename")
        assert any(e["fields"]["destination"] == f"/tmp/{marker}-moved.txt" for e in renames), renames
        assert any(e["fields"]["path"] == f"/tmp/dir-{marker}" for e in _of(got, "file.mkdir"))
        assert _of(got, "lifecycle.created"), "the lifecycle joins the trail"
        stamps = [e["timestamp"] for e in got]
        assert stamps == sorted(stamps), "oldest first"
    finally:
        sbx.kill()


def test_programs_run_in_a_terminal_are_in_the_trail(server, api):
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    marker = uuid.uuid4().hex[:12]
    try:
        from e2b import PtySize

        term = sbx.pty.create(PtySize(rows=24, cols=80), timeout=60)
        # A program that lives a while (one gone before the host reads /proc is journaled by
        # its name only), named by an argument the test can find.
        sbx.pty.send_stdin(term.pid, f"sh -c 'sleep 1; exit 2' audit-{marker}; exit 0\n".encode())
        term.wait(on_pty=lambda _d: None)

        def seen(g):
            return any(f"audit-{marker}" in e["fields"].get("argv", "") for e in _of(g, "process.exec"))

        got = _until(api, sid, seen, "the program run in the terminal", kind="process")
        sh = [e for e in _of(got, "process.exec") if f"audit-{marker}" in e["fields"]["argv"]][0]
        argv = json.loads(sh["fields"]["argv"])
        assert argv[-3:] == ["-c", "sleep 1; exit 2", f"audit-{marker}"], argv
        assert sh["fields"]["uid"] == "1000", sh
        pid = sh["fields"]["pid"]
        assert int(pid) < 100000
        exits = _until(api, sid, lambda g: any(e["fields"].get("pid") == pid for e in _of(g, "process.exit")),
                       "its exit", kind="process.exit")
        mine = [e for e in exits if e["fields"].get("pid") == pid][0]
        assert mine["fields"].get("exit_code") == "2", mine
        assert int(mine["fields"]["duration_ms"]) >= 900, mine
    finally:
        sbx.kill()


def test_what_ran_just_before_a_kill_is_kept(server, api):
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    marker = uuid.uuid4().hex[:12]
    sbx.commands.run(f"echo last-{marker}")
    sbx.kill()
    got = _audit(api, sid)
    assert any(e["message"] == f"last-{marker}" for e in _of(got, "process.output")), got
    assert _of(got, "lifecycle.killed")


def test_logs_for_e2b_clients_and_the_e2b_cli(server, api):
    same_on_every_runtime("the logs endpoints translate the same trail on every runtime")
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    marker = uuid.uuid4().hex[:12]
    try:
        sbx.commands.run(f"echo log-{marker}; echo warn-{marker} >&2")
        _until(api, sid, lambda g: any(e["message"] == f"warn-{marker}" for e in g), "the output")

        v1 = api.get(f"{api.base}/sandboxes/{sid}/logs").json()
        assert len(v1["logs"]) == len(v1["logEntries"]) > 0
        lines = [json.loads(l["line"]) for l in v1["logs"]]
        assert {"level", "logger", "message"} <= set(lines[0])
        out = [l for l in lines if l["message"] == f"log-{marker}"][0]
        assert out["logger"] == "processSvc" and out["level"] == "info" and out["stream"] == "stdout"
        later = api.get(f"{api.base}/sandboxes/{sid}/logs",
                        params={"start": int(time.time() * 1000) + 60_000}).json()
        assert later["logs"] == [], "start filters by time"

        v2 = api.get(f"{api.base}/v2/sandboxes/{sid}/logs", params={"level": "warn"}).json()["logs"]
        assert v2 and all(e["level"] in ("warn", "error") for e in v2), v2
        assert any(e["message"] == f"warn-{marker}" for e in v2)
        backward = api.get(f"{api.base}/v2/sandboxes/{sid}/logs").json()["logs"]
        assert [e["timestamp"] for e in backward] == sorted((e["timestamp"] for e in backward), reverse=True)
        forward = api.get(f"{api.base}/v2/sandboxes/{sid}/logs",
                          params={"direction": "forward", "search": f"LOG-{marker}"}).json()["logs"]
        found = [e["message"] for e in forward]
        assert f"log-{marker}" in found and all(f"log-{marker}" in m for m in found), found
        assert found.index(f"log-{marker}") == len(found) - 1, "oldest first: the start, then the line"

        require("the e2b CLI (npm ci in tests/e2e/e2b-cli; Node.js >= 20.18.1)", os.path.exists(E2B_CLI))
        env = dict(os.environ, E2B_API_KEY=API_KEY, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url,
                   E2B_ACCESS_TOKEN="sk_e2b_" + "0" * 40, NO_COLOR="1")
        r = subprocess.run([E2B_CLI, "sandbox", "logs", sid, "--format", "json"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        printed = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
        assert any(p.get("message") == f"log-{marker}" for p in printed), r.stdout
    finally:
        sbx.kill()


def test_filters_export_and_bad_input(server, api):
    same_on_every_runtime("the trail's queries are the control plane's")
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    marker = uuid.uuid4().hex[:12]
    try:
        sbx.commands.run(f"echo f-{marker}")
        sbx.files.write(f"/tmp/f-{marker}", "x")
        _until(api, sid, lambda g: _of(g, "file.write"), "the write")

        only = _audit(api, sid, kind="file")
        assert only and all(e["kind"].startswith("file.") for e in only)
        both = _audit(api, sid, kind=["file.write", "lifecycle"])
        assert {e["kind"] for e in both} >= {"file.write", "lifecycle.created"}
        assert len(_audit(api, sid, limit=1)) == 1
        newest = _audit(api, sid, order="desc")
        assert [e["timestamp"] for e in newest] == sorted((e["timestamp"] for e in newest), reverse=True)
        assert _audit(api, sid, since=int(time.time() * 1000) + 60_000) == []

        r = api.get(f"{api.base}/v1/sandboxes/{sid}/audit", params={"format": "jsonl"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        rows = [json.loads(l) for l in r.text.splitlines()]
        assert rows and {"timestamp", "kind", "level", "message", "fields"} <= set(rows[0])

        cli = subprocess.run([WARREN, "sandbox", "--server", server.url, "audit", sid, "--jsonl", "--kind", "process"],
                             env=dict(os.environ, WARREN_API_KEY=API_KEY), capture_output=True, text=True,
                             timeout=60)
        assert cli.returncode == 0, cli.stderr
        exported = [json.loads(l) for l in cli.stdout.splitlines()]
        assert any(e["message"] == f"f-{marker}" for e in exported)
        assert all(e["kind"].startswith("process.") for e in exported)

        for params, status in [({"limit": 0}, 400), ({"limit": "x"}, 400), ({"order": "up"}, 400),
                               ({"level": "loud"}, 400), ({"since": "yesterday"}, 400),
                               ({"since": 2000, "until": 1000}, 400), ({"format": "xml"}, 400)]:
            r = api.get(f"{api.base}/v1/sandboxes/{sid}/audit", params=params)
            assert r.status_code == status, (params, r.text)
            assert r.json()["message"], r.text
        missing = api.get(f"{api.base}/v1/sandboxes/nosuchsandbox/audit")
        assert missing.status_code == 404, missing.text
        assert api.get(f"{api.base}/sandboxes/nosuchsandbox/logs").status_code == 404
    finally:
        sbx.kill()

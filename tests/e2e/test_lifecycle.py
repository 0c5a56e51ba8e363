"""The control plane through the unmodified E2B SDK."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException, SandboxException, SandboxNotRunningException


def test_create_commands_files_kill(server):
    sbx = Sandbox.create(metadata={"suite": "e2e"})
    try:
        assert sbx.is_running()
        r = sbx.commands.run("echo hi && whoami")
        assert r.stdout.split() == ["hi", "user"]
        assert r.exit_code == 0
        sbx.files.write("/home/user/a.txt", "hello warren")
        assert sbx.files.read("/home/user/a.txt") == "hello warren"
        info = sbx.get_info()
        assert info.metadata["suite"] == "e2e"
    finally:
        assert sbx.kill()
    assert not sbx.is_running()
    assert not Sandbox.kill(sbx.sandbox_id)


def test_env_vars_and_connect(server):
    sbx = Sandbox.create(envs={"WARREN_E2E": "yes"})
    try:
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("echo $WARREN_E2E").stdout.strip() == "yes"
    finally:
        sbx.kill()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_list_metadata_filter_and_pagination(server):
    tag = uuid.uuid4().hex
    boxes = [Sandbox.create(metadata={"run": tag, "n": str(i)}) for i in range(3)]
    other = Sandbox.create(metadata={"run": "other"})
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata={"run": tag}), limit=2)
        seen = []
        while paginator.has_next:
            seen.extend(s.sandbox_id for s in paginator.next_items())
        assert sorted(seen) == sorted(b.sandbox_id for b in boxes)
    finally:
        for b in boxes + [other]:
            b.kill()
    left = Sandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()
    assert left == []


def test_set_timeout_expires(server):
    sbx = Sandbox.create()
    sbx.set_timeout(5)
    time.sleep(7)
    assert not sbx.is_running()
    with pytest.raises(NotFoundException):
        sbx.get_info()


def test_kill_while_command_runs(server, outcome_within):
    sbx = Sandbox.create()
    # The command outlives the stream's client deadline (300 s), which is far beyond the
    # bounded wait below: only the kill can end the wait in time, and a client timeout
    # (a plain TimeoutException) cannot pass for the kill.
    cmd = sbx.commands.run("sleep 600", background=True, timeout=300)
    sbx.kill()
    ended = outcome_within(60, cmd.wait)
    assert ended is not None, "the kill did not cut the command's stream"
    # The SDK probes the sandbox after the cut stream and finds it gone.
    assert isinstance(ended, SandboxNotRunningException), repr(ended)


def test_twenty_concurrent_creates(server):
    with ThreadPoolExecutor(20) as pool:
        boxes = list(pool.map(lambda _: Sandbox.create(), range(20)))
    try:
        assert len({b.sandbox_id for b in boxes}) == 20
        outs = list(ThreadPoolExecutor(20).map(lambda b: b.commands.run("echo ok").stdout.strip(), boxes))
        assert outs == ["ok"] * 20
    finally:
        list(ThreadPoolExecutor(20).map(lambda b: b.kill(), boxes))


def test_restart_keeps_running_sandboxes(server):
    sbx = Sandbox.create()
    try:
        sbx.files.write("/home/user/before.txt", "kept")
        server.restart()
        assert sbx.is_running()
        assert sbx.commands.run("cat /home/user/before.txt").stdout == "kept"
    finally:
        sbx.kill()


def test_sdk_errors(server):
    with pytest.raises(SandboxException):
        Sandbox.create(template="no-such-template")
    with pytest.raises(NotFoundException):
        Sandbox.get_info("nosuchsandbox")
    assert Sandbox.kill("nosuchsandbox") is False

"""What every supported `e2b` release does with a sandbox, written against the calls that
release has (1.x creates with the constructor and resumes with `Sandbox.resume`; 2.x has
`Sandbox.create` and resumes through `connect`)."""

from __future__ import annotations

import importlib.metadata

import e2b
from conftest import DOMAIN, DOMAIN_MODE
from e2b import Sandbox

VERSION = tuple(int(p) for p in importlib.metadata.version("e2b").split(".")[:2])


def _create(**kw) -> Sandbox:
    if hasattr(Sandbox, "create") and VERSION >= (2, 0):
        return Sandbox.create(**kw)
    return Sandbox(**kw)


def _pause(sbx: Sandbox) -> bool:
    """Pauses `sbx`; False for a release without pause (1.x before its beta)."""
    for name in ("beta_pause", "pause"):
        if hasattr(sbx, name):
            getattr(sbx, name)()
            return True
    assert VERSION < (2, 0), f"e2b {VERSION} has no pause"
    return False


def _resume(sandbox_id: str) -> Sandbox:
    if VERSION < (2, 0) and hasattr(Sandbox, "resume"):
        return Sandbox.resume(sandbox_id)
    return Sandbox.connect(sandbox_id)


def _listed_ids() -> list[str]:
    found = Sandbox.list()
    if hasattr(found, "next_items"):
        found = found.next_items()
    return [s.sandbox_id for s in found]


def test_create_run_files_pty_list_pause_connect_kill(sdk_server):
    sbx = _create(timeout=120, metadata={"matrix": "yes"}, envs={"MATRIX_VAR": "from-create"})
    try:
        if DOMAIN_MODE:
            # Reached by name, as the release under test does it.
            assert sbx.get_host(8000) == f"8000-{sbx.sandbox_id}.{DOMAIN}"
        assert sbx.commands.run("echo $MATRIX_VAR").stdout == "from-create\n"
        bg = sbx.commands.run("sleep 30", background=True)
        assert bg.pid > 0
        bg.kill()
        sbx.files.write("/home/user/kept.txt", "kept across pause")
        assert sbx.files.read("/home/user/kept.txt") == "kept across pause"
        assert any(e.name == "kept.txt" for e in sbx.files.list("/home/user"))

        out = bytearray()
        term = sbx.pty.create(e2b.PtySize(rows=24, cols=80))
        sbx.pty.send_stdin(term.pid, b"echo pty-$((6*7)); exit\n")
        term.wait(on_pty=lambda data: out.extend(data))
        assert b"pty-42" in out, out

        assert sbx.sandbox_id in _listed_ids()
        info = Sandbox.get_info(sbx.sandbox_id) if hasattr(Sandbox, "get_info") else None
        if info is not None:
            assert info.metadata.get("matrix") == "yes"

        # Paused and resumed where the release can; else connected to from scratch.
        again = _resume(sbx.sandbox_id) if _pause(sbx) else Sandbox.connect(sbx.sandbox_id)
        assert again.files.read("/home/user/kept.txt") == "kept across pause"
        assert again.commands.run("echo resumed").stdout == "resumed\n"
        again.set_timeout(60)
    finally:
        sbx.kill()
    assert sbx.sandbox_id not in _listed_ids()


def test_a_command_whose_sandbox_is_killed_ends_with_the_sandbox_gone(sdk_server):
    """Upstream's test_kill_sandbox_while_command_is_running, in every release's terms: the
    command's call ends (it does not hang for its whole run) with an error, and releases that
    probe the sandbox's health after a dropped stream say it was killed."""
    import threading
    import time

    sbx = _create(timeout=120)
    outcome: dict = {}

    def run() -> None:
        try:
            sbx.commands.run("sleep 60", timeout=90)
            outcome["returned"] = True
        except Exception as e:  # noqa: BLE001 - which class depends on the release
            outcome["error"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(2)
    started = time.monotonic()
    sbx.kill()
    t.join(45)
    assert not t.is_alive(), "the command's call still waits on a killed sandbox"
    assert time.monotonic() - started < 45
    assert "error" in outcome, f"the command returned: {outcome}"
    if VERSION >= (2, 45):
        assert "end of life" in str(outcome["error"]), repr(outcome["error"])

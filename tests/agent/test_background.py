"""Background commands: handles, List, Connect, SendSignal, SendInput, StreamInput, CloseStdin."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from e2b import (
    CommandExitException,
    CommandHandle,
    NotFoundException,
    Sandbox,
    SandboxException,
)

from _helpers import Collector, q, wait_until

UNKNOWN_PID = 999_999_999


@contextlib.contextmanager
def background(sandbox: Sandbox, cmd: str, **kw) -> Iterator[CommandHandle]:
    """Starts a background command and makes sure it is gone afterwards."""
    handle = sandbox.commands.run(cmd, background=True, **kw)
    try:
        yield handle
    finally:
        sandbox.commands.kill(handle.pid)
        with contextlib.suppress(Exception):
            handle.disconnect()


def gate(workdir: str, name: str = "go") -> str:
    """A shell snippet that blocks until `<workdir>/<name>` exists."""
    path = f"{workdir}/{name}"
    return f"while [ ! -e {q(path)} ]; do sleep 0.02; done"


def open_gate(sandbox: Sandbox, workdir: str, name: str = "go") -> None:
    sandbox.commands.run(f"touch {q(workdir + '/' + name)}")


def test_background_wait(sandbox: Sandbox):
    handle = sandbox.commands.run("sleep 0.3; echo done; echo e 1>&2", background=True)
    assert handle.pid > 0
    r = handle.wait()
    assert (r.stdout, r.stderr, r.exit_code) == ("done\n", "e\n", 0)


def test_background_failure(sandbox: Sandbox):
    handle = sandbox.commands.run("echo x; exit 4", background=True)
    with pytest.raises(CommandExitException) as ei:
        handle.wait()
    assert ei.value.exit_code == 4
    assert ei.value.stdout == "x\n"


def test_list_shows_running_command(sandbox: Sandbox, unique: str):
    cmd = f"sleep 30 # list-{unique}"
    with background(sandbox, cmd, envs={"MARK": unique}, cwd="/tmp") as h:
        procs = {p.pid: p for p in sandbox.commands.list()}
        assert h.pid in procs, f"pid {h.pid} not in {sorted(procs)}"
        p = procs[h.pid]
        assert p.cmd == "/bin/bash"
        assert p.args == ["-l", "-c", cmd]
        assert p.envs.get("MARK") == unique
        assert p.cwd == "/tmp"
        assert p.tag is None


def test_list_drops_exited_command(sandbox: Sandbox):
    h = sandbox.commands.run("echo bye", background=True)
    h.wait()
    wait_until(
        lambda: h.pid not in {p.pid for p in sandbox.commands.list()},
        timeout=5,
        message="exited process still listed",
    )


def test_connect_receives_later_output(sandbox: Sandbox, workdir: str):
    cmd = f"echo before; {gate(workdir)}; echo after-1; echo after-2 1>&2"
    with background(sandbox, cmd) as h:
        origin = Collector(h)
        origin.wait_stdout("before\n")  # produced before anyone else attaches
        attached = sandbox.commands.connect(h.pid)
        assert attached.pid == h.pid
        open_gate(sandbox, workdir)
        r = attached.wait()
        assert r.stdout == "after-1\n"  # live output only: no replay of "before"
        assert r.stderr == "after-2\n"
        assert r.exit_code == 0
        assert origin.join().stdout == "before\nafter-1\n"


def test_connect_fans_out_to_every_stream(sandbox: Sandbox, workdir: str):
    cmd = f"{gate(workdir)}; echo fanout"
    with background(sandbox, cmd) as h:
        first = Collector(sandbox.commands.connect(h.pid))
        second = Collector(sandbox.commands.connect(h.pid))
        origin = Collector(h)
        open_gate(sandbox, workdir)
        for c in (first, second, origin):
            assert c.join().stdout == "fanout\n"


def test_connect_to_exited_process_gets_its_end(sandbox: Sandbox):
    h = sandbox.commands.run("exit 7", background=True)
    with pytest.raises(CommandExitException):
        h.wait()
    # envd keeps an exited process's end event for 30 s.
    late = sandbox.commands.connect(h.pid)
    assert late.pid == h.pid
    with pytest.raises(CommandExitException) as ei:
        late.wait()
    assert ei.value.exit_code == 7


def test_connect_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(UNKNOWN_PID)


def test_disconnect_keeps_process_running(sandbox: Sandbox, workdir: str):
    with background(sandbox, f"{gate(workdir)}; echo still-here") as h:
        h.disconnect()
        assert h.pid in {p.pid for p in sandbox.commands.list()}
        again = sandbox.commands.connect(h.pid)
        open_gate(sandbox, workdir)
        assert again.wait().stdout == "still-here\n"


def test_kill_handle(sandbox: Sandbox):
    h = sandbox.commands.run("sleep 30", background=True)
    assert h.kill() is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code == -1  # killed by a signal
    assert ei.value.error == "signal: killed"
    wait_until(
        lambda: h.pid not in {p.pid for p in sandbox.commands.list()},
        timeout=5,
        message="killed process still listed",
    )


def test_kill_by_pid(sandbox: Sandbox):
    h = sandbox.commands.run("sleep 30", background=True)
    assert sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        h.wait()


def test_kill_unknown_pid(sandbox: Sandbox):
    assert sandbox.commands.kill(UNKNOWN_PID) is False


def test_kill_exited_process_is_false(sandbox: Sandbox):
    h = sandbox.commands.run("true", background=True)
    h.wait()
    assert sandbox.commands.kill(h.pid) is False


def test_send_stdin_str(sandbox: Sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "hello\n")
    sandbox.commands.send_stdin(h.pid, "world\n")
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello\nworld\n"


def test_send_stdin_bytes(sandbox: Sandbox):
    h = sandbox.commands.run("od -An -tx1 -v", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, b"\x00\x01\xfe\xff")
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout.split() == ["00", "01", "fe", "ff"]


def test_send_stdin_special_and_multiline(sandbox: Sandbox):
    text = "ünïcödé 🎉\n$HOME `x` \"q\" 'q'\n\ttab\n"
    h = sandbox.commands.run("cat", background=True, stdin=True)
    h.send_stdin(text)
    h.close_stdin()
    assert h.wait().stdout == text


def test_send_stdin_interactive_read_loop(sandbox: Sandbox):
    h = sandbox.commands.run(
        'while read -r line; do echo "got:$line"; [ "$line" = quit ] && break; done',
        background=True,
        stdin=True,
    )
    c = Collector(h)
    h.send_stdin("one\n")
    c.wait_stdout("got:one\n")
    h.send_stdin("two\n")
    c.wait_stdout("got:two\n")
    h.send_stdin("quit\n")
    assert c.join().stdout == "got:one\ngot:two\ngot:quit\n"


def test_send_stdin_large(sandbox: Sandbox):
    data = ("0123456789abcdef" * 4096 + "\n") * 16  # ~1 MiB
    h = sandbox.commands.run("wc -c", background=True, stdin=True)
    for i in range(0, len(data), 65536):
        sandbox.commands.send_stdin(h.pid, data[i : i + 65536])
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == str(len(data))


def test_close_stdin_ends_cat(sandbox: Sandbox):
    h = sandbox.commands.run("cat; echo eof-seen", background=True, stdin=True)
    sandbox.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "eof-seen\n"
    assert r.exit_code == 0


def test_stream_input(sandbox: Sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(h.pid, iter(["a\n", b"b\n", "c\n"]))
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout == "a\nb\nc\n"


def test_stream_input_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.stream_input(UNKNOWN_PID, iter(["x"]))


def test_send_stdin_without_stdin_pipe_fails(sandbox: Sandbox):
    with background(sandbox, "sleep 30") as h:  # stdin defaults to False
        with pytest.raises(SandboxException):
            sandbox.commands.send_stdin(h.pid, "x")


def test_send_stdin_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(UNKNOWN_PID, "x")


def test_close_stdin_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.close_stdin(UNKNOWN_PID)

"""`sandbox.pty`: interactive terminals (Start with pty, SendInput{pty}, Update, SendSignal)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from e2b import CommandExitException, NotFoundException, PtySize, Sandbox, SandboxException

from _helpers import Collector, wait_until

UNKNOWN_PID = 999_999_999


@contextlib.contextmanager
def pty_session(sandbox: Sandbox, rows: int = 24, cols: int = 80, **kw) -> Iterator[Collector]:
    handle = sandbox.pty.create(PtySize(rows=rows, cols=cols), **kw)
    collector = Collector(handle)
    try:
        yield collector
    finally:
        sandbox.pty.kill(handle.pid)
        collector.done.wait(10)


def run_in_pty(sandbox: Sandbox, c: Collector, line: str, expect: str, timeout: float = 10):
    """Types `line` + newline into the terminal and waits for `expect` in what follows."""
    start = c.pty_len()
    sandbox.pty.send_stdin(c.handle.pid, (line + "\n").encode())
    return c.wait_pty(expect, timeout=timeout, start=start)


def test_pty_echo(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        assert c.handle.pid > 0
        # The marker is built by the shell, so it cannot match the terminal's echo of the input.
        out = run_in_pty(sandbox, c, "echo pty-$((20 + 22))-ok", "pty-42-ok")
        assert "pty-42-ok" in out


def test_pty_initial_size_and_resize(sandbox: Sandbox):
    with pty_session(sandbox, rows=24, cols=80) as c:
        run_in_pty(sandbox, c, 'echo "size=$(stty size)"', "size=24 80")
        sandbox.pty.resize(c.handle.pid, PtySize(rows=40, cols=132))
        run_in_pty(sandbox, c, 'echo "size=$(stty size)"', "size=40 132")


def test_pty_is_a_terminal_with_default_env(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        run_in_pty(sandbox, c, '[ -t 0 ] && [ -t 1 ] && echo "tty=yes:$TERM"', "tty=yes:xterm-256color")
        run_in_pty(sandbox, c, 'echo "lang=$LANG"', "lang=C.UTF-8")


def test_pty_user_cwd_envs(sandbox: Sandbox, workdir: str):
    with pty_session(sandbox, user="root", cwd=workdir, envs={"PTY_VAR": "v42"}) as c:
        run_in_pty(sandbox, c, 'echo "who=$(whoami):$PTY_VAR:$(pwd)"', f"who=root:v42:{workdir}")


def test_pty_default_user(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        run_in_pty(sandbox, c, 'echo "who=$(whoami):$HOME"', "who=user:/home/user")


def test_pty_utf8_roundtrip(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        run_in_pty(sandbox, c, "printf 'u=%s\\n' \"$(printf '\\xc3\\xa9\\xe6\\x97\\xa5')\"", "u=é日")


def test_pty_exit_ends_stream_cleanly(sandbox: Sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    c = Collector(handle)
    sandbox.pty.send_stdin(handle.pid, b"exit 0\n")
    result = c.join()
    assert result.exit_code == 0


def test_pty_exit_code(sandbox: Sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    c = Collector(handle)
    sandbox.pty.send_stdin(handle.pid, b"exit 3\n")
    with pytest.raises(CommandExitException) as ei:
        c.join()
    assert ei.value.exit_code == 3


def test_pty_ctrl_d_ends_shell(sandbox: Sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    c = Collector(handle)
    # Like a person at a terminal, wait for the shell to be interactive (it printed its prompt)
    # before pressing Ctrl-D: input typed earlier can be discarded when readline sets up the
    # terminal.
    wait_until(lambda: c.pty_len() > 0, timeout=10)
    sandbox.pty.send_stdin(handle.pid, b"\x04")
    assert c.join().exit_code == 0


def test_pty_ctrl_c_interrupts_foreground_job(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        # Press Ctrl-C only once the job runs in the foreground: it prints a marker from the
        # process that then becomes `sleep` (a Ctrl-C typed earlier may reach the shell while
        # it is still handing the terminal to the job, as at a real keyboard).
        run_in_pty(sandbox, c, "sh -c 'echo ready-$((1+1)); exec sleep 30'; echo sleep-$((1+1))-done", "ready-2")
        start = c.pty_len()
        sandbox.pty.send_stdin(c.handle.pid, b"\x03")
        c.wait_pty("^C", start=start)
        # The shell is back well before the 30 s sleep would have ended.
        run_in_pty(sandbox, c, "echo after-$((1+1))", "after-2", timeout=10)
        assert "sleep-2-done" not in c.pty


def test_pty_kill(sandbox: Sandbox):
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    c = Collector(handle)
    assert sandbox.pty.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        c.join()
    assert sandbox.pty.kill(handle.pid) is False


def test_pty_kill_unknown(sandbox: Sandbox):
    assert sandbox.pty.kill(UNKNOWN_PID) is False


def test_pty_connect(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        other = Collector(sandbox.pty.connect(c.handle.pid))
        assert other.handle.pid == c.handle.pid
        start = other.pty_len()
        sandbox.pty.send_stdin(c.handle.pid, b"echo both-$((6*7))\n")
        other.wait_pty("both-42", start=start)
        c.wait_pty("both-42")


def test_pty_connect_unknown(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.pty.connect(UNKNOWN_PID)


def test_pty_listed(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        procs = {p.pid: p for p in sandbox.commands.list()}
        assert c.handle.pid in procs
        assert procs[c.handle.pid].cmd == "/bin/bash"
        assert procs[c.handle.pid].args == ["-i", "-l"]


def test_pty_stream_input(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        start = c.pty_len()
        sandbox.pty.stream_input(c.handle.pid, iter([b"echo str", "eam-$((3*3))", b"\n"]))
        c.wait_pty("stream-9", start=start)


def test_close_stdin_on_pty_is_an_error(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        with pytest.raises(SandboxException):
            sandbox.commands.close_stdin(c.handle.pid)


def test_stdin_input_to_pty_process_is_an_error(sandbox: Sandbox):
    with pty_session(sandbox) as c:
        with pytest.raises(SandboxException):
            sandbox.commands.send_stdin(c.handle.pid, "echo x\n")


def test_pty_input_to_pipe_process_is_an_error(sandbox: Sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    try:
        with pytest.raises(SandboxException):
            sandbox.pty.send_stdin(h.pid, b"x\n")
    finally:
        sandbox.commands.kill(h.pid)


def test_resize_unknown(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.pty.resize(UNKNOWN_PID, PtySize(rows=10, cols=10))

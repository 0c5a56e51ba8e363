"""`warren sandbox shell` on a real terminal (a PTY of the test's own): keystrokes reach the
remote shell, its output comes back, a local resize reaches the remote PTY, and the command
exits with the shell's status."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time

import pytest

from support.warren import API_KEY, warren_bin


@pytest.fixture
def sbx(server):
    from e2b import Sandbox

    s = Sandbox.create(timeout=120, request_timeout=300)
    yield s
    s.kill()


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminal:
    """The CLI on the slave side of a PTY; the test types and reads on the master side."""

    def __init__(self, server, sandbox_id: str):
        binary = warren_bin()
        env = dict(os.environ, WARREN_API_KEY=API_KEY, TERM="xterm-256color")
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(binary, [binary, "sandbox", "--server", server.url, "shell", sandbox_id], env)
        self.pid, self.fd, self.out = pid, fd, b""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def read_until(self, needle: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {needle!r}; got {self.out[-2000:]!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the CLI exited and closed the slave
                    chunk = b""
                assert chunk, f"the CLI exited before {needle!r}; got {self.out[-2000:]!r}"
                self.out += chunk

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    self.out += os.read(self.fd, 65536)
                except OSError:
                    pass
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"the CLI did not exit; got {self.out[-2000:]!r}")


def test_shell_types_reads_resizes_and_exits_with_the_shells_status(server, sbx):
    term = Terminal(server, sbx.sandbox_id)
    try:
        set_size(term.fd, 30, 100)
        # The arithmetic is echoed as typed and only its result reads 42: seeing "42" proves
        # the remote shell ran it.
        term.type("echo $((6*7))x\n")
        term.read_until(b"42x")
        # A local resize travels as SIGWINCH -> Update; retry until the remote PTY has it.
        set_size(term.fd, 40, 120)
        os.kill(term.pid, signal.SIGWINCH)
        deadline = time.monotonic() + 60
        while b"40 120" not in term.out:
            assert time.monotonic() < deadline, f"resize never arrived: {term.out[-2000:]!r}"
            term.type("stty size\n")
            try:
                term.read_until(b"40 120", timeout=2)
            except AssertionError:
                pass
        term.type("exit 4\n")
        assert term.wait() == 4, term.out[-2000:]
    finally:
        try:
            os.kill(term.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(term.fd)

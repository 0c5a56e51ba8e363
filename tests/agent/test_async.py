"""AsyncSandbox: the streaming paths (Start/Connect output callbacks, StreamInput handles, PTY
on_data, and the WatchDir server stream)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable, List, TypeVar

import pytest

from e2b import (
    AsyncCommandHandle,
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType as Ev,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    PtySize,
    TimeoutException,
)

from _helpers import q

T = TypeVar("T")
UNKNOWN_PID = 999_999_999


async def until(pred: Callable[[], T], timeout: float = 10.0, message: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s: {message}")
        await asyncio.sleep(0.02)


async def sh(sbx: AsyncSandbox, cmd: str, user: str = "user") -> str:
    return (await sbx.commands.run(cmd, user=user)).stdout


async def reap(sbx: AsyncSandbox, *handles: AsyncCommandHandle) -> None:
    """Kills the process and lets every handle's reader task finish before the loop closes."""
    for h in handles:
        await sbx.commands.kill(h.pid)
    for h in handles:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(h.wait(), 10)


# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------


async def test_run(async_sandbox: AsyncSandbox):
    r = await async_sandbox.commands.run('echo "Hello"; echo bad 1>&2')
    assert (r.stdout, r.stderr, r.exit_code) == ("Hello\n", "bad\n", 0)


async def test_run_with_async_callbacks(async_sandbox: AsyncSandbox):
    out: List[str] = []

    async def on_stdout(s: str) -> None:
        out.append(s)

    r = await async_sandbox.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=on_stdout)
    assert "".join(out) == r.stdout == "1\n2\n3\n"


async def test_exit_code(async_sandbox: AsyncSandbox):
    with pytest.raises(CommandExitException) as ei:
        await async_sandbox.commands.run("exit 5")
    assert ei.value.exit_code == 5


async def test_timeout(async_sandbox: AsyncSandbox):
    with pytest.raises(TimeoutException):
        await async_sandbox.commands.run("sleep 10", timeout=2)


async def test_background_output_streams_while_running(async_sandbox: AsyncSandbox, workdir: str):
    go = f"{workdir}/go"
    h = await async_sandbox.commands.run(
        f"echo first; while [ ! -e {q(go)} ]; do sleep 0.02; done; echo second",
        background=True,
    )
    try:
        await until(lambda: h.stdout == "first\n", message=f"stdout={h.stdout!r}")
        assert h.exit_code is None  # still running
        await sh(async_sandbox, f"touch {q(go)}")
        r = await h.wait()
        assert r.stdout == "first\nsecond\n"
        assert h.exit_code == 0
    finally:
        await reap(async_sandbox, h)


async def test_connect(async_sandbox: AsyncSandbox, workdir: str):
    go = f"{workdir}/go"
    h = await async_sandbox.commands.run(
        f"while [ ! -e {q(go)} ]; do sleep 0.02; done; echo later", background=True
    )
    seen: List[str] = []
    attached = await async_sandbox.commands.connect(h.pid, on_stdout=seen.append)
    try:
        await sh(async_sandbox, f"touch {q(go)}")
        r = await attached.wait()
        assert r.stdout == "later\n"
        assert "".join(seen) == "later\n"
    finally:
        await reap(async_sandbox, h, attached)


async def test_connect_unknown(async_sandbox: AsyncSandbox):
    with pytest.raises(NotFoundException):
        await async_sandbox.commands.connect(UNKNOWN_PID)


async def test_list_and_kill(async_sandbox: AsyncSandbox):
    h = await async_sandbox.commands.run("sleep 30", background=True)
    try:
        procs = await async_sandbox.commands.list()
        assert h.pid in {p.pid for p in procs}
        assert await h.kill() is True
        with pytest.raises(CommandExitException):
            await h.wait()
    finally:
        await reap(async_sandbox, h)
    assert await async_sandbox.commands.kill(UNKNOWN_PID) is False


async def test_send_stdin_and_close(async_sandbox: AsyncSandbox):
    h = await async_sandbox.commands.run("cat", background=True, stdin=True)
    await h.send_stdin("hello ")
    await async_sandbox.commands.send_stdin(h.pid, b"bytes\n")
    await until(lambda: h.stdout == "hello bytes\n", message=f"stdout={h.stdout!r}")
    await h.close_stdin()
    r = await h.wait()
    assert r.stdout == "hello bytes\n"


async def test_stream_input_handle(async_sandbox: AsyncSandbox):
    h = await async_sandbox.commands.run("cat", background=True, stdin=True)
    try:
        inp = async_sandbox.commands.stream_input(h.pid)
        for i in range(50):
            await inp.send(f"line-{i}\n")
        await inp.send(b"tail\n")
        # Input is delivered incrementally, while the input stream is still open.
        await until(lambda: h.stdout.endswith("tail\n"), message=f"stdout={h.stdout[-80:]!r}")
        await inp.close()
        await async_sandbox.commands.close_stdin(h.pid)
        r = await h.wait()
        assert r.stdout == "".join(f"line-{i}\n" for i in range(50)) + "tail\n"
    finally:
        await reap(async_sandbox, h)


async def test_stream_input_unknown_pid(async_sandbox: AsyncSandbox):
    inp = async_sandbox.commands.stream_input(UNKNOWN_PID)
    with pytest.raises(NotFoundException):
        await inp.send("x")
        await inp.close()


# ---------------------------------------------------------------------------------------------
# PTY
# ---------------------------------------------------------------------------------------------


class PtyBuffer:
    def __init__(self) -> None:
        self.data = bytearray()

    def __call__(self, chunk: bytes) -> None:
        self.data.extend(chunk)

    def text(self, start: int = 0) -> str:
        return self.data[start:].decode("utf-8", errors="replace")


async def pty_run(sbx: AsyncSandbox, pid: int, buf: PtyBuffer, line: str, expect: str) -> str:
    start = len(buf.data)
    await sbx.pty.send_stdin(pid, (line + "\n").encode())
    await until(lambda: expect in buf.text(start), message=f"{expect!r} in {buf.text(start)!r}")
    return buf.text(start)


async def test_pty_create_input_resize_kill(async_sandbox: AsyncSandbox):
    buf = PtyBuffer()
    h = await async_sandbox.pty.create(PtySize(rows=24, cols=80), on_data=buf)
    try:
        await pty_run(async_sandbox, h.pid, buf, "echo hi-$((40+2))", "hi-42")
        await pty_run(async_sandbox, h.pid, buf, 'echo "size=$(stty size)"', "size=24 80")
        await async_sandbox.pty.resize(h.pid, PtySize(rows=50, cols=120))
        await pty_run(async_sandbox, h.pid, buf, 'echo "size=$(stty size)"', "size=50 120")
        assert await async_sandbox.pty.kill(h.pid) is True
        with pytest.raises(CommandExitException):
            await h.wait()
    finally:
        await reap(async_sandbox, h)


async def test_pty_connect(async_sandbox: AsyncSandbox):
    first, second = PtyBuffer(), PtyBuffer()
    h = await async_sandbox.pty.create(PtySize(rows=24, cols=80), on_data=first)
    other = await async_sandbox.pty.connect(h.pid, on_data=second)
    try:
        assert other.pid == h.pid
        await async_sandbox.pty.send_stdin(h.pid, b"echo shared-$((5*5))\n")
        await until(lambda: "shared-25" in second.text(), message=second.text())
        await until(lambda: "shared-25" in first.text(), message=first.text())
    finally:
        await reap(async_sandbox, h, other)


async def test_pty_exit(async_sandbox: AsyncSandbox):
    h = await async_sandbox.pty.create(PtySize(rows=24, cols=80), on_data=PtyBuffer())
    await async_sandbox.pty.send_stdin(h.pid, b"exit 0\n")
    assert (await h.wait()).exit_code == 0


async def test_pty_stream_input(async_sandbox: AsyncSandbox):
    buf = PtyBuffer()
    h = await async_sandbox.pty.create(PtySize(rows=24, cols=80), on_data=buf)
    try:
        inp = async_sandbox.pty.stream_input(h.pid)
        await inp.send("echo via-")
        await inp.send(b"handle-$((2*4))\n")
        await until(lambda: "via-handle-8" in buf.text(), message=buf.text())
        await inp.close()
    finally:
        await reap(async_sandbox, h)


# ---------------------------------------------------------------------------------------------
# WatchDir (server stream)
# ---------------------------------------------------------------------------------------------


def seen(events: List[FilesystemEvent], name: str, *types: Ev) -> bool:
    return set(types) <= {e.type for e in events if e.name == name}


async def test_watch_dir_stream(async_sandbox: AsyncSandbox, workdir: str):
    events: List[FilesystemEvent] = []
    exits: List[object] = []
    w = await async_sandbox.files.watch_dir(workdir, on_event=events.append, on_exit=exits.append)
    try:
        await sh(async_sandbox, f"printf x > {q(workdir)}/a.txt && rm {q(workdir)}/a.txt")
        await until(lambda: seen(events, "a.txt", Ev.CREATE, Ev.WRITE, Ev.REMOVE), message=str(events))
        assert all(e.entry is None for e in events)
    finally:
        await w.stop()
    assert exits == [None]


async def test_watch_dir_stream_with_entry(async_sandbox: AsyncSandbox, workdir: str):
    events: List[FilesystemEvent] = []
    w = await async_sandbox.files.watch_dir(workdir, on_event=events.append, include_entry=True)
    try:
        await async_sandbox.files.write(f"{workdir}/e.txt", "12345")
        await until(lambda: seen(events, "e.txt", Ev.CREATE), message=str(events))
        created = next(e for e in events if e.name == "e.txt" and e.type == Ev.CREATE)
        assert created.entry is not None
        assert created.entry.path == f"{workdir}/e.txt"
        assert created.entry.type == FileType.FILE
    finally:
        await w.stop()


async def test_watch_dir_stream_recursive(async_sandbox: AsyncSandbox, workdir: str):
    await sh(async_sandbox, f"mkdir -p {q(workdir)}/s1")
    events: List[FilesystemEvent] = []
    w = await async_sandbox.files.watch_dir(workdir, on_event=events.append, recursive=True)
    try:
        await sh(async_sandbox, f"touch {q(workdir)}/s1/in.txt && mkdir {q(workdir)}/s2")
        await until(lambda: seen(events, "s1/in.txt", Ev.CREATE), message=str(events))
        await until(lambda: seen(events, "s2", Ev.CREATE), message=str(events))
        await sh(async_sandbox, f"touch {q(workdir)}/s2/late.txt")
        await until(lambda: seen(events, "s2/late.txt", Ev.CREATE), message=str(events))
    finally:
        await w.stop()


async def test_watch_dir_stream_missing(async_sandbox: AsyncSandbox, workdir: str):
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.watch_dir(f"{workdir}/missing", on_event=lambda e: None)


async def test_watch_dir_stream_on_file(async_sandbox: AsyncSandbox, workdir: str):
    await sh(async_sandbox, f"touch {q(workdir)}/f")
    with pytest.raises(InvalidArgumentException):
        await async_sandbox.files.watch_dir(f"{workdir}/f", on_event=lambda e: None)


async def test_watch_dir_stream_timeout_ends_watch(async_sandbox: AsyncSandbox, workdir: str):
    exits: List[object] = []
    w = await async_sandbox.files.watch_dir(
        workdir, on_event=lambda e: None, on_exit=exits.append, timeout=1
    )
    try:
        await until(lambda: exits, timeout=10, message="watch did not end after its timeout")
        assert isinstance(exits[0], TimeoutException), exits
    finally:
        await w.stop()


# ---------------------------------------------------------------------------------------------
# files (async HTTP client paths)
# ---------------------------------------------------------------------------------------------


async def test_files_roundtrip(async_sandbox: AsyncSandbox, workdir: str):
    path = f"{workdir}/async.bin"
    data = bytes(range(256)) * 100
    info = await async_sandbox.files.write(path, data)
    assert info.path == path
    assert bytes(await async_sandbox.files.read(path, format="bytes")) == data
    assert bytes(await async_sandbox.files.read(path, format="bytes", gzip=True)) == data
    chunks = []
    stream = await async_sandbox.files.read(path, format="stream")
    async for chunk in stream:
        chunks.append(chunk)
    assert b"".join(chunks) == data


async def test_files_async_iterable_upload(async_sandbox: AsyncSandbox, workdir: str):
    async def gen():
        for i in range(10):
            yield f"chunk-{i}\n".encode()

    path = f"{workdir}/gen.txt"
    await async_sandbox.files.write(path, gen())
    assert await async_sandbox.files.read(path) == "".join(f"chunk-{i}\n" for i in range(10))


async def test_files_rpcs(async_sandbox: AsyncSandbox, workdir: str):
    assert await async_sandbox.files.make_dir(f"{workdir}/d/e") is True
    assert await async_sandbox.files.exists(f"{workdir}/d/e") is True
    entries = await async_sandbox.files.list(workdir, depth=2)
    assert {e.path for e in entries} == {f"{workdir}/d", f"{workdir}/d/e"}
    moved = await async_sandbox.files.rename(f"{workdir}/d", f"{workdir}/m")
    assert moved.path == f"{workdir}/m"
    await async_sandbox.files.remove(f"{workdir}/m")
    assert await async_sandbox.files.exists(f"{workdir}/m") is False
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.get_info(f"{workdir}/m")

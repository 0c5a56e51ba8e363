"""Sync `files.watch_dir`: CreateWatcher / GetWatcherEvents / RemoveWatcher.

(The streaming WatchDir RPC is exercised by the AsyncSandbox tests in test_async.py.)
"""

from __future__ import annotations

import time
from typing import Callable, List

import pytest

from e2b import (
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType as Ev,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    WatchHandle,
)

from _helpers import q


def sh(sandbox: Sandbox, cmd: str) -> None:
    sandbox.commands.run(cmd)


def collect(
    handle: WatchHandle,
    until: Callable[[List[FilesystemEvent]], bool],
    timeout: float = 10.0,
) -> List[FilesystemEvent]:
    """Drains the watcher until `until(all events so far)` holds."""
    events: List[FilesystemEvent] = []
    deadline = time.monotonic() + timeout
    while True:
        events.extend(handle.get_new_events())
        if until(events):
            return events
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out waiting for events; got {[(e.name, e.type) for e in events]}"
            )
        time.sleep(0.05)


def has(name: str, *types: Ev) -> Callable[[List[FilesystemEvent]], bool]:
    wanted = set(types)
    return lambda evs: wanted <= {e.type for e in evs if e.name == name}


def test_no_events_before_changes(sandbox: Sandbox, workdir: str):
    w = sandbox.files.watch_dir(workdir)
    try:
        assert w.get_new_events() == []
    finally:
        w.stop()


def test_create_and_write_events(sandbox: Sandbox, workdir: str):
    w = sandbox.files.watch_dir(workdir)
    try:
        sh(sandbox, f"printf hello > {q(workdir)}/f.txt")
        events = collect(w, has("f.txt", Ev.CREATE, Ev.WRITE))
        assert all(e.entry is None for e in events), "entry sent without include_entry"
        # Drained: the next call does not repeat them.
        assert [e for e in w.get_new_events() if e.name == "f.txt" and e.type == Ev.CREATE] == []
    finally:
        w.stop()


def test_sdk_write_is_observed(sandbox: Sandbox, workdir: str):
    w = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.write(f"{workdir}/via-sdk.txt", "data")
        collect(w, has("via-sdk.txt", Ev.CREATE))
    finally:
        w.stop()


def test_an_upload_is_seen_by_the_very_next_poll(sandbox: Sandbox, workdir: str):
    """No waiting: a poll made right after a write returns has every event of that write, in
    the order envd reports them (create, the owner set, the data)."""
    w = sandbox.files.watch_dir(workdir, include_entry=True)
    try:
        sandbox.files.write(f"{workdir}/now.txt", "content")
        events = [(e.name, e.type) for e in w.get_new_events()]
        assert events == [("now.txt", Ev.CREATE), ("now.txt", Ev.CHMOD), ("now.txt", Ev.WRITE)], events
        sandbox.files.write(f"{workdir}/now.txt", "rewritten")
        again = w.get_new_events()
        writes = [e for e in again if e.name == "now.txt" and e.type == Ev.WRITE]
        assert writes and writes[-1].entry is not None, [(e.name, e.type) for e in again]
        # Changes made by a command are there by the next poll too.
        sh(sandbox, f"mkdir {q(workdir)}/made && touch {q(workdir)}/made/x")
        assert ("made", Ev.CREATE) in [(e.name, e.type) for e in w.get_new_events()]
        assert w.get_new_events() == []
    finally:
        w.stop()


def test_events_with_entry_info(sandbox: Sandbox, workdir: str):
    w = sandbox.files.watch_dir(workdir, include_entry=True)
    try:
        sh(sandbox, f"printf hello > {q(workdir)}/e.txt && mkdir {q(workdir)}/d")
        events = collect(
            w, lambda evs: has("e.txt", Ev.CREATE, Ev.WRITE)(evs) and has("d", Ev.CREATE)(evs)
        )
        created = next(e for e in events if e.name == "e.txt" and e.type == Ev.CREATE)
        assert created.entry is not None
        assert created.entry.name == "e.txt"
        assert created.entry.path == f"{workdir}/e.txt"
        assert created.entry.type == FileType.FILE
        d = next(e for e in events if e.name == "d" and e.type == Ev.CREATE)
        assert d.entry is not None and d.entry.type == FileType.DIR
    finally:
        w.stop()


def test_remove_rename_chmod_events(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"touch {q(workdir)}/r.txt {q(workdir)}/m.txt {q(workdir)}/c.txt")
    w = sandbox.files.watch_dir(workdir, include_entry=True)
    try:
        sh(
            sandbox,
            f"rm {q(workdir)}/r.txt && mv {q(workdir)}/m.txt {q(workdir)}/m2.txt "
            f"&& chmod 600 {q(workdir)}/c.txt",
        )
        events = collect(
            w,
            lambda evs: has("r.txt", Ev.REMOVE)(evs)
            and has("m.txt", Ev.RENAME)(evs)
            and has("c.txt", Ev.CHMOD)(evs),
        )
        removed = next(e for e in events if e.name == "r.txt" and e.type == Ev.REMOVE)
        assert removed.entry is None  # entries only for CREATE/WRITE/CHMOD
        chmod = next(e for e in events if e.name == "c.txt" and e.type == Ev.CHMOD)
        assert chmod.entry is not None and chmod.entry.mode == 0o600
    finally:
        w.stop()


def test_recursive_watch(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"mkdir -p {q(workdir)}/sub/deeper")
    w = sandbox.files.watch_dir(workdir, recursive=True)
    try:
        sh(sandbox, f"printf 1 > {q(workdir)}/sub/deeper/n.txt")
        collect(w, has("sub/deeper/n.txt", Ev.CREATE, Ev.WRITE))
    finally:
        w.stop()


def test_recursive_watch_covers_dirs_created_later(sandbox: Sandbox, workdir: str):
    w = sandbox.files.watch_dir(workdir, recursive=True)
    try:
        sh(sandbox, f"mkdir {q(workdir)}/later")
        collect(w, has("later", Ev.CREATE))
        sh(sandbox, f"printf 1 > {q(workdir)}/later/x.txt")
        collect(w, has("later/x.txt", Ev.CREATE))
    finally:
        w.stop()


def test_non_recursive_ignores_nested_changes(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"mkdir {q(workdir)}/sub")
    w = sandbox.files.watch_dir(workdir)
    try:
        sh(sandbox, f"printf 1 > {q(workdir)}/sub/nested.txt")
        sh(sandbox, f"printf 1 > {q(workdir)}/top.txt")  # a later event as a sync point
        events = collect(w, has("top.txt", Ev.CREATE))
        assert not [e for e in events if "nested" in e.name], [(e.name, e.type) for e in events]
    finally:
        w.stop()


def test_watch_missing_dir(sandbox: Sandbox, workdir: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir(f"{workdir}/missing")


def test_watch_a_file_is_invalid(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"touch {q(workdir)}/plain")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir(f"{workdir}/plain")


def test_stop_ends_the_watcher(sandbox: Sandbox, workdir: str):
    w = sandbox.files.watch_dir(workdir)
    w.stop()
    with pytest.raises(SandboxException):
        w.get_new_events()


def test_independent_watchers(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"mkdir {q(workdir)}/one {q(workdir)}/two")
    w1 = sandbox.files.watch_dir(f"{workdir}/one")
    w2 = sandbox.files.watch_dir(f"{workdir}/two")
    try:
        sh(sandbox, f"touch {q(workdir)}/one/a {q(workdir)}/two/b")
        e1 = collect(w1, has("a", Ev.CREATE))
        e2 = collect(w2, has("b", Ev.CREATE))
        assert {e.name for e in e1} == {"a"}
        assert {e.name for e in e2} == {"b"}
    finally:
        w1.stop()
        w2.stop()

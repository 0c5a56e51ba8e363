"""`sandbox.files`: /files up/download and the filesystem.Filesystem RPCs through the SDK.

Fixtures and cross-checks use `commands.run`, so a failure here points at the filesystem
service or the /files endpoints, not at test setup.
"""

from __future__ import annotations

import hashlib
import io
import os
from datetime import datetime, timedelta, timezone

import pytest

from e2b import (
    AuthenticationException,
    EntryInfo,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    Sandbox,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

from _helpers import q


def sh(sandbox: Sandbox, cmd: str, user: str = "user") -> str:
    return sandbox.commands.run(cmd, user=user).stdout


def sha256_in_sandbox(sandbox: Sandbox, path: str) -> str:
    return sh(sandbox, f"sha256sum {q(path)}", user="root").split()[0]


def owner_of(sandbox: Sandbox, path: str) -> str:
    return sh(sandbox, f"stat -c %U:%G {q(path)}", user="root").strip()


# ---------------------------------------------------------------------------------------------
# write / read
# ---------------------------------------------------------------------------------------------


def test_write_and_read_text(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/hello.txt"
    info = sandbox.files.write(path, "Hello, Warren!\n")
    assert info.path == path
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert sh(sandbox, f"cat {q(path)}") == "Hello, Warren!\n"
    assert sandbox.files.read(path) == "Hello, Warren!\n"


def test_write_is_owned_by_the_user(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/owned.txt"
    sandbox.files.write(path, "x")
    assert owner_of(sandbox, path) == "user:user"
    sandbox.files.write(f"{workdir}/root-owned.txt", "x", user="root")
    assert owner_of(sandbox, f"{workdir}/root-owned.txt") == "root:root"


def test_write_and_read_bytes(sandbox: Sandbox, workdir: str):
    data = bytes(range(256)) * 64
    path = f"{workdir}/bin.dat"
    sandbox.files.write(path, data)
    assert sha256_in_sandbox(sandbox, path) == hashlib.sha256(data).hexdigest()
    got = sandbox.files.read(path, format="bytes")
    assert isinstance(got, bytearray)
    assert bytes(got) == data


def test_read_stream(sandbox: Sandbox, workdir: str):
    data = os.urandom(3 * 1024 * 1024 + 17)
    path = f"{workdir}/stream.dat"
    sandbox.files.write(path, data)
    with sandbox.files.read(path, format="stream") as stream:
        got = b"".join(stream)
    assert got == data


def test_read_file_written_by_command(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/from-cmd.txt"
    sh(sandbox, f"printf 'via shell\\n' > {q(path)}")
    assert sandbox.files.read(path) == "via shell\n"


def test_read_empty_file(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/empty"
    sh(sandbox, f": > {q(path)}")
    assert sandbox.files.read(path) == ""
    assert sandbox.files.read(path, format="bytes") == bytearray()


def test_write_empty_file(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/empty-w"
    sandbox.files.write(path, "")
    assert sh(sandbox, f"stat -c %s {q(path)}").strip() == "0"


def test_read_missing_file(sandbox: Sandbox, workdir: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{workdir}/does-not-exist.txt")


def test_read_directory_is_an_error(sandbox: Sandbox, workdir: str):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read(workdir)


def test_write_creates_nested_dirs(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/a/b/c/deep.txt"
    info = sandbox.files.write(path, "deep")
    assert info.path == path
    assert sandbox.files.read(path) == "deep"
    for d in ("a", "a/b", "a/b/c"):
        assert owner_of(sandbox, f"{workdir}/{d}") == "user:user", d


def test_overwrite_truncates(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/over.txt"
    sandbox.files.write(path, "a much longer original content\n")
    sandbox.files.write(path, "short")
    assert sandbox.files.read(path) == "short"
    assert sh(sandbox, f"cat {q(path)}") == "short"


def test_write_relative_path_goes_to_home(sandbox: Sandbox, unique: str):
    name = f"warren-rel-{unique}.txt"
    try:
        info = sandbox.files.write(name, "rel")
        assert info.path == f"/home/user/{name}"
        assert sh(sandbox, f"cat /home/user/{name}") == "rel"
        assert sandbox.files.read(name) == "rel"
        assert sandbox.files.read(f"~/{name}") == "rel"
    finally:
        sh(sandbox, f"rm -f /home/user/{name}", user="root")


def test_write_files_multiple(sandbox: Sandbox, workdir: str):
    entries = [
        WriteEntry(path=f"{workdir}/m1.txt", data="one"),
        WriteEntry(path=f"{workdir}/sub/m2.bin", data=b"\x00two\xff"),
        WriteEntry(path=f"{workdir}/m3.txt", data="three"),
    ]
    infos = sandbox.files.write_files(entries)
    assert sorted(i.path for i in infos) == sorted(e["path"] for e in entries)
    assert all(i.type == FileType.FILE for i in infos)
    assert sandbox.files.read(f"{workdir}/m1.txt") == "one"
    assert bytes(sandbox.files.read(f"{workdir}/sub/m2.bin", format="bytes")) == b"\x00two\xff"
    assert sandbox.files.read(f"{workdir}/m3.txt") == "three"


def test_write_files_empty_list(sandbox: Sandbox):
    assert sandbox.files.write_files([]) == []


@pytest.mark.parametrize(
    "make_data",
    [
        lambda b: io.BytesIO(b),
        lambda b: io.StringIO(b.decode()),
        lambda b: iter([b[:5], b[5:]]),
    ],
    ids=["BytesIO", "StringIO", "iterable"],
)
def test_write_streamed_sources(sandbox: Sandbox, workdir: str, make_data):
    # File-like objects and iterables go through the octet-stream upload.
    payload = b"streamed upload \xe2\x9c\x93\n"
    path = f"{workdir}/streamed.txt"
    info = sandbox.files.write(path, make_data(payload))
    assert info.path == path
    assert sandbox.files.read(path, format="bytes") == payload


def test_write_octet_stream_explicit(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/octet/nested.txt"
    info = sandbox.files.write(path, "octet", use_octet_stream=True)
    assert info.path == path and info.name == "nested.txt"
    assert sandbox.files.read(path) == "octet"
    assert owner_of(sandbox, path) == "user:user"


def test_gzip_upload_and_download(sandbox: Sandbox, workdir: str):
    data = (b"compressible line\n" * 20000) + os.urandom(1000)
    path = f"{workdir}/gz.bin"
    sandbox.files.write(path, data, gzip=True)
    # Stored decompressed.
    assert sha256_in_sandbox(sandbox, path) == hashlib.sha256(data).hexdigest()
    assert bytes(sandbox.files.read(path, format="bytes", gzip=True)) == data
    assert sandbox.files.read(path, format="bytes") == data


def test_large_file_roundtrip(sandbox: Sandbox, workdir: str):
    data = os.urandom(32 * 1024 * 1024)
    path = f"{workdir}/large.bin"
    sandbox.files.write(path, data)
    assert sha256_in_sandbox(sandbox, path) == hashlib.sha256(data).hexdigest()
    assert sandbox.files.read(path, format="bytes") == data


def test_files_unknown_user(sandbox: Sandbox, workdir: str, unique: str):
    with pytest.raises(AuthenticationException):
        sandbox.files.write(f"{workdir}/u.txt", "x", user=f"nouser{unique}")
    with pytest.raises(AuthenticationException):
        sandbox.files.read(f"{workdir}/u.txt", user=f"nouser{unique}")
    with pytest.raises(AuthenticationException):
        sandbox.files.list(workdir, user=f"nouser{unique}")


# ---------------------------------------------------------------------------------------------
# list / get_info / exists
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def tree(sandbox: Sandbox, workdir: str) -> str:
    """workdir/tree/{a.txt, sub/{b.txt, deeper/c.txt}, link -> a.txt}"""
    root = f"{workdir}/tree"
    sh(
        sandbox,
        f"mkdir -p {q(root)}/sub/deeper && printf abc > {q(root)}/a.txt && "
        f"printf 12345 > {q(root)}/sub/b.txt && printf c > {q(root)}/sub/deeper/c.txt && "
        f"ln -s a.txt {q(root)}/link",
    )
    return root


def by_name(entries: list[EntryInfo]) -> dict[str, EntryInfo]:
    return {e.path: e for e in entries}


def test_list_depth_1(sandbox: Sandbox, tree: str):
    entries = by_name(sandbox.files.list(tree))
    assert set(entries) == {f"{tree}/a.txt", f"{tree}/sub", f"{tree}/link"}
    a = entries[f"{tree}/a.txt"]
    assert (a.name, a.type, a.size) == ("a.txt", FileType.FILE, 3)
    sub = entries[f"{tree}/sub"]
    assert (sub.name, sub.type) == ("sub", FileType.DIR)
    link = entries[f"{tree}/link"]
    assert link.name == "link"
    assert link.symlink_target == f"{tree}/a.txt"


def test_list_default_depth_is_1(sandbox: Sandbox, tree: str):
    assert by_name(sandbox.files.list(tree)).keys() == by_name(sandbox.files.list(tree, depth=1)).keys()


def test_list_depth_2(sandbox: Sandbox, tree: str):
    entries = by_name(sandbox.files.list(tree, depth=2))
    assert set(entries) == {
        f"{tree}/a.txt",
        f"{tree}/sub",
        f"{tree}/link",
        f"{tree}/sub/b.txt",
        f"{tree}/sub/deeper",
    }
    b = entries[f"{tree}/sub/b.txt"]
    assert (b.name, b.type, b.size) == ("b.txt", FileType.FILE, 5)
    assert entries[f"{tree}/sub/deeper"].type == FileType.DIR


def test_list_depth_3(sandbox: Sandbox, tree: str):
    entries = by_name(sandbox.files.list(tree, depth=3))
    assert f"{tree}/sub/deeper/c.txt" in entries
    assert len(entries) == 6


def test_list_empty_dir(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"mkdir {q(workdir)}/empty")
    assert sandbox.files.list(f"{workdir}/empty") == []


def test_list_entry_details(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/detail.txt"
    sh(sandbox, f"printf 1234567 > {q(path)} && chmod 640 {q(path)}")
    (e,) = sandbox.files.list(workdir)
    assert e.path == path
    assert e.size == 7
    assert e.mode == 0o640
    assert e.permissions == "-rw-r-----"
    assert (e.owner, e.group) == ("user", "user")


def test_list_missing_dir(sandbox: Sandbox, workdir: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.list(f"{workdir}/missing")


def test_list_a_file_is_invalid(sandbox: Sandbox, tree: str):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list(f"{tree}/a.txt")


def test_list_follows_symlinked_dir(sandbox: Sandbox, tree: str):
    sh(sandbox, f"ln -s sub {q(tree)}/sublink")
    entries = by_name(sandbox.files.list(f"{tree}/sublink"))
    assert set(entries) == {f"{tree}/sublink/b.txt", f"{tree}/sublink/deeper"}


def test_get_info_file(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/info.txt"
    sh(sandbox, f"printf hello > {q(path)} && chmod 640 {q(path)}")
    mtime = int(sh(sandbox, f"stat -c %Y {q(path)}"))
    info = sandbox.files.get_info(path)
    assert info.name == "info.txt"
    assert info.type == FileType.FILE
    assert info.path == path
    assert info.size == 5
    assert info.mode == 0o640
    assert info.permissions == "-rw-r-----"
    assert (info.owner, info.group) == ("user", "user")
    assert info.symlink_target is None
    assert info.metadata is None
    assert info.modified_time.tzinfo is not None
    assert abs(info.modified_time.timestamp() - mtime) < 1.0


def test_get_info_dir(sandbox: Sandbox, workdir: str):
    info = sandbox.files.get_info(workdir)
    assert info.type == FileType.DIR
    assert info.name == os.path.basename(workdir)
    assert info.path == workdir
    assert info.permissions.startswith("d")
    assert info.mode == 0o700  # mktemp -d
    assert abs(info.modified_time - datetime.now(timezone.utc)) < timedelta(minutes=5)


def test_get_info_symlink_to_file(sandbox: Sandbox, tree: str):
    info = sandbox.files.get_info(f"{tree}/link")
    assert info.name == "link"
    assert info.path == f"{tree}/link"
    # envd 0.6.13 reports the target's type and the resolved absolute target.
    assert info.type == FileType.FILE
    assert info.symlink_target == f"{tree}/a.txt"
    assert info.permissions.startswith("L")


def test_get_info_symlink_to_dir(sandbox: Sandbox, tree: str):
    sh(sandbox, f"ln -s {q(tree)}/sub {q(tree)}/dirlink")
    info = sandbox.files.get_info(f"{tree}/dirlink")
    assert info.type == FileType.DIR
    assert info.symlink_target == f"{tree}/sub"


def test_get_info_missing(sandbox: Sandbox, workdir: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{workdir}/nope")


def test_get_info_relative_to_home(sandbox: Sandbox):
    info = sandbox.files.get_info("~")
    assert info.path == "/home/user"
    assert info.type == FileType.DIR


def test_exists(sandbox: Sandbox, tree: str):
    assert sandbox.files.exists(f"{tree}/a.txt") is True
    assert sandbox.files.exists(f"{tree}/sub") is True
    assert sandbox.files.exists(f"{tree}/link") is True
    assert sandbox.files.exists(f"{tree}/missing") is False
    assert sandbox.files.exists(f"{tree}/missing/deeper") is False


# ---------------------------------------------------------------------------------------------
# make_dir / remove / rename
# ---------------------------------------------------------------------------------------------


def test_make_dir(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/newdir"
    assert sandbox.files.make_dir(path) is True
    assert sh(sandbox, f"test -d {q(path)} && echo dir") == "dir\n"
    assert owner_of(sandbox, path) == "user:user"


def test_make_dir_nested(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/x/y/z"
    assert sandbox.files.make_dir(path) is True
    for d in ("x", "x/y", "x/y/z"):
        assert owner_of(sandbox, f"{workdir}/{d}") == "user:user", d


def test_make_dir_existing_is_false(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/twice"
    assert sandbox.files.make_dir(path) is True
    assert sandbox.files.make_dir(path) is False


def test_make_dir_over_file_is_invalid(sandbox: Sandbox, workdir: str):
    sh(sandbox, f"touch {q(workdir)}/afile")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir(f"{workdir}/afile")


def test_remove_file(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/rm.txt"
    sh(sandbox, f"touch {q(path)}")
    sandbox.files.remove(path)
    assert sh(sandbox, f"test -e {q(path)} && echo yes || echo no") == "no\n"
    assert sandbox.files.exists(path) is False


def test_remove_dir_recursively(sandbox: Sandbox, tree: str):
    sandbox.files.remove(tree)
    assert sh(sandbox, f"test -e {q(tree)} && echo yes || echo no") == "no\n"


def test_remove_missing_is_ok(sandbox: Sandbox, workdir: str):
    sandbox.files.remove(f"{workdir}/never-existed")


def test_remove_symlink_keeps_target(sandbox: Sandbox, tree: str):
    sandbox.files.remove(f"{tree}/link")
    assert sandbox.files.exists(f"{tree}/link") is False
    assert sandbox.files.read(f"{tree}/a.txt") == "abc"


def test_rename_file(sandbox: Sandbox, workdir: str):
    src, dst = f"{workdir}/old.txt", f"{workdir}/new.txt"
    sandbox.files.write(src, "moving")
    info = sandbox.files.rename(src, dst)
    assert info.path == dst
    assert info.name == "new.txt"
    assert info.type == FileType.FILE
    assert sandbox.files.exists(src) is False
    assert sandbox.files.read(dst) == "moving"


def test_rename_into_new_dirs(sandbox: Sandbox, workdir: str):
    src, dst = f"{workdir}/r.txt", f"{workdir}/p/q/r2.txt"
    sh(sandbox, f"printf r > {q(src)}")
    info = sandbox.files.rename(src, dst)
    assert info.path == dst
    assert sh(sandbox, f"cat {q(dst)}") == "r"


def test_rename_dir(sandbox: Sandbox, tree: str, workdir: str):
    info = sandbox.files.rename(tree, f"{workdir}/tree2")
    assert info.type == FileType.DIR
    assert sandbox.files.read(f"{workdir}/tree2/sub/b.txt") == "12345"


def test_rename_missing(sandbox: Sandbox, workdir: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(f"{workdir}/ghost", f"{workdir}/ghost2")

"""File metadata: `X-Metadata-*` upload headers stored as `user.e2b.*` xattrs, surfaced in EntryInfo."""

from __future__ import annotations

import io

from e2b import Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry

from _helpers import q
from support.warren import require

META = {"author": "alice", "Project": "Warren", "empty-ish": "v 1.0 (beta)"}
EXPECTED = {"author": "alice", "project": "Warren", "empty-ish": "v 1.0 (beta)"}


def test_write_with_metadata_returns_it(sandbox: Sandbox, workdir: str):
    info = sandbox.files.write(f"{workdir}/m.txt", "x", metadata=META)
    assert info.metadata == EXPECTED  # keys lowercased by the agent


def test_metadata_in_get_info_and_list(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/m.txt"
    sandbox.files.write(path, "x", metadata=META)
    assert sandbox.files.get_info(path).metadata == EXPECTED
    (entry,) = sandbox.files.list(workdir)
    assert entry.metadata == EXPECTED


def xattr(sandbox: Sandbox, code: str) -> str:
    """Runs a python3 one-liner where the agent runs (to read/set xattrs out of band)."""
    found = sandbox.commands.run("command -v python3 || true").stdout.strip()
    require("python3 where the agent runs (to read and set xattrs out of band)", bool(found))
    return sandbox.commands.run("python3 -c " + q("import os; " + code)).stdout


def test_metadata_stored_as_xattrs(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/m.txt"
    sandbox.files.write(path, "x", metadata={"author": "alice"})
    out = xattr(sandbox, f"print(os.getxattr({path!r}, 'user.e2b.author').decode())")
    assert out == "alice\n"


def test_metadata_set_out_of_band_is_visible(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/oob.txt"
    sandbox.commands.run(f"touch {q(path)}")
    xattr(sandbox, f"os.setxattr({path!r}, 'user.e2b.origin', b'shell')")
    assert sandbox.files.get_info(path).metadata == {"origin": "shell"}
    (entry,) = sandbox.files.list(workdir)
    assert entry.metadata == {"origin": "shell"}


def test_no_metadata_is_none(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/plain.txt"
    info = sandbox.files.write(path, "x")
    assert not info.metadata
    assert sandbox.files.get_info(path).metadata is None


def test_overwrite_without_metadata_clears_it(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/m.txt"
    sandbox.files.write(path, "x", metadata=META)
    sandbox.files.write(path, "y")
    assert sandbox.files.get_info(path).metadata is None
    assert sandbox.files.read(path) == "y"


def test_overwrite_with_other_metadata_replaces_it(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/m.txt"
    sandbox.files.write(path, "x", metadata=META)
    info = sandbox.files.write(path, "y", metadata={"only": "this"})
    assert info.metadata == {"only": "this"}
    assert sandbox.files.get_info(path).metadata == {"only": "this"}


def test_metadata_with_octet_stream(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/octet.bin"
    info = sandbox.files.write(path, io.BytesIO(b"\x00\x01"), metadata={"kind": "octet"})
    assert info.metadata == {"kind": "octet"}
    assert sandbox.files.get_info(path).metadata == {"kind": "octet"}


def test_metadata_applies_to_every_file_of_write_files(sandbox: Sandbox, workdir: str):
    entries = [WriteEntry(path=f"{workdir}/w{i}.txt", data=str(i)) for i in range(3)]
    infos = sandbox.files.write_files(entries, metadata={"batch": "b1"})
    assert [i.metadata for i in infos] == [{"batch": "b1"}] * 3
    for e in entries:
        assert sandbox.files.get_info(e["path"]).metadata == {"batch": "b1"}


def test_metadata_survives_rename(sandbox: Sandbox, workdir: str):
    sandbox.files.write(f"{workdir}/a.txt", "x", metadata={"tag": "keep"})
    info = sandbox.files.rename(f"{workdir}/a.txt", f"{workdir}/b.txt")
    assert info.metadata == {"tag": "keep"}
    assert sandbox.files.get_info(f"{workdir}/b.txt").metadata == {"tag": "keep"}


def test_metadata_not_used_for_other_xattrs(sandbox: Sandbox, workdir: str):
    path = f"{workdir}/other.txt"
    sandbox.commands.run(f"touch {q(path)}")
    xattr(sandbox, f"os.setxattr({path!r}, 'user.other', b'z')")
    assert sandbox.files.get_info(path).metadata is None

"""Plain HTTP endpoints: /files (raw), /envs, /metrics, /init."""

from __future__ import annotations

import gzip
import json
import uuid
from typing import Iterator

import pytest
import requests

from e2b import Sandbox

from conftest import Agent, debug_opts
from _helpers import q


@pytest.fixture
def sbx(agent: Agent) -> Sandbox:
    return Sandbox.create(**debug_opts(agent.url))


def files_url(agent: Agent) -> str:
    return f"{agent.url}/files"


def assert_json_error(r: requests.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == status
    assert isinstance(body["message"], str) and body["message"]
    return body


# ---------------------------------------------------------------------------------------------
# GET /files
# ---------------------------------------------------------------------------------------------


def test_download(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/dl.txt"
    sbx.commands.run(f"printf 'download me' > {q(path)}")
    r = requests.get(files_url(agent), params={"path": path}, timeout=30)
    assert r.status_code == 200
    assert r.content == b"download me"


def test_download_as_user(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/dl.txt"
    sbx.commands.run(f"printf x > {q(path)}")
    r = requests.get(files_url(agent), params={"path": path, "username": "root"}, timeout=30)
    assert r.status_code == 200 and r.content == b"x"


def test_download_relative_path_resolves_to_home(agent: Agent, sbx: Sandbox, unique: str):
    name = f"warren-http-rel-{unique}.txt"
    sbx.commands.run(f"printf rel > ~/{name}")
    try:
        r = requests.get(files_url(agent), params={"path": name}, timeout=30)
        assert r.status_code == 200 and r.content == b"rel"
    finally:
        sbx.commands.run(f"rm -f ~/{name}")


def test_download_missing_is_404_json(agent: Agent, workdir: str):
    body = assert_json_error(
        requests.get(files_url(agent), params={"path": f"{workdir}/nope"}, timeout=30), 404
    )
    assert f"{workdir}/nope" in body["message"]


def test_download_directory_is_400_json(agent: Agent, workdir: str):
    assert_json_error(requests.get(files_url(agent), params={"path": workdir}, timeout=30), 400)


def test_download_unknown_user_is_401_json(agent: Agent, workdir: str):
    r = requests.get(
        files_url(agent), params={"path": workdir + "/x", "username": "nobody-here-x"}, timeout=30
    )
    assert_json_error(r, 401)


def test_download_gzip_negotiation(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/gz.txt"
    sbx.commands.run(f"seq 1 20000 > {q(path)}")
    expected = "".join(f"{i}\n" for i in range(1, 20001)).encode()
    r = requests.get(
        files_url(agent),
        params={"path": path},
        headers={"Accept-Encoding": "gzip"},
        stream=True,
        timeout=30,
    )
    assert r.status_code == 200
    raw = r.raw.read(decode_content=False)
    if r.headers.get("content-encoding") == "gzip":
        assert gzip.decompress(raw) == expected
    else:  # identity is acceptable too
        assert "content-encoding" not in r.headers
        assert raw == expected


def test_download_compresses_only_what_shrinks(agent: Agent, sbx: Sandbox, workdir: str):
    """Accept-Encoding: gzip allows compression; a large file that would not shrink (random
    bytes) comes as it is, with its length, and a large text file still comes gzipped."""
    noise, text = f"{workdir}/noise.bin", f"{workdir}/text.txt"
    sbx.commands.run(f"head -c 2097152 /dev/urandom > {q(noise)} && seq 1 300000 > {q(text)}")
    r = requests.get(files_url(agent), params={"path": noise}, headers={"Accept-Encoding": "gzip"}, timeout=30)
    assert r.status_code == 200
    assert "content-encoding" not in r.headers, r.headers
    assert r.headers["content-length"] == str(2 * 1024 * 1024)
    assert r.content == bytes(sbx.files.read(noise, format="bytes"))
    r = requests.get(
        files_url(agent), params={"path": text}, headers={"Accept-Encoding": "gzip"}, stream=True, timeout=30
    )
    assert r.headers.get("content-encoding") == "gzip"
    assert gzip.decompress(r.raw.read(decode_content=False)) == "".join(f"{i}\n" for i in range(1, 300001)).encode()


def test_download_identity_when_not_accepted(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/id.txt"
    sbx.commands.run(f"printf plain > {q(path)}")
    r = requests.get(
        files_url(agent),
        params={"path": path},
        headers={"Accept-Encoding": "identity"},
        stream=True,
        timeout=30,
    )
    assert r.status_code == 200
    assert r.headers.get("content-encoding") in (None, "identity")
    assert r.raw.read(decode_content=False) == b"plain"


def test_download_unacceptable_encoding_is_406(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/e.txt"
    sbx.commands.run(f"printf x > {q(path)}")
    r = requests.get(
        files_url(agent),
        params={"path": path},
        headers={"Accept-Encoding": "br, identity;q=0"},
        timeout=30,
    )
    assert_json_error(r, 406)


def test_download_range(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/range.txt"
    sbx.commands.run(f"printf 0123456789 > {q(path)}")
    r = requests.get(
        files_url(agent),
        params={"path": path},
        headers={"Range": "bytes=2-5", "Accept-Encoding": "identity"},
        timeout=30,
    )
    assert r.status_code == 206
    assert r.content == b"2345"
    assert r.headers["content-range"] == "bytes 2-5/10"


# ---------------------------------------------------------------------------------------------
# POST /files
# ---------------------------------------------------------------------------------------------


def test_upload_multipart_single(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/up/one.txt"
    r = requests.post(
        files_url(agent),
        params={"path": path},
        files=[("file", (path, b"multipart body", "application/octet-stream"))],
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json() == [{"path": path, "name": "one.txt", "type": "file"}]
    assert sbx.commands.run(f"cat {q(path)}").stdout == "multipart body"
    assert sbx.commands.run(f"stat -c %U {q(path)}").stdout.strip() == "user"


def test_upload_multipart_query_path_wins(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/from-query.txt"
    r = requests.post(
        files_url(agent),
        params={"path": path},
        files=[("file", (f"{workdir}/from-filename.txt", b"q", "text/plain"))],
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert [e["path"] for e in r.json()] == [path]
    assert sbx.commands.run(f"cat {q(path)}").stdout == "q"


def test_upload_multipart_many_uses_filenames(agent: Agent, sbx: Sandbox, workdir: str):
    parts = [
        ("file", (f"{workdir}/a.txt", b"A", "text/plain")),
        ("ignored", ("whatever", b"not a file part", "text/plain")),
        ("file", (f"{workdir}/nested/b.txt", b"B", "text/plain")),
    ]
    r = requests.post(files_url(agent), files=parts, timeout=30)
    assert r.status_code == 200, r.text
    assert sorted(e["path"] for e in r.json()) == [f"{workdir}/a.txt", f"{workdir}/nested/b.txt"]
    assert sbx.commands.run(f"cat {q(workdir)}/a.txt {q(workdir)}/nested/b.txt").stdout == "AB"


def test_upload_multipart_duplicate_path_is_400(agent: Agent, workdir: str):
    parts = [
        ("file", (f"{workdir}/dup.txt", b"1", "text/plain")),
        ("file", (f"{workdir}/dup.txt", b"2", "text/plain")),
    ]
    assert_json_error(requests.post(files_url(agent), files=parts, timeout=30), 400)


def test_upload_octet_stream(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/raw.bin"
    data = bytes(range(256)) * 10
    r = requests.post(
        files_url(agent),
        params={"path": path},
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json() == [{"path": path, "name": "raw.bin", "type": "file"}]
    got = requests.get(files_url(agent), params={"path": path}, timeout=30).content
    assert got == data


def test_upload_octet_stream_gzip(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/raw.txt"
    r = requests.post(
        files_url(agent),
        params={"path": path},
        data=gzip.compress(b"gunzipped by the agent\n" * 100),
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert sbx.commands.run(f"cat {q(path)}").stdout == "gunzipped by the agent\n" * 100


def test_upload_octet_stream_chunked(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/chunked.txt"

    def body() -> Iterator[bytes]:
        for i in range(100):
            yield f"chunk {i}\n".encode()

    r = requests.post(
        files_url(agent),
        params={"path": path},
        data=body(),
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert sbx.commands.run(f"cat {q(path)}").stdout == "".join(f"chunk {i}\n" for i in range(100))


def test_upload_bad_gzip_is_400(agent: Agent, workdir: str):
    r = requests.post(
        files_url(agent),
        params={"path": f"{workdir}/bad.gz"},
        data=b"definitely not gzip",
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert_json_error(r, 400)


def test_upload_refused_mid_form_answers_instead_of_breaking_the_pipe(agent: Agent, workdir: str):
    """A form whose first file cannot be written (the user may not create it) is refused with
    a JSON 403 while the client still streams the rest of the body: the agent reads the rest
    off, so the client sees the answer, not a broken pipe."""
    boundary = "warren-test-boundary"

    def body():
        yield (
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/root/nope/a.txt\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\nx\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{workdir}/b.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for _ in range(8):
            yield b"y" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    with requests.Session() as http:
        r = http.post(
            files_url(agent),
            params={"username": "user"},
            data=body(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
            timeout=30,
        )
        assert_json_error(r, 403)
        # The same connection still serves the next request.
        assert http.get(f"{agent.url}/health", timeout=10).status_code in (200, 204)


def test_upload_octet_stream_without_path_is_400(agent: Agent):
    r = requests.post(
        files_url(agent),
        data=b"x",
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert_json_error(r, 400)


def test_upload_bad_content_type_is_400(agent: Agent, workdir: str):
    r = requests.post(
        files_url(agent),
        params={"path": f"{workdir}/x"},
        data=b"x",
        headers={"Content-Type": "text/plain"},
        timeout=30,
    )
    assert_json_error(r, 400)


def test_upload_onto_directory_is_400(agent: Agent, workdir: str):
    r = requests.post(
        files_url(agent),
        params={"path": workdir},
        data=b"x",
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert_json_error(r, 400)


def test_upload_unknown_user_is_401(agent: Agent, workdir: str):
    r = requests.post(
        files_url(agent),
        params={"path": f"{workdir}/x", "username": "nobody-here-x"},
        data=b"x",
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert_json_error(r, 401)


def test_upload_metadata_headers(agent: Agent, sbx: Sandbox, workdir: str):
    path = f"{workdir}/meta.txt"
    r = requests.post(
        files_url(agent),
        params={"path": path},
        data=b"x",
        headers={
            "Content-Type": "application/octet-stream",
            "X-Metadata-Owner": "Bob",
            "x-metadata-Kind": "report",
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    (entry,) = r.json()
    assert entry["metadata"] == {"owner": "Bob", "kind": "report"}
    assert sbx.files.get_info(path).metadata == {"owner": "Bob", "kind": "report"}


def test_upload_invalid_metadata_is_400(agent: Agent, workdir: str):
    r = requests.post(
        files_url(agent),
        params={"path": f"{workdir}/m.txt"},
        data=b"x",
        headers={"Content-Type": "application/octet-stream", "X-Metadata-Big": "v" * 5000},
        timeout=30,
    )
    assert_json_error(r, 400)


# ---------------------------------------------------------------------------------------------
# /envs, /metrics, /init
# ---------------------------------------------------------------------------------------------


def test_envs(agent: Agent):
    r = requests.get(f"{agent.url}/envs", timeout=10)
    assert r.status_code == 200
    assert isinstance(r.json(), dict)


def test_metrics(agent: Agent):
    r = requests.get(f"{agent.url}/metrics", timeout=10)
    assert r.status_code == 200
    m = r.json()
    for key in (
        "ts",
        "cpu_count",
        "cpu_used_pct",
        "mem_total",
        "mem_used",
        "mem_cache",
        "mem_total_mib",
        "mem_used_mib",
        "disk_used",
        "disk_total",
    ):
        assert key in m, key
        assert isinstance(m[key], (int, float)), (key, m[key])
    assert m["cpu_count"] >= 1
    assert 0 < m["mem_used"] <= m["mem_total"]
    assert 0 < m["disk_used"] <= m["disk_total"]
    assert 0 <= m["cpu_used_pct"] <= 100


def test_init_sets_sandbox_env_vars(agent: Agent, sbx: Sandbox):
    name = f"WARREN_INIT_{uuid.uuid4().hex[:8].upper()}"
    r = requests.post(
        f"{agent.url}/init",
        data=json.dumps({"envVars": {name: "from-init"}}),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 204, r.text
    assert r.headers.get("x-envd-version")
    assert requests.get(f"{agent.url}/envs", timeout=10).json().get(name) == "from-init"
    assert sbx.commands.run(f'echo "${name}"').stdout == "from-init\n"
    # Per-command envs still win over sandbox-wide ones.
    assert sbx.commands.run(f'echo "${name}"', envs={name: "cmd"}).stdout == "cmd\n"


def test_init_random_seed(agent: Agent):
    """The host's random seed is accepted (mixed into the kernel's pool where the agent may);
    anything but hex is a 400 that changes nothing."""
    url = f"{agent.url}/init"
    headers = {"Content-Type": "application/json"}
    ok = requests.post(url, data=json.dumps({"randomSeed": "00ff" * 16}), headers=headers, timeout=10)
    assert ok.status_code == 204, ok.text
    for bad in ("xyz", "abc", "zz" * 4):
        r = requests.post(url, data=json.dumps({"randomSeed": bad}), headers=headers, timeout=10)
        assert r.status_code == 400, (bad, r.text)
        assert "randomSeed" in r.json()["message"]

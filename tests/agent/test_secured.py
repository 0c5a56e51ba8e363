"""An agent with an access token: X-Access-Token on every request, signed /files URLs."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Iterator

import pytest
import requests

from e2b import AuthenticationException, Sandbox, get_signature

from conftest import Agent, debug_opts
from _helpers import envelope

pytestmark = pytest.mark.secured

UNAUTHORIZED = {
    "code": 401,
    "message": "unauthorized access, please provide a valid access token or method signing if supported",
}
EXPIRED = {"code": 401, "message": "signature is already expired"}


def http_get(url: str) -> tuple[int, bytes]:
    """GET with urllib, as the SDK's own secured test does (no headers at all)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def file_url(agent: Agent, **query) -> str:
    return f"{agent.url}/files?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)


@pytest.fixture
def secure_path(secured_sandbox: Sandbox) -> Iterator[str]:
    path = f"/tmp/warren-secured-{uuid.uuid4().hex}/file.txt"
    secured_sandbox.files.write(path, "secret content")
    yield path
    secured_sandbox.commands.run(f"rm -rf {path.rsplit('/', 1)[0]}", user="root")


# ---------------------------------------------------------------------------------------------
# token on RPC and management endpoints
# ---------------------------------------------------------------------------------------------


def rpc(agent: Agent, token: str | None) -> requests.Response:
    headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    if token is not None:
        headers["X-Access-Token"] = token
    return requests.post(f"{agent.url}/process.Process/List", data=b"{}", headers=headers, timeout=10)


def test_rpc_without_token_is_401(secured_agent: Agent):
    r = rpc(secured_agent, None)
    assert r.status_code == 401
    assert r.json() == UNAUTHORIZED


def test_rpc_with_wrong_token_is_401(secured_agent: Agent):
    r = rpc(secured_agent, secured_agent.token + "x")
    assert r.status_code == 401
    assert r.json() == UNAUTHORIZED


def test_rpc_with_token_is_ok(secured_agent: Agent):
    assert rpc(secured_agent, secured_agent.token).status_code == 200


def test_streaming_rpc_without_token_is_401(secured_agent: Agent):
    body = envelope({"process": {"cmd": "/bin/true"}})
    r = requests.post(
        f"{secured_agent.url}/process.Process/Start",
        data=body,
        headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
        timeout=10,
    )
    assert r.status_code == 401


def test_filesystem_rpc_without_token_is_401(secured_agent: Agent):
    r = requests.post(
        f"{secured_agent.url}/filesystem.Filesystem/Stat",
        data=b'{"path":"/"}',
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 401


def test_health_needs_no_token(secured_agent: Agent):
    assert requests.get(f"{secured_agent.url}/health", timeout=10).status_code == 204


@pytest.mark.parametrize("path", ["/envs", "/metrics"])
def test_management_endpoints_need_token(secured_agent: Agent, path: str):
    local = urllib.parse.urlsplit(secured_agent.url).hostname in ("127.0.0.1", "::1", "localhost")
    expected = 200 if path == "/envs" and local else 401
    # From loopback (inside the sandbox) the sandbox-wide variables are open to the
    # sandbox's own services; from anywhere else they need the token.
    assert requests.get(f"{secured_agent.url}{path}", timeout=10).status_code == expected
    if path == "/envs" and local:
        r = requests.post(f"{secured_agent.url}/envs", timeout=10)
        assert r.status_code in (401, 405), r.text
    r = requests.get(
        f"{secured_agent.url}{path}", headers={"X-Access-Token": secured_agent.token}, timeout=10
    )
    assert r.status_code == 200


def test_init_needs_token(secured_agent: Agent):
    r = requests.post(f"{secured_agent.url}/init", json={"envVars": {}}, timeout=10)
    assert r.status_code == 401


def test_sdk_without_token_gets_authentication_error(secured_agent: Agent):
    sbx = Sandbox.create(**debug_opts(secured_agent.url))
    with pytest.raises(AuthenticationException):
        sbx.commands.run("true")
    with pytest.raises(AuthenticationException):
        sbx.files.read("/etc/hostname")


# ---------------------------------------------------------------------------------------------
# the SDK with the token (created through the SDK's regular, non-debug path)
# ---------------------------------------------------------------------------------------------


def test_sdk_with_token_runs_commands(secured_sandbox: Sandbox):
    assert secured_sandbox.commands.run("whoami").stdout == "user\n"


def test_sdk_with_token_reads_and_writes(secured_sandbox: Sandbox, secure_path: str):
    assert secured_sandbox.files.read(secure_path) == "secret content"
    assert secured_sandbox.files.exists(secure_path) is True


def test_files_with_token_header(secured_agent: Agent, secure_path: str):
    r = requests.get(
        f"{secured_agent.url}/files",
        params={"path": secure_path},
        headers={"X-Access-Token": secured_agent.token},
        timeout=10,
    )
    assert r.status_code == 200 and r.content == b"secret content"


def test_files_with_wrong_token_header_is_401(secured_agent: Agent, secure_path: str):
    r = requests.get(
        f"{secured_agent.url}/files",
        params={"path": secure_path},
        headers={"X-Access-Token": "wrong"},
        timeout=10,
    )
    assert r.status_code == 401


def test_files_without_token_or_signature_is_401(secured_agent: Agent, secure_path: str):
    status, _ = http_get(file_url(secured_agent, path=secure_path))
    assert status == 401


# ---------------------------------------------------------------------------------------------
# signed URLs
# ---------------------------------------------------------------------------------------------


def test_download_url_signed(secured_sandbox: Sandbox, secure_path: str):
    url = secured_sandbox.download_url(secure_path)
    assert "signature=v1_" in url
    assert http_get(url) == (200, b"secret content")


def test_download_url_with_user(secured_sandbox: Sandbox, secure_path: str):
    url = secured_sandbox.download_url(secure_path, user="root")
    assert "username=root" in url
    assert http_get(url) == (200, b"secret content")


def test_download_url_with_expiration(secured_sandbox: Sandbox, secure_path: str):
    url = secured_sandbox.download_url(secure_path, use_signature_expiration=120)
    assert "signature_expiration=" in url
    assert http_get(url) == (200, b"secret content")


def test_download_url_expired(secured_agent: Agent, secure_path: str):
    sig = get_signature(secure_path, "read", None, secured_agent.token, -30)
    url = file_url(
        secured_agent,
        path=secure_path,
        signature=sig["signature"],
        signature_expiration=sig["expiration"],
    )
    status, body = http_get(url)
    assert status == 401
    assert json.loads(body) == EXPIRED


def test_download_url_bad_signature(secured_agent: Agent, secure_path: str):
    status, body = http_get(file_url(secured_agent, path=secure_path, signature="v1_AAAA"))
    assert status == 401
    assert json.loads(body)["code"] == 401


def test_signature_is_bound_to_path(secured_agent: Agent, secure_path: str):
    sig = get_signature("/etc/hostname", "read", None, secured_agent.token)
    status, _ = http_get(file_url(secured_agent, path=secure_path, signature=sig["signature"]))
    assert status == 401


def test_signature_is_bound_to_operation(secured_agent: Agent, secure_path: str):
    sig = get_signature(secure_path, "write", None, secured_agent.token)
    status, _ = http_get(file_url(secured_agent, path=secure_path, signature=sig["signature"]))
    assert status == 401


def test_signature_is_bound_to_user(secured_agent: Agent, secure_path: str):
    sig = get_signature(secure_path, "read", "user", secured_agent.token)
    url = file_url(secured_agent, path=secure_path, username="root", signature=sig["signature"])
    assert http_get(url)[0] == 401


def test_signature_is_bound_to_expiration(secured_agent: Agent, secure_path: str):
    sig = get_signature(secure_path, "read", None, secured_agent.token, 60)
    tampered = sig["expiration"] + 3600
    url = file_url(
        secured_agent, path=secure_path, signature=sig["signature"], signature_expiration=tampered
    )
    assert http_get(url)[0] == 401


def test_signature_with_another_token_is_401(secured_agent: Agent, secure_path: str):
    sig = get_signature(secure_path, "read", None, "some-other-token")
    assert http_get(file_url(secured_agent, path=secure_path, signature=sig["signature"]))[0] == 401


def test_upload_url_signed(secured_sandbox: Sandbox):
    path = f"/tmp/warren-secured-{uuid.uuid4().hex}/up.txt"
    try:
        url = secured_sandbox.upload_url(path)
        assert "signature=v1_" in url
        r = requests.post(url, files=[("file", (path, b"uploaded via signed url", "text/plain"))], timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()[0]["path"] == path
        assert secured_sandbox.files.read(path) == "uploaded via signed url"
    finally:
        secured_sandbox.commands.run(f"rm -rf {path.rsplit('/', 1)[0]}", user="root")


def test_upload_url_with_expiration_octet_stream(secured_sandbox: Sandbox):
    path = f"/tmp/warren-secured-{uuid.uuid4().hex}/up.bin"
    try:
        url = secured_sandbox.upload_url(path, use_signature_expiration=120)
        r = requests.post(
            url, data=b"\x00\x01raw", headers={"Content-Type": "application/octet-stream"}, timeout=30
        )
        assert r.status_code == 200, r.text
        assert bytes(secured_sandbox.files.read(path, format="bytes")) == b"\x00\x01raw"
    finally:
        secured_sandbox.commands.run(f"rm -rf {path.rsplit('/', 1)[0]}", user="root")


def test_upload_url_expired(secured_agent: Agent):
    path = f"/tmp/warren-secured-{uuid.uuid4().hex}/never.txt"
    sig = get_signature(path, "write", None, secured_agent.token, -30)
    url = file_url(
        secured_agent, path=path, signature=sig["signature"], signature_expiration=sig["expiration"]
    )
    r = requests.post(url, files=[("file", (path, b"x", "text/plain"))], timeout=30)
    assert r.status_code == 401
    assert r.json() == EXPIRED


def test_upload_with_read_signature_is_401(secured_agent: Agent):
    path = f"/tmp/warren-secured-{uuid.uuid4().hex}/never.txt"
    sig = get_signature(path, "read", None, secured_agent.token)
    r = requests.post(
        file_url(secured_agent, path=path, signature=sig["signature"]),
        files=[("file", (path, b"x", "text/plain"))],
        timeout=30,
    )
    assert r.status_code == 401


def test_rejected_chunked_request_leaves_connection_usable(secured_agent: Agent):
    """A request rejected with 401 while its chunked body is still coming must get the 401 (not
    a reset) and leave the kept-alive connection usable, as Go's envd does by reading the
    request body before answering. The SDK sends every streaming RPC body this way."""
    u = urllib.parse.urlsplit(secured_agent.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        f = sock.makefile("rb")

        def request(token: str | None) -> int:
            auth = f"X-Access-Token: {token}\r\n" if token else ""
            sock.sendall(
                "POST /process.Process/Start HTTP/1.1\r\nHost: agent\r\n"
                "Content-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\n"
                f"{auth}\r\n".encode()
            )
            msg = envelope({"process": {"cmd": "/bin/true"}})
            sock.sendall(b"%x\r\n" % len(msg) + msg + b"\r\n")
            time.sleep(0.3)
            sock.sendall(b"0\r\n\r\n")
            status_line = f.readline()
            assert status_line, "connection closed instead of an answer"
            headers = {}
            while (line := f.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            if headers.get("transfer-encoding") == "chunked":
                while (n := int(f.readline().split(b";")[0], 16)) > 0:
                    f.read(n)
                    f.readline()
                f.readline()
            else:
                f.read(int(headers.get("content-length", "0")))
            return int(status_line.split()[1])

        try:
            assert request(None) == 401
            assert request(secured_agent.token) == 200
        except OSError as e:
            pytest.fail(f"the agent dropped the connection: {e!r}")

"""Wire-level Connect-RPC checks that the SDK cannot express (raw HTTP against the agent)."""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.parse
import uuid
from typing import Callable, List, Optional, Tuple

import pytest
import requests

from conftest import Agent
from _helpers import (
    FLAG_END_STREAM,
    b64,
    basic_auth,
    envelope,
    parse_envelopes,
    rpc_stream,
    rpc_unary,
    unb64,
)


def start_request(cmd: str, **extra) -> dict:
    return {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": False, **extra}


def run(agent: Agent, cmd: str, user: str = "root") -> bytes:
    """Runs a shell command through a raw Start call and returns its stdout."""
    _, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [start_request(cmd)],
        headers={"Authorization": basic_auth(user)},
    )
    events, trailer = events_of(frames)
    assert trailer == {} and events[-1]["end"].get("exitCode", 0) == 0, (events, trailer)
    return stdout_of(events)


def stdout_of(events) -> bytes:
    return b"".join(unb64(e["data"]["stdout"]) for e in events if "stdout" in e.get("data", {}))


class BackgroundStart:
    """A Start stream read on a thread, so the test can act on the running process."""

    def __init__(self, agent: Agent, request: dict, headers: Optional[dict] = None):
        self.agent = agent
        self.result: Optional[Tuple[requests.Response, List]] = None
        self._thread = threading.Thread(
            target=self._run, args=(request, headers or {}), daemon=True
        )
        self._thread.start()

    def _run(self, request: dict, headers: dict) -> None:
        self.result = rpc_stream(self.agent.url, "process.Process/Start", [request], headers)

    def find_pid(self, match: Callable[[dict], bool], timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = rpc_unary(self.agent.url, "process.Process/List", {}).json()
            for p in listed.get("processes", []):
                if match(p):
                    return p["pid"]
            time.sleep(0.05)
        raise AssertionError("started process never appeared in List")

    def frames(self, timeout: float = 15.0) -> List:
        self._thread.join(timeout)
        assert self.result is not None, "Start stream did not finish"
        return self.result[1]


def kill(agent: Agent, pid: int) -> None:
    rpc_unary(
        agent.url,
        "process.Process/SendSignal",
        {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"},
    )


def events_of(frames):
    """The `event` payloads of the message envelopes, and the end-of-stream JSON."""
    assert frames, "empty stream body"
    *msgs, (last_flags, trailer) = frames
    assert last_flags == FLAG_END_STREAM, f"last envelope is not end-of-stream: {frames[-1]}"
    for flags, _ in msgs:
        assert flags == 0, f"unexpected flags {flags:#x}"
    return [m["event"] for _, m in msgs], trailer


def test_start_stream_shape(agent: Agent):
    resp, frames = rpc_stream(agent.url, "process.Process/Start", [start_request("echo hi")])
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/connect+json")
    assert "content-encoding" not in resp.headers  # no HTTP-level compression on RPCs
    events, trailer = events_of(frames)
    assert trailer == {}
    assert list(events[0]) == ["start"] and events[0]["start"]["pid"] > 0
    assert stdout_of(events) == b"hi\n"
    # ProtoJSON: zero exitCode omitted, status text as envd writes it, no error on success.
    assert events[-1] == {"end": {"exited": True, "status": "exit status 0"}}


def test_start_failure_end_event(agent: Agent):
    _, frames = rpc_stream(agent.url, "process.Process/Start", [start_request("exit 3")])
    events, trailer = events_of(frames)
    assert trailer == {}
    assert events[-1] == {
        "end": {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}
    }


def test_start_killed_end_event(agent: Agent):
    _, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [start_request("kill -9 $$")],
    )
    events, _ = events_of(frames)
    end = events[-1]["end"]
    assert end["exitCode"] == -1
    assert end.get("exited", False) is False
    assert end["status"] == "signal: killed"
    assert end["error"] == "signal: killed"


def test_start_accepts_chunked_request_body(agent: Agent):
    body = envelope(start_request("echo chunked"))

    def gen():
        yield body[:3]
        yield body[3:]

    resp = requests.post(
        f"{agent.url}/process.Process/Start",
        data=gen(),  # requests sends a generator with Transfer-Encoding: chunked
        headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
        timeout=30,
    )
    events, trailer = events_of(parse_envelopes(resp.content))
    assert trailer == {}
    assert stdout_of(events) == b"chunked\n"


def test_start_deadline_ends_stream_with_deadline_exceeded(agent: Agent):
    t0 = time.monotonic()
    resp, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [start_request("sleep 10")],
        headers={"Connect-Timeout-Ms": "500"},
    )
    assert time.monotonic() - t0 < 8
    assert resp.status_code == 200
    _, trailer = events_of(frames)
    assert trailer["error"]["code"] == "deadline_exceeded"


def test_keepalive_events_when_idle(agent: Agent):
    _, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [start_request("sleep 2.5; echo done")],
        headers={"Keepalive-Ping-Interval": "1"},
    )
    events, trailer = events_of(frames)
    assert trailer == {}
    assert sum(1 for e in events if "keepalive" in e) >= 1
    assert "start" in events[0] and "end" in events[-1]


def test_start_bad_cwd_is_stream_error(agent: Agent):
    resp, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [{"process": {"cmd": "/bin/true", "cwd": "/nonexistent-warren"}}],
    )
    assert resp.status_code == 200  # streaming errors travel in the end-of-stream envelope
    _, trailer = events_of(frames)
    assert trailer["error"]["code"] == "invalid_argument"
    assert "/nonexistent-warren" in trailer["error"]["message"]


def test_start_unknown_user_is_unauthenticated(agent: Agent):
    resp, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [start_request("true")],
        headers={"Authorization": basic_auth("no-such-user-x")},
    )
    assert resp.status_code == 200
    _, trailer = events_of(frames)
    assert trailer["error"]["code"] == "unauthenticated"
    assert trailer["error"]["message"] == "invalid username: 'no-such-user-x'"


def test_start_with_tag_and_select_by_tag(agent: Agent):
    tag = f"tag-{uuid.uuid4().hex}"
    bg = BackgroundStart(agent, {"process": {"cmd": "/bin/sleep", "args": ["30"]}, "tag": tag})
    pid = bg.find_pid(lambda p: p.get("tag") == tag)
    listed = rpc_unary(agent.url, "process.Process/List", {}).json()["processes"]
    (mine,) = [p for p in listed if p["pid"] == pid]
    assert mine["config"]["cmd"] == "/bin/sleep"
    assert mine["config"]["args"] == ["30"]
    r = rpc_unary(
        agent.url,
        "process.Process/SendSignal",
        {"process": {"tag": tag}, "signal": "SIGNAL_SIGKILL"},
    )
    assert r.status_code == 200 and r.json() == {}
    events, _ = events_of(bg.frames())
    assert events[-1]["end"]["status"] == "signal: killed"


def test_send_signal_unsupported_signal(agent: Agent):
    mark = uuid.uuid4().hex
    bg = BackgroundStart(
        agent, {"process": {"cmd": "/bin/sleep", "args": ["30"], "envs": {"MARK": mark}}}
    )
    pid = bg.find_pid(lambda p: p["config"].get("envs", {}).get("MARK") == mark)
    try:
        r = rpc_unary(
            agent.url,
            "process.Process/SendSignal",
            {"process": {"pid": pid}, "signal": "SIGNAL_UNSPECIFIED"},
        )
        assert r.status_code == 501
        assert r.json()["code"] == "unimplemented"
    finally:
        kill(agent, pid)
        bg.frames()


def test_sigterm(agent: Agent):
    mark = uuid.uuid4().hex
    bg = BackgroundStart(
        agent, {"process": {"cmd": "/bin/sleep", "args": ["30"], "envs": {"MARK": mark}}}
    )
    pid = bg.find_pid(lambda p: p["config"].get("envs", {}).get("MARK") == mark)
    r = rpc_unary(
        agent.url,
        "process.Process/SendSignal",
        {"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"},
    )
    assert r.status_code == 200
    events, _ = events_of(bg.frames())
    assert events[-1]["end"]["status"] == "signal: terminated"
    assert events[-1]["end"]["exitCode"] == -1


def test_unary_success_shape(agent: Agent):
    r = rpc_unary(agent.url, "process.Process/List", {})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert isinstance(r.json(), dict)


def test_unary_not_found_shape(agent: Agent):
    r = rpc_unary(
        agent.url,
        "process.Process/SendSignal",
        {"process": {"pid": 999999999}, "signal": "SIGNAL_SIGKILL"},
    )
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["code"] == "not_found"
    assert isinstance(body["message"], str) and body["message"]


@pytest.mark.parametrize(
    "procedure",
    ["process.Process/List", "process.Process/SendInput", "filesystem.Filesystem/Stat"],
)
def test_malformed_json_is_invalid_argument(agent: Agent, procedure: str):
    r = rpc_unary(agent.url, procedure, b'{"not json')
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["code"] == "invalid_argument"
    assert body["message"]


def test_wrong_field_type_is_invalid_argument(agent: Agent):
    r = rpc_unary(agent.url, "process.Process/SendInput", {"process": {"pid": "abc"}})
    assert r.status_code == 400
    assert r.json()["code"] == "invalid_argument"


def test_malformed_stream_message_is_invalid_argument(agent: Agent):
    resp, frames = rpc_stream(agent.url, "process.Process/Start", [envelope(b"{oops")])
    assert resp.status_code == 200
    _, trailer = events_of(frames)
    assert trailer["error"]["code"] == "invalid_argument"


def test_unknown_fields_are_ignored(agent: Agent):
    r = rpc_unary(agent.url, "process.Process/List", {"someFutureField": 1})
    assert r.status_code == 200


def test_snake_case_field_names_accepted(agent: Agent):
    # ProtoJSON parsers accept the original field names too (process_pb uses json_name).
    resp, frames = rpc_stream(
        agent.url,
        "process.Process/Start",
        [{"process": {"cmd": "/bin/echo", "args": ["snake"]}, "stdin": False}],
    )
    events, trailer = events_of(frames)
    assert trailer == {}
    assert stdout_of(events) == b"snake\n"


@pytest.mark.parametrize(
    "procedure",
    [
        "process.Process/NoSuchMethod",
        "filesystem.Filesystem/NoSuchMethod",
        "nosuch.Service/Method",
    ],
)
def test_unknown_procedure_is_404(agent: Agent, procedure: str):
    r = rpc_unary(agent.url, procedure, {})
    assert r.status_code == 404


def test_send_input_base64(agent: Agent):
    mark = uuid.uuid4().hex
    bg = BackgroundStart(
        agent, {"process": {"cmd": "/bin/cat", "envs": {"MARK": mark}}, "stdin": True}
    )
    pid = bg.find_pid(lambda p: p["config"].get("envs", {}).get("MARK") == mark)
    payload = bytes([0, 1, 2, 250, 251, 255]) + "ü".encode()
    r = rpc_unary(
        agent.url,
        "process.Process/SendInput",
        {"process": {"pid": pid}, "input": {"stdin": b64(payload)}},
    )
    assert r.status_code == 200, r.text
    r = rpc_unary(agent.url, "process.Process/CloseStdin", {"process": {"pid": pid}})
    assert r.status_code == 200, r.text
    events, trailer = events_of(bg.frames())
    assert trailer == {}
    assert stdout_of(events) == payload


def test_stream_input_client_stream(agent: Agent):
    mark = uuid.uuid4().hex
    bg = BackgroundStart(
        agent, {"process": {"cmd": "/bin/cat", "envs": {"MARK": mark}}, "stdin": True}
    )
    pid = bg.find_pid(lambda p: p["config"].get("envs", {}).get("MARK") == mark)
    resp, frames = rpc_stream(
        agent.url,
        "process.Process/StreamInput",
        [
            {"start": {"process": {"pid": pid}}},
            {"data": {"input": {"stdin": b64(b"one ")}}},
            {"keepalive": {}},
            {"data": {"input": {"stdin": b64(b"two")}}},
        ],
    )
    assert resp.status_code == 200
    # Client-stream response: one (empty) message, then end-of-stream {}.
    assert frames == [(0, {}), (FLAG_END_STREAM, {})]
    rpc_unary(agent.url, "process.Process/CloseStdin", {"process": {"pid": pid}})
    events, _ = events_of(bg.frames())
    assert stdout_of(events) == b"one two"


def test_stat_response_shape(agent: Agent):
    path = f"/tmp/warren-wire-{uuid.uuid4().hex}"
    run(agent, f"printf 12345 > {path} && chmod 640 {path} && chown user:user {path}")
    try:
        r = rpc_unary(agent.url, "filesystem.Filesystem/Stat", {"path": path})
        assert r.status_code == 200, r.text
        entry = r.json()["entry"]
        assert entry["name"] == path.rsplit("/", 1)[1]
        assert entry["type"] == "FILE_TYPE_FILE"
        assert entry["path"] == path
        assert entry["size"] == "5"  # int64 as a JSON string
        assert entry["mode"] == 0o640
        assert entry["permissions"] == "-rw-r-----"
        assert entry["owner"] == "user" and entry["group"] == "user"
        assert entry["modifiedTime"].endswith("Z")
        assert "symlinkTarget" not in entry
        assert "metadata" not in entry  # empty map omitted
    finally:
        run(agent, f"rm -f {path}")


def test_stat_missing_shape(agent: Agent):
    r = rpc_unary(agent.url, "filesystem.Filesystem/Stat", {"path": "/nonexistent-warren-x"})
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"


def test_get_watcher_events_unknown_id(agent: Agent):
    r = rpc_unary(agent.url, "filesystem.Filesystem/GetWatcherEvents", {"watcherId": "nope"})
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"


def test_remove_watcher_unknown_id(agent: Agent):
    r = rpc_unary(agent.url, "filesystem.Filesystem/RemoveWatcher", {"watcherId": "nope"})
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"


def test_watch_dir_stream_starts_with_start_event(agent: Agent):
    resp, frames = rpc_stream(
        agent.url,
        "filesystem.Filesystem/WatchDir",
        [{"path": "/tmp"}],
        headers={"Connect-Timeout-Ms": "500"},
    )
    assert resp.status_code == 200
    msgs = [m for f, m in frames if f == 0]
    assert msgs and msgs[0] == {"start": {}}
    flags, trailer = frames[-1]
    assert flags == FLAG_END_STREAM
    assert trailer["error"]["code"] == "deadline_exceeded"


def test_watch_dir_missing_is_stream_error(agent: Agent):
    resp, frames = rpc_stream(
        agent.url, "filesystem.Filesystem/WatchDir", [{"path": "/nonexistent-warren-x"}]
    )
    assert resp.status_code == 200
    flags, trailer = frames[-1]
    assert flags == FLAG_END_STREAM
    assert trailer["error"]["code"] == "not_found"


def test_health(agent: Agent):
    r = requests.get(f"{agent.url}/health", timeout=10)
    assert r.status_code == 204
    assert r.content == b""
    assert r.headers.get("cache-control") == "no-store"


def test_unknown_path_is_404(agent: Agent):
    assert requests.get(f"{agent.url}/no-such-endpoint", timeout=10).status_code == 404


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 connection handling with chunked request bodies (how the Python SDK sends every
# streaming RPC). These pin down, deterministically, races the SDK suites hit now and then.
# ---------------------------------------------------------------------------------------------


class RawHttp:
    """One HTTP/1.1 connection driven by hand."""

    def __init__(self, agent: Agent):
        u = urllib.parse.urlsplit(agent.url)
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()

    def send_headers(self, path: str, content_type: str = "application/connect+json") -> None:
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: {content_type}\r\n"
            "Connect-Protocol-Version: 1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )

    def send_chunk(self, data: bytes) -> None:
        self.sock.sendall(b"%x\r\n" % len(data) + data + b"\r\n")

    def end_body(self) -> None:
        self.sock.sendall(b"0\r\n\r\n")

    def pending(self, wait: float) -> bool:
        """Whether the server has sent anything within `wait` seconds."""
        readable, _, _ = select.select([self.sock], [], [], wait)
        return bool(readable)

    def read_response(self) -> Tuple[int, bytes]:
        """Reads one whole response (status, de-chunked body); fails on a closed connection."""
        f = self.sock.makefile("rb")
        status_line = f.readline()
        assert status_line, "connection closed by the agent instead of answering"
        status = int(status_line.split()[1])
        headers = {}
        while (line := f.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = b""
        if headers.get("transfer-encoding") == "chunked":
            while (size := int(f.readline().split(b";")[0], 16)) > 0:
                body += f.read(size)
                f.readline()
            f.readline()
        else:
            body = f.read(int(headers.get("content-length", "0")))
        return status, body


def test_connection_reusable_when_chunked_terminator_comes_late(agent: Agent):
    """The SDK writes a server-stream request as one chunk and then the terminating chunk; if
    the terminator arrives only after a quick command has already ended, the kept-alive
    connection must still serve the next request (envd reads the request body to its end)."""
    conn = RawHttp(agent)
    try:
        for i in range(2):
            try:
                conn.send_headers("/process.Process/Start")
                conn.send_chunk(envelope(start_request(f"echo round-{i}")))
                time.sleep(0.3)  # the command ends meanwhile
                conn.end_body()
                status, body = conn.read_response()
            except (OSError, AssertionError) as e:
                pytest.fail(f"request {i + 1} on the kept-alive connection failed: {e!r}")
            assert status == 200
            events, trailer = events_of(parse_envelopes(body))
            assert trailer == {} and stdout_of(events) == f"round-{i}\n".encode()
    finally:
        conn.close()


def test_stream_input_answers_only_after_the_input_ends(agent: Agent):
    """A client stream's answer (headers included) must wait for the end of the input, as
    connect-go's does: the SDK's HTTP stack stops sending a request body it has already been
    answered for, and the input is then silently lost."""
    mark = uuid.uuid4().hex
    bg = BackgroundStart(
        agent, {"process": {"cmd": "/bin/cat", "envs": {"MARK": mark}}, "stdin": True}
    )
    pid = bg.find_pid(lambda p: p["config"].get("envs", {}).get("MARK") == mark)
    conn = RawHttp(agent)
    try:
        conn.send_headers("/process.Process/StreamInput")
        conn.send_chunk(envelope({"start": {"process": {"pid": pid}}}))
        early = conn.pending(0.5)
        conn.send_chunk(envelope({"data": {"input": {"stdin": b64(b"late input")}}}))
        conn.end_body()
        status, body = conn.read_response()
        assert status == 200
        assert parse_envelopes(body) == [(0, {}), (FLAG_END_STREAM, {})]
        assert not early, "the agent answered StreamInput before the input stream ended"
    finally:
        conn.close()
        rpc_unary(agent.url, "process.Process/CloseStdin", {"process": {"pid": pid}})
    events, _ = events_of(bg.frames())
    assert stdout_of(events) == b"late input"

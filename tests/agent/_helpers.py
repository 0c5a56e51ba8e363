"""Shared helpers of the agent conformance suite (no fixtures here; see conftest.py). The skip
rule, `require`, is the one of every suite: `support.warren` (tests/support)."""

from __future__ import annotations

import base64
import json
import shlex
import struct
import threading
import time
from typing import Any, Callable, Iterable, List, Optional, Tuple, TypeVar

import requests

T = TypeVar("T")

# Connect envelope flags.
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition not met",
) -> T:
    """Polls `predicate` until it returns a truthy value; fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s: {message}")
        time.sleep(interval)


def q(s: str) -> str:
    """Shell-quotes one word."""
    return shlex.quote(s)


class Collector:
    """Drains a sync `CommandHandle` (command or PTY) on a background thread.

    The sync SDK only delivers output while someone iterates the handle, so tests that need
    to interact with a running process while observing its output use this.
    """

    def __init__(self, handle: Any):
        self.handle = handle
        self._lock = threading.Lock()
        self._stdout: List[str] = []
        self._stderr: List[str] = []
        self._pty = bytearray()
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self.handle.wait(
                on_stdout=self._add_stdout,
                on_stderr=self._add_stderr,
                on_pty=self._add_pty,
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            self.error = e
        finally:
            self.done.set()

    def _add_stdout(self, s: str) -> None:
        with self._lock:
            self._stdout.append(s)

    def _add_stderr(self, s: str) -> None:
        with self._lock:
            self._stderr.append(s)

    def _add_pty(self, b: bytes) -> None:
        with self._lock:
            self._pty.extend(b)

    @property
    def stdout(self) -> str:
        with self._lock:
            return "".join(self._stdout)

    @property
    def stderr(self) -> str:
        with self._lock:
            return "".join(self._stderr)

    @property
    def pty(self) -> str:
        with self._lock:
            return self._pty.decode("utf-8", errors="replace")

    def pty_len(self) -> int:
        with self._lock:
            return len(self._pty)

    def wait_stdout(self, needle: str, timeout: float = 10.0) -> str:
        wait_until(
            lambda: needle in self.stdout or self.done.is_set(),
            timeout,
            message=f"{needle!r} in stdout {self.stdout!r}",
        )
        assert needle in self.stdout, (
            f"stream ended before {needle!r} appeared; stdout={self.stdout!r} "
            f"error={self.error!r}"
        )
        return self.stdout

    def wait_pty(self, needle: str, timeout: float = 10.0, start: int = 0) -> str:
        """Waits until `needle` appears in the PTY output after byte offset `start`."""

        def found() -> bool:
            with self._lock:
                tail = self._pty[start:].decode("utf-8", errors="replace")
            return needle in tail

        wait_until(
            lambda: found() or self.done.is_set(),
            timeout,
            message=f"{needle!r} in pty output {self.pty[-400:]!r}",
        )
        assert found(), (
            f"PTY stream ended before {needle!r} appeared; output={self.pty[-400:]!r} "
            f"error={self.error!r}"
        )
        with self._lock:
            return self._pty[start:].decode("utf-8", errors="replace")

    def join(self, timeout: float = 15.0) -> Any:
        """Waits for the end of the stream; returns the result or raises the handle's error."""
        assert self.done.wait(timeout), f"stream did not end within {timeout}s"
        if self.error is not None:
            raise self.error
        return self.result


# ---------------------------------------------------------------------------------------------
# Raw Connect-RPC over HTTP (for wire-level checks the SDK cannot express)
# ---------------------------------------------------------------------------------------------


def envelope(message: Any, flags: int = 0) -> bytes:
    payload = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def parse_envelopes(body: bytes) -> List[Tuple[int, Any]]:
    """Splits a Connect streaming body into (flags, decoded JSON) pairs; asserts it is whole."""
    frames: List[Tuple[int, Any]] = []
    i = 0
    while i < len(body):
        assert len(body) - i >= 5, f"truncated envelope header at byte {i}: {body[i:]!r}"
        flags, length = struct.unpack(">BI", body[i : i + 5])
        payload = body[i + 5 : i + 5 + length]
        assert len(payload) == length, f"truncated envelope payload at byte {i}"
        frames.append((flags, json.loads(payload) if payload else None))
        i += 5 + length
    return frames


def basic_auth(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def rpc_unary(
    base_url: str,
    procedure: str,
    body: Any,
    headers: Optional[dict] = None,
    timeout: float = 30.0,
) -> requests.Response:
    """POSTs a unary Connect JSON request; `body` may be a dict or raw bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {
        "Content-Type": "application/json",
        "Connect-Protocol-Version": "1",
        **(headers or {}),
    }
    return requests.post(f"{base_url}/{procedure}", data=data, headers=h, timeout=timeout)


def rpc_stream(
    base_url: str,
    procedure: str,
    messages: Iterable[Any],
    headers: Optional[dict] = None,
    timeout: float = 30.0,
) -> Tuple[requests.Response, List[Tuple[int, Any]]]:
    """POSTs a streaming Connect JSON request (whole body at once) and reads every envelope."""
    data = b"".join(m if isinstance(m, bytes) else envelope(m) for m in messages)
    h = {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        **(headers or {}),
    }
    resp = requests.post(f"{base_url}/{procedure}", data=data, headers=h, timeout=timeout)
    frames = parse_envelopes(resp.content) if resp.status_code == 200 else []
    return resp, frames


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(s: str) -> bytes:
    return base64.b64decode(s + "=" * (-len(s) % 4))

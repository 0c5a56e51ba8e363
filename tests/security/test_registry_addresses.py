"""W3-M1: a template's `fromImage` must not make the server connect to addresses the operator
did not allow (loopback, private, link-local, metadata, ...). The suite's server names only
its own loopback registry (`--registry-mirror docker.io=http://127.0.0.1:P`,
`--registry-insecure 127.0.0.1:P`); another loopback port is refused with an error that names
it, and gets no connection. Nothing here leaves loopback.
"""

from __future__ import annotations

import socket
import uuid

import pytest
from e2b import Template
from e2b.exceptions import BuildException


def _build(tpl, name):
    logs: list[str] = []
    Template.build(tpl, name, on_build_logs=lambda l: logs.append(l.message))
    return logs


def _pending(listener: socket.socket) -> int:
    """Connections waiting on `listener` (the server's connect returns once one is queued)."""
    listener.setblocking(False)
    n = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_a_loopback_registry_the_operator_did_not_name_is_refused_untouched(server, host):
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    try:
        with pytest.raises(BuildException) as e:
            _build(
                Template().from_image(f"{host}:{port}/probe:1"),
                f"addr-{uuid.uuid4().hex[:8]}",
            )
        text = str(e.value)
        assert f"registry address {host}:{port} is not allowed" in text, text
        assert "loopback" in text and "--registry-allow" in text, text
        assert _pending(listener) == 0, "the refused address got a connection"
    finally:
        listener.close()

"""The SDK version matrix: one flow (create, commands, files, terminal, list, pause, connect,
timeout, kill) run by each pinned `e2b` Python release against one `warren serve` (the shared
harness, tests/support). `scripts/sdk-matrix.sh` makes a venv per release and runs this suite
in it.

WARREN_BIN, WARREN_E2E_DATA_DIR and WARREN_E2E_RUNTIME (default `ns`) as in tests/e2e.
"""

from __future__ import annotations

import os
import socket

import pytest

# The session-wide server of tests/e2e, reused as it is.
from support.fixtures import _registry, api, server  # noqa: F401 (fixtures)
from support.warren import Server


# --- domain mode ------------------------------------------------------------------------------
# Releases before 2.21 reach sandboxes only at https://<port>-<id>.<domain> (no
# E2B_SANDBOX_URL). With WARREN_COMPAT_DOMAIN=1 the server is restarted with `--domain` and its
# HTTPS listener on 127.0.0.1:443, and the SDK gets only E2B_DOMAIN and the server's CA, as a
# user of such a release would configure it. Names under the test domain resolve to loopback
# inside this test process only (its resolver is wrapped); every other name still fails here,
# so nothing is resolved or sent elsewhere.

DOMAIN = "warren.test"
DOMAIN_MODE = os.environ.get("WARREN_COMPAT_DOMAIN") == "1"


def _resolve_test_domain_to_loopback():
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str) and (name == DOMAIN or name.endswith("." + DOMAIN)):
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    return real


@pytest.fixture(scope="session")
def sdk_server(server):
    """The server as the SDK release under test reaches it (URL mode, or domain mode)."""
    if not DOMAIN_MODE:
        yield server
        return
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 443))
        except OSError:
            pytest.fail("domain mode needs port 443 on 127.0.0.1 free for the HTTPS listener")
    server.stop()
    srv = Server(server.data_dir, server.extra_args + ("--domain", DOMAIN, "--tls-listen", "127.0.0.1:443"))
    srv.port, srv.url = server.port, server.url
    saved = {k: os.environ.pop(k, None) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN", "SSL_CERT_FILE")}
    real = _resolve_test_domain_to_loopback()
    try:
        srv.start()
        os.environ.update(E2B_DOMAIN=DOMAIN, SSL_CERT_FILE=os.path.join(server.data_dir, "tls", DOMAIN, "ca.crt"))
        yield srv
    finally:
        socket.getaddrinfo = real
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
        srv.stop()
        server.start()

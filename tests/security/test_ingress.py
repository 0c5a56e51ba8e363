"""Threat model C1: every sandbox port is authorised at the proxy. Port 49999 is a service
port on every template (the code interpreter's), so a web server the test starts there stands
in for it; tests/interpreter checks the real interpreter the same way."""

from __future__ import annotations

import pytest
from e2b import Sandbox

from conftest import proxy_get, serve_in_sandbox
from support.warren import API_KEY

SERVICE_PORT = 49999
USER_PORT = 8000


def test_service_port_needs_a_token(server, sbx):
    serve_in_sandbox(sbx, SERVICE_PORT)
    # Only the routing headers: what anyone who learned the sandbox id could send.
    r = proxy_get(server, sbx.sandbox_id, SERVICE_PORT)
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["code"] == 403 and body["sandboxId"] == sbx.sandbox_id
    assert proxy_get(server, sbx.sandbox_id, SERVICE_PORT, {"X-Access-Token": "ea_guess"}).status_code == 403
    # Both tokens the SDKs send open it.
    envd = sbx._envd_access_token
    traffic = sbx.traffic_access_token
    assert envd and traffic
    assert proxy_get(server, sbx.sandbox_id, SERVICE_PORT, {"X-Access-Token": envd}).status_code == 200
    assert proxy_get(server, sbx.sandbox_id, SERVICE_PORT, {"E2B-Traffic-Access-Token": traffic}).status_code == 200


def test_public_user_ports_stay_public(server, sbx):
    serve_in_sandbox(sbx, USER_PORT)
    assert proxy_get(server, sbx.sandbox_id, USER_PORT).status_code == 200


def test_private_sandbox_needs_the_traffic_token(server):
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        serve_in_sandbox(sbx, USER_PORT)
        r = proxy_get(server, sbx.sandbox_id, USER_PORT)
        assert r.status_code == 403 and "traffic access token" in r.json()["message"]
        bad = proxy_get(server, sbx.sandbox_id, USER_PORT, {"e2b-traffic-access-token": "ta_guess"})
        assert bad.status_code == 403
        ok = proxy_get(server, sbx.sandbox_id, USER_PORT, {"e2b-traffic-access-token": sbx.traffic_access_token})
        assert ok.status_code == 200
        # Cross-site (a page on another site, DNS rebinding) without the token: refused.
        cross = proxy_get(server, sbx.sandbox_id, USER_PORT, {"Origin": "http://evil.test"})
        assert cross.status_code == 403
        assert Sandbox.get_info(sbx.sandbox_id).network.get("allow_public_traffic") is False
    finally:
        sbx.kill()


def test_header_rules_that_could_redirect_a_request_are_refused(server):
    # A rule may not set the headers that frame a request or name its host: the request
    # never gets as far as a sandbox.
    for header in ("Host", "Content-Length", "Transfer-Encoding"):
        with pytest.raises(Exception) as e:
            Sandbox.create(timeout=60, network={"rules": {"api.example.test": [
                {"transform": {"headers": {header: "x"}}}]}})
        assert "cannot be set" in str(e.value), header


def start_header_echo(sbx) -> None:
    """A server on port 8001 in the sandbox that answers with the headers it received."""
    sbx.files.write(
        "/tmp/echo.py",
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        b = str(self.headers).lower().encode()\n"
        "        self.send_response(200); self.send_header('content-length', str(len(b)))\n"
        "        self.end_headers(); self.wfile.write(b)\n"
        "http.server.HTTPServer(('0.0.0.0', 8001), H).serve_forever()\n",
    )
    sbx.commands.run("python3 /tmp/echo.py", background=True)
    sbx.commands.run(
        "for i in $(seq 100); do python3 -c \"import urllib.request; "
        "urllib.request.urlopen('http://127.0.0.1:8001/')\" 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    )


def test_mask_request_host_is_the_host_the_service_sees(server):
    sbx = Sandbox.create(timeout=300, network={"mask_request_host": "app.example.test:${PORT}"})
    try:
        start_header_echo(sbx)
        r = proxy_get(server, sbx.sandbox_id, 8001)
        assert r.status_code == 200
        assert "host: app.example.test:8001" in r.text, r.text
        assert sbx.get_info().network.get("mask_request_host") == "app.example.test:${PORT}"
    finally:
        sbx.kill()


def test_api_key_and_traffic_token_never_reach_the_sandbox(server):
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        start_header_echo(sbx)
        r = proxy_get(server, sbx.sandbox_id, 8001, {
            "e2b-traffic-access-token": sbx.traffic_access_token,
            "X-API-KEY": API_KEY,
            "X-Access-Token": sbx._envd_access_token,
        })
        assert r.status_code == 200
        seen = r.text
        assert "x-api-key" not in seen and "e2b-traffic-access-token" not in seen
        assert "x-access-token" not in seen, seen
    finally:
        sbx.kill()

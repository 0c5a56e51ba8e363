"""Threat model L2: signed file URLs never expire unless the client asks. `warren serve
--signed-url-max-age <seconds>` caps their lifetime: a URL without an expiration, or expiring
later than that, is refused (401); without the flag URLs behave as upstream E2B's."""

from __future__ import annotations

import pytest
import requests
from e2b import Sandbox

from support.warren import Server

MAX_AGE = 300
PATH = "/tmp/l2-signed.txt"


def capped(shared, max_age: int):
    """The shared server's data dir and port (the SDK's E2B_API_URL stays valid), started with
    `--signed-url-max-age`. Only one server may run per host, so the shared one is stopped for
    the time being."""
    srv = Server(shared.data_dir, ("--signed-url-max-age", str(max_age)))
    srv.port, srv.url = shared.port, shared.url
    return srv


@pytest.fixture(scope="module")
def capped_server(server):
    server.stop()
    capped_srv = capped(server, MAX_AGE)
    try:
        capped_srv.start()
        yield capped_srv
    finally:
        capped_srv.stop()
        # The rest of the session expects the shared server back, as it was.
        server.start()


def fetch(sbx, url: str) -> requests.Response:
    # The signed URL alone, routed to the sandbox's agent: what anyone holding the URL can send.
    return requests.get(url, headers={"E2b-Sandbox-Id": sbx.sandbox_id}, timeout=30)


def post(sbx, url: str, data: bytes) -> requests.Response:
    return requests.post(url, headers={"E2b-Sandbox-Id": sbx.sandbox_id}, files={"file": data}, timeout=30)


def test_signed_urls_without_expiry_work_by_default(server, sbx):
    sbx.files.write(PATH, "l2")
    r = fetch(sbx, sbx.download_url(PATH))
    assert r.status_code == 200 and r.text == "l2", r.text


def test_a_maximum_age_refuses_urls_without_a_near_expiry(capped_server):
    sbx = Sandbox.create(timeout=300, request_timeout=300)
    try:
        sbx.files.write(PATH, "l2")
        # Without an expiration: refused, with the reason.
        r = fetch(sbx, sbx.download_url(PATH))
        assert r.status_code == 401, r.text
        assert "requires signed URLs to expire" in r.json()["message"]
        # Expiring later than the cap allows: refused.
        r = fetch(sbx, sbx.download_url(PATH, use_signature_expiration=10 * MAX_AGE))
        assert r.status_code == 401, r.text
        assert "expires later" in r.json()["message"]
        # Within the cap: served.
        r = fetch(sbx, sbx.download_url(PATH, use_signature_expiration=MAX_AGE // 2))
        assert r.status_code == 200 and r.text == "l2", r.text
        # Uploads follow the same rule.
        assert post(sbx, sbx.upload_url("/tmp/l2-up.txt"), b"up").status_code == 401
        ok = post(sbx, sbx.upload_url("/tmp/l2-up.txt", use_signature_expiration=MAX_AGE // 2), b"up")
        assert ok.status_code == 200, ok.text
        assert sbx.files.read("/tmp/l2-up.txt") == "up"
        # The SDK's own file calls carry the token, not a signature: unaffected.
        assert sbx.files.read(PATH) == "l2"
        # A resumed sandbox keeps the cap (its agent is initialised again, or kept its memory).
        assert sbx.pause() is True
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert fetch(sbx, sbx.download_url(PATH)).status_code == 401
        assert fetch(sbx, sbx.download_url(PATH, use_signature_expiration=MAX_AGE // 2)).status_code == 200
    finally:
        sbx.kill()

"""Threat model L2: signed file URLs never expire unless the client asks. `warren serve
--signed-url-max-age <seconds>` caps their lifetime: a URL without an expiration, or expiring
later than that, is refused (401); without the flag URLs behave as upstream E2B's."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import requests
from e2b import Sandbox

import conftest

MAX_AGE = 300
PATH = "/tmp/l2-signed.txt"


class CappedServer(conftest._e2e.Server):
    """The shared server's data dir and port (the SDK's E2B_API_URL stays valid), started with
    `--signed-url-max-age`. Only one server may run per host, so the shared one is stopped for
    the time being."""

    def __init__(self, shared, max_age: int):
        super().__init__(shared.data_dir)
        self.port = shared.port
        self.url = shared.url
        self.max_age = max_age

    def start(self) -> None:
        binary = os.environ.get("WARREN_BIN", os.path.join(conftest.ROOT, "target", "release", "warren"))
        env = dict(os.environ, WARREN_API_KEY=conftest.API_KEY, WARREN_LOG="info")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir,
             "--runtime", os.environ.get("WARREN_E2E_RUNTIME", "auto"), "--max-sandboxes", "40",
             "--signed-url-max-age", str(self.max_age)],
            env=env, stdout=self.log, stderr=self.log,
        )
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren serve exited with {self.proc.returncode}; see {self.data_dir}/serve.log")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError("warren serve --signed-url-max-age did not become healthy")


@pytest.fixture(scope="module")
def capped_server(server):
    server.stop()
    capped = CappedServer(server, MAX_AGE)
    try:
        capped.start()
        yield capped
    finally:
        capped.stop()
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

"""The v1 forms of the sandbox routes that older `e2b` SDKs (Python before 2.46, JS before the
v2 create) and the `e2b` CLI call, beside their v2 forms, and `timeout: 0`."""

from __future__ import annotations

import time

from e2b import Sandbox


def _wait_gone(api, sid: str) -> int:
    """The sandbox's status code once it is no longer running (bounded by the end's work)."""
    for _ in range(600):
        r = api.get(f"{api.base}/sandboxes/{sid}", timeout=30)
        if r.status_code == 404 or r.json().get("state") != "running":
            return r.status_code
        time.sleep(0.1)
    raise AssertionError(f"sandbox {sid} still running")


def test_v1_create_list_connect_refresh_and_timeout_zero(api):
    r = api.post(
        f"{api.base}/sandboxes",
        json={"templateID": "base", "timeout": 120, "secure": True, "metadata": {"v1": "yes"}},
        timeout=300,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    sid = body["sandboxID"]
    for field in ("clientID", "envdVersion", "envdAccessToken", "templateID"):
        assert field in body, field
    try:
        listed = api.get(f"{api.base}/sandboxes", params={"metadata": "v1=yes"}, timeout=30)
        assert listed.status_code == 200, listed.text
        assert [s["sandboxID"] for s in listed.json()] == [sid]
        assert api.get(f"{api.base}/sandboxes", params={"metadata": "v1=no"}, timeout=30).json() == []

        c = api.post(f"{api.base}/sandboxes/{sid}/connect", json={"timeout": 200}, timeout=60)
        assert c.status_code == 200, c.text
        assert c.json()["envdAccessToken"] == body["envdAccessToken"]
        sbx = Sandbox.connect(sid)
        assert sbx.commands.run("echo v1").stdout == "v1\n"

        before = api.get(f"{api.base}/sandboxes/{sid}", timeout=30).json()["endAt"]
        f = api.post(f"{api.base}/sandboxes/{sid}/refreshes", json={"duration": 3000}, timeout=30)
        assert f.status_code == 204, f.text
        after = api.get(f"{api.base}/sandboxes/{sid}", timeout=30).json()["endAt"]
        assert after > before
        bad = api.post(f"{api.base}/sandboxes/{sid}/refreshes", json={"duration": "x"}, timeout=30)
        assert bad.status_code == 400 and "duration" in bad.text, bad.text

        # `timeout: 0` ends it now, as on E2B.
        t = api.post(f"{api.base}/sandboxes/{sid}/timeout", json={"timeout": 0}, timeout=30)
        assert t.status_code == 204, t.text
        assert _wait_gone(api, sid) == 404
        missing = api.post(f"{api.base}/sandboxes/{sid}/refreshes", json={}, timeout=30)
        assert missing.status_code == 404, missing.text
    finally:
        api.delete(f"{api.base}/sandboxes/{sid}", timeout=60)


def test_v1_resume_resumes_a_paused_sandbox_and_refuses_a_running_one(api):
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        r = api.post(f"{api.base}/sandboxes/{sbx.sandbox_id}/resume", json={}, timeout=60)
        assert r.status_code == 409 and "already running" in r.text, r.text
        p = api.post(f"{api.base}/sandboxes/{sbx.sandbox_id}/pause", json={}, timeout=600)
        assert p.status_code == 204, p.text
        # Only a running sandbox has a timeout to set; SDK 2.0's connect resumes when this fails.
        t = api.post(f"{api.base}/sandboxes/{sbx.sandbox_id}/timeout", json={"timeout": 30}, timeout=30)
        assert t.status_code == 404 and "paused" in t.text, t.text
        r = api.post(
            f"{api.base}/sandboxes/{sbx.sandbox_id}/resume",
            json={"timeout": 120, "autoPause": False},
            timeout=600,
        )
        assert r.status_code == 201, r.text
        assert r.json()["sandboxID"] == sbx.sandbox_id
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.files.read("/home/user/kept.txt") == "kept"
        gone = api.post(f"{api.base}/sandboxes/nosuchsandbox/resume", json={}, timeout=30)
        assert gone.status_code == 404, gone.text
    finally:
        sbx.kill()

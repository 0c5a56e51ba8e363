"""Bad input gets clear JSON errors and changes nothing."""

from __future__ import annotations

import pytest
import requests


def _err(resp, status):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["code"] == status and body["message"]
    return body


def _count(api):
    return len(api.get(api.base + "/v2/sandboxes").json())


def test_malformed_and_wrong_types(api):
    before = _count(api)
    hdr = {"content-type": "application/json"}
    _err(api.post(api.base + "/v2/sandboxes", data="{nope", headers=hdr), 400)
    _err(api.post(api.base + "/v2/sandboxes", data='{"templateID": 1}', headers=hdr), 400)
    # Every time: the answer must arrive even though the server refuses before using the body.
    for _ in range(20):
        _err(api.post(api.base + "/v2/sandboxes", data="x" * (2 << 20), headers=hdr), 413)
    assert _count(api) == before


@pytest.mark.parametrize("timeout", [-1, 0, 10**9])
def test_bad_timeouts(api, timeout):
    before = _count(api)
    _err(api.post(api.base + "/v2/sandboxes", json={"templateID": "base", "timeout": timeout}), 400)
    # `0` is valid for set_timeout (it ends the sandbox now, as on E2B): the sandbox is unknown.
    _err(
        api.post(api.base + "/sandboxes/nosuchsandbox/timeout", json={"timeout": timeout}),
        404 if timeout == 0 else 400,
    )
    assert _count(api) == before


def test_unknown_template_and_ids(api):
    _err(api.post(api.base + "/v2/sandboxes", json={"templateID": "no-such-template"}), 404)
    _err(api.get(api.base + "/sandboxes/nosuchsandbox"), 404)
    _err(api.delete(api.base + "/sandboxes/nosuchsandbox"), 404)
    r = requests.get(api.base + "/health", headers={"E2b-Sandbox-Id": "nosuchsandbox"})
    assert r.status_code == 502 and "was not found" in r.json()["message"]


def test_missing_and_wrong_key(server):
    _err(requests.get(server.url + "/v2/sandboxes"), 401)
    _err(requests.get(server.url + "/v2/sandboxes", headers={"X-API-KEY": "wrong"}), 401)
    _err(requests.post(server.url + "/v2/sandboxes", json={"templateID": "base"}), 401)

"""Lifecycle webhooks (E2B's `/events/webhooks`): events a team subscribed to are POSTed to
its receiver with E2B's headers and signature, retried 10 s apart when the receiver fails (the
same delivery id each time), kept across a server restart until delivered, never sent to
internal addresses unless the operator allows it, and the secret is never shown or stored in
the clear."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import threading
import time

import pytest
from e2b import Sandbox

from support.warren import Server, same_on_every_runtime

LC = "sandbox.lifecycle."
SECRET = "whsec-test-0123456789"


class Receiver:
    """An HTTP receiver on loopback that records every request and fails the next `fail`."""

    def __init__(self):
        self.got: list[tuple[dict, bytes]] = []
        self.fail = 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.got.append((headers, body))
                code = 500 if outer.fail > 0 else 200
                outer.fail = max(0, outer.fail - 1)
                self.send_response(code)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def events(self, sandbox_id):
        return [(h, json.loads(b)) for h, b in self.got if json.loads(b)["sandboxId"] == sandbox_id]

    def wait(self, what, check, seconds=60.0):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        raise AssertionError(f"never saw {what}; got {[json.loads(b)['type'] for _, b in self.got]}")


@pytest.fixture
def private_ok(server):
    """The suite's server again, allowed to post to loopback (where the receiver is)."""
    server.stop()
    srv = Server(server.data_dir, server.extra_args + ("--webhooks-to-private-addresses",))
    srv.port, srv.url = server.port, server.url
    srv.start()
    yield srv
    srv.stop()
    server.start()


def _register(api, url, events, **more):
    r = api.post(api.base + "/events/webhooks",
                 json={"name": "test hook", "url": url, "enabled": True, "events": events,
                       "signatureSecret": SECRET, **more})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture(autouse=True)
def _ns_only():
    same_on_every_runtime("webhooks are control-plane logic")


def test_events_reach_the_receiver_signed(private_ok, api):
    rx = Receiver()
    hook = _register(api, rx.url, [LC + "created", LC + "killed"])
    try:
        assert "signatureSecret" not in hook and SECRET not in json.dumps(hook)
        assert hook["events"] == [LC + "created", LC + "killed"] and hook["enabled"] is True
        assert [h["id"] for h in api.get(api.base + "/events/webhooks").json()].count(hook["id"]) == 1
        assert api.get(api.base + f"/events/webhooks/{hook['id']}").json() == hook

        sbx = Sandbox.create(timeout=60)
        sbx.pause()  # not subscribed: never sent
        Sandbox.connect(sbx.sandbox_id)
        sbx.kill()
        rx.wait("created and killed", lambda: len(rx.events(sbx.sandbox_id)) >= 2)
        time.sleep(1)
        got = rx.events(sbx.sandbox_id)
        assert [e["type"] for _, e in got] == [LC + "created", LC + "killed"]
        raw = [b for h, b in rx.got if json.loads(b)["sandboxId"] == sbx.sandbox_id]
        for (headers, event), body in zip(got, raw):
            assert headers["e2b-webhook-id"] == hook["id"]
            assert headers["e2b-signature-version"] == "v1"
            want = base64.b64encode(hashlib.sha256(SECRET.encode() + body).digest()).decode().rstrip("=")
            assert headers["e2b-signature"] == want
            assert headers["e2b-delivery-id"]
            assert event["version"] == "v1" and event["sandboxTemplateId"] == "base"
        assert got[1][1]["eventData"]["execution"]["execution_time"] >= 0

        # Disabled: nothing more; deleted: gone.
        r = api.patch(api.base + f"/events/webhooks/{hook['id']}", json={"enabled": False})
        assert r.status_code == 200 and r.json()["enabled"] is False
        quiet = Sandbox.create(timeout=60)
        quiet.kill()
        time.sleep(2)
        assert rx.events(quiet.sandbox_id) == []
    finally:
        assert api.delete(api.base + f"/events/webhooks/{hook['id']}").status_code == 204
    assert api.get(api.base + f"/events/webhooks/{hook['id']}").status_code == 404
    # The secret is sealed in the store, never in the clear.
    with open(os.path.join(private_ok.data_dir, "warren.db"), "rb") as f:
        assert SECRET.encode() not in f.read()


def test_a_failing_receiver_gets_the_same_delivery_again(private_ok, api):
    rx = Receiver()
    hook = _register(api, rx.url, [LC + "created"])
    try:
        rx.fail = 2
        sbx = Sandbox.create(timeout=60)
        sbx.kill()
        rx.wait("three attempts", lambda: len(rx.events(sbx.sandbox_id)) >= 3, seconds=90)
        time.sleep(1)
        attempts = rx.events(sbx.sandbox_id)
        assert len(attempts) == 3, "two failures and the success; nothing after it"
        assert len({h["e2b-delivery-id"] for h, _ in attempts}) == 1

        # Pending deliveries outlive a restart: the receiver fails until the server is back.
        rx.fail = 1000
        again = Sandbox.create(timeout=60)
        again.kill()
        rx.wait("a first attempt", lambda: len(rx.events(again.sandbox_id)) >= 1)
        private_ok.stop()
        before = len(rx.events(again.sandbox_id))
        rx.fail = 0
        private_ok.start()
        rx.wait("the delivery again after the restart",
                lambda: len(rx.events(again.sandbox_id)) > before, seconds=60)
        ids = {h["e2b-delivery-id"] for h, _ in rx.events(again.sandbox_id)}
        assert len(ids) == 1, "one delivery, tried again"
    finally:
        api.delete(api.base + f"/events/webhooks/{hook['id']}")


def test_internal_receivers_are_refused_by_default(server, api):
    rx = Receiver()
    hook = _register(api, rx.url, [LC + "created"])
    try:
        sbx = Sandbox.create(timeout=60)
        sbx.kill()
        time.sleep(3)
        assert rx.got == [], "the server posted to loopback"
    finally:
        api.delete(api.base + f"/events/webhooks/{hook['id']}")


def test_bad_webhooks_say_what_is_wrong(server, api):
    ok = {"url": "https://hooks.example.test/x", "events": [LC + "killed"], "signatureSecret": SECRET}
    for change, words in [
        ({"url": "ftp://x"}, "http"),
        ({"events": ["sandbox.lifecycle.exploded"]}, "unknown event type"),
        ({"events": []}, "at least one"),
        ({"signatureSecret": "short"}, "signatureSecret"),
        ({"colour": "blue"}, "colour"),
    ]:
        r = api.post(api.base + "/events/webhooks", json={**ok, **change})
        assert r.status_code == 400 and words in r.json()["message"], (change, r.text)
    r = api.post(api.base + "/events/webhooks", json={"url": ok["url"], "events": ok["events"]})
    assert r.status_code == 400 and "signatureSecret" in r.json()["message"]
    assert api.patch(api.base + "/events/webhooks/nosuchhook", json={"enabled": False}).status_code == 404

"""Lifecycle events (E2B's `GET /events/sandboxes[/{id}]`) recorded by every change of a
sandbox's life the control plane makes, filtered and paged as E2B's API does, kept after the
sandbox ends and across a server restart."""

from __future__ import annotations

import datetime

import pytest
from e2b import Sandbox

from conftest import same_on_every_runtime

LC = "sandbox.lifecycle."


def _events(api, sandbox_id=None, **params):
    path = f"/events/sandboxes/{sandbox_id}" if sandbox_id else "/events/sandboxes"
    r = api.get(api.base + path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(autouse=True)
def _ns_only():
    same_on_every_runtime("lifecycle events are recorded by the control plane")


def test_a_sandboxes_life_is_recorded_in_order(server, api):
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    sbx.set_timeout(300)
    snap = sbx.create_snapshot()
    assert sbx.pause() is True
    Sandbox.connect(sid)
    sbx.kill()
    try:
        got = _events(api, sid, orderAsc="true", limit=100)
        kinds = [e["type"] for e in got]
        assert kinds == [LC + k for k in ("created", "updated", "checkpointed", "paused", "resumed", "killed")], kinds
        for e in got:
            assert e["version"] == "v1" and e["sandboxId"] == sid and e["sandboxTemplateId"] == "base"
            assert e["sandboxTeamId"] and e["id"]
            datetime.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
        stamps = [e["timestamp"] for e in got]
        assert stamps == sorted(stamps)
        by_kind = {e["type"]: e for e in got}
        end = datetime.datetime.fromisoformat(by_kind[LC + "updated"]["eventData"]["set_timeout"].replace("Z", "+00:00"))
        assert end > datetime.datetime.now(datetime.timezone.utc), "the new end time"
        assert by_kind[LC + "checkpointed"]["eventData"]["snapshot_id"] == snap.snapshot_id
        execution = by_kind[LC + "killed"]["eventData"]["execution"]
        assert execution["execution_time"] >= 0 and execution["vcpu_count"] >= 1 and execution["memory_mb"] > 0

        # Newest first by default; limit and offset page; types filter.
        newest = _events(api, sid)
        assert [e["id"] for e in newest] == [e["id"] for e in reversed(got)]
        page = _events(api, sid, limit=2, offset=1)
        assert [e["id"] for e in page] == [e["id"] for e in reversed(got)][1:3]
        only = _events(api, sid, types=[LC + "paused", LC + "killed"], orderAsc="true")
        assert [e["type"] for e in only] == [LC + "paused", LC + "killed"]
        # The team's stream has them too.
        assert any(e["sandboxId"] == sid for e in _events(api, limit=100))
    finally:
        Sandbox.delete_snapshot(snap.snapshot_id)


def test_events_outlive_the_server(server, api):
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    sbx.kill()
    before = _events(api, sid, orderAsc="true")
    server.restart()
    assert _events(api, sid, orderAsc="true") == before
    assert [e["type"] for e in before] == [LC + "created", LC + "killed"]


def test_bad_queries_say_what_is_wrong(server, api):
    for params, words in [
        ({"types": "sandbox.lifecycle.exploded"}, "unknown event type"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"offset": "-1"}, "offset"),
        ({"orderAsc": "sometimes"}, "orderAsc"),
    ]:
        r = api.get(api.base + "/events/sandboxes", params=params)
        assert r.status_code == 400 and words in r.json()["message"], (params, r.text)
    assert api.get(api.base + "/events/sandboxes/nosuchsandbox").json() == []

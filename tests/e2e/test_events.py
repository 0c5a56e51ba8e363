"""Lifecycle events (E2B's `GET /events/sandboxes[/{id}]`) recorded by every change of a
sandbox's life the control plane makes, filtered and paged as E2B's API does, kept after the
sandbox ends and across a server restart."""

from __future__ import annotations

import datetime

import pytest
from e2b import Sandbox

from support.warren import same_on_every_runtime

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


def _sse(api, params, want, seconds=60):
    """Reads the event stream until `want` events arrived: (event type, parsed data) each."""
    import json
    import threading

    got, done = [], threading.Event()
    r = api.get(api.base + "/events/sandboxes/stream", params=params, stream=True, timeout=seconds)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")

    def read():
        kind = None
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                got.append((kind, json.loads(line.split(":", 1)[1])))
                if len(got) >= want:
                    break
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return r, got, done


def test_events_stream_live_and_replay_from_a_time(server, api):
    started_ms = int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000) - 1000
    r, got, done = _sse(api, {"types": [LC + "created", LC + "killed"]}, want=2)
    try:
        sbx = Sandbox.create(timeout=120)
        sid = sbx.sandbox_id
        sbx.set_timeout(300)  # an `updated` event, filtered out
        sbx.kill()
        assert done.wait(30), f"stream got only {got}"
    finally:
        r.close()
    mine = [(k, d) for k, d in got if d["sandboxId"] == sid]
    assert [k for k, _ in mine] == [LC + "created", LC + "killed"], got
    assert all(d["type"] == k and d["version"] == "v1" for k, d in mine)

    # A reader that comes later replays what was kept since a time, for one sandbox.
    r, again, done = _sse(api, {"since": started_ms, "sandboxID": sid}, want=3)
    try:
        assert done.wait(30), f"replay got only {again}"
    finally:
        r.close()
    assert [k for k, _ in again] == [LC + "created", LC + "updated", LC + "killed"], again
    assert {d["sandboxId"] for _, d in again} == {sid}

    bad = api.get(api.base + "/events/sandboxes/stream", params={"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()["message"]
    assert api.get(api.base + "/events/sandboxes/stream", params={"types": "sandbox.exploded"}).status_code == 400

"""Threat model W3-M2: one sandbox running `/bin/true` in a loop used to write every execution
into the store (~21 GB a day). Now a sandbox's audit entries are kept at its budget (default:
a burst of 1000, then 10 a second) and the rest is summed up in `audit.dropped` entries, and
below the data disk's free-space floor (`--audit-min-free-mb`) nothing more is stored."""

from __future__ import annotations

import time

import pytest
import requests
from e2b import Sandbox

import conftest
from support.warren import API_KEY

# The defaults of `warren serve` (`AuditBudget::default()`).
BURST, RATE = 1000, 10
LOOPS = 3000
FLOOD = f"i=0; while [ $i -lt {LOOPS} ]; do /bin/true; i=$((i+1)); done"


def trail(server, sandbox_id: str, kind: str) -> list[dict]:
    r = requests.get(
        f"{server.url}/v1/sandboxes/{sandbox_id}/audit",
        params={"kind": kind, "limit": 10000},
        headers={"X-API-KEY": API_KEY},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return body["entries"] if isinstance(body, dict) else body


def test_an_exec_flood_is_kept_at_the_budget_and_summed_up(server):
    sbx = Sandbox.create(timeout=300, request_timeout=300)
    started = time.monotonic()
    try:
        sbx.commands.run(FLOOD, timeout=240)
    finally:
        sbx.kill()
    took = time.monotonic() - started
    entries = trail(server, sbx.sandbox_id, "process,audit")
    kept = [e for e in entries if e["kind"].startswith("process.")]
    summaries = [e for e in entries if e["kind"].startswith("audit.")]
    # Bounded: the burst, then the rate, whatever the loop ran.
    assert len(kept) <= BURST + RATE * (took + 10), f"{len(kept)} process entries in {took:.0f}s"
    # And not silent: the summaries count what was left out, by kind.
    assert summaries, "no audit.dropped entry for a flood"
    assert all(s["kind"] == "audit.dropped" for s in summaries), summaries
    left_out_execs = sum(
        int(n)
        for s in summaries
        for part in s["fields"].get("kinds", "").split(",")
        if part.startswith("process.exec:")
        for n in [part.rsplit(":", 1)[1]]
    )
    lost = sum(int(s["fields"].get("lost_before_read", 0)) for s in summaries)
    kept_execs = sum(1 for e in kept if e["kind"] == "process.exec")
    assert kept_execs + left_out_execs + lost >= LOOPS, (kept_execs, left_out_execs, lost)


@pytest.fixture
def floored_server(server):
    """The shared server's data dir and port, started with a free-space floor no disk is
    above: the trail must store nothing more."""
    with conftest.restarted_with(server, "--audit-min-free-mb", str(1 << 40)) as srv:
        yield srv


def test_below_the_free_space_floor_the_trail_stores_nothing(floored_server):
    sbx = Sandbox.create(timeout=120, request_timeout=300)
    try:
        sbx.commands.run("for i in 1 2 3 4 5; do /bin/true; done; echo done", timeout=60)
        # Reading the trail reads the sandbox's journals: nothing of them is stored.
        assert trail(floored_server, sbx.sandbox_id, "process,audit") == []
    finally:
        sbx.kill()
    # Nor at the kill's last read: only the lifecycle (its own table) is there.
    kept = trail(floored_server, sbx.sandbox_id, "process,audit,lifecycle")
    assert kept and all(e["kind"].startswith("lifecycle.") for e in kept), kept

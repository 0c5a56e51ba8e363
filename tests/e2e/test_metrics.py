"""Sandbox metrics through the unmodified E2B SDK: the sandbox's own CPU count, memory limit and
disk (not the host's), a series sampled while it runs that `start`/`end` narrow, load the test
generates seen in it, and the many-sandbox form `GET /sandboxes/metrics`."""

from __future__ import annotations

import datetime
import os
import subprocess
import time

import pytest
import requests
from e2b import Sandbox

from support.warren import API_KEY, Server, warren_bin

MIB = 1024 * 1024
UTC = datetime.timezone.utc


def _host_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def _until(what: str, check, seconds: float = 60.0):
    """Polls `check` until it returns something true (the sampler takes a point every 5 s);
    fails naming `what` when it never does."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"never saw {what}")


def test_metrics_report_the_sandboxes_own_limits_and_its_load(server):
    sbx = Sandbox.create(timeout=300)
    try:
        info = Sandbox.get_info(sbx.sandbox_id)
        first = _until("a first sample", sbx.get_metrics)
        m = first[-1]
        assert m.cpu_count == info.cpu_count, (m, info)
        assert m.mem_total == info.memory_mb * MIB, "the sandbox's memory limit, not the host's"
        assert m.mem_total < _host_memory()
        disk_mb = requests.get(f"{server.url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": API_KEY},
                               timeout=10).json()["diskSizeMB"]
        assert 0 < m.disk_total <= disk_mb * MIB, (m, disk_mb)
        assert 0 <= m.mem_used <= m.mem_total and 0 <= m.disk_used <= m.disk_total

        # A memory hog of 200 MiB shows in the sandbox's used memory.
        sbx.commands.run(
            "python3 -c 'import time; b = bytearray(200 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(60)'",
            background=True,
        )
        _until("the hog's memory", lambda: any(p.mem_used > 150 * MIB for p in sbx.get_metrics()))

        # One busy CPU: a sample covering the burn reports a large share of the sandbox's CPUs.
        sbx.commands.run("timeout 30 sh -c 'while :; do :; done'", background=True)
        _until(
            "the burner's CPU share",
            lambda: any(p.cpu_used_pct > 100 / (2 * m.cpu_count) for p in sbx.get_metrics()),
        )

        # The series grows while the sandbox runs, oldest first.
        series = _until("several samples", lambda: (lambda s: s if len(s) >= 3 else None)(sbx.get_metrics()))
        stamps = [p.timestamp for p in series]
        assert stamps == sorted(stamps)
    finally:
        sbx.kill()


def test_start_and_end_narrow_the_series(server, api):
    created = datetime.datetime.now(UTC)
    sbx = Sandbox.create(timeout=300)
    try:
        _until("three samples", lambda: len(sbx.get_metrics()) >= 3)
        series = sbx.get_metrics()
        middle = series[len(series) // 2].timestamp
        later = sbx.get_metrics(start=middle)
        assert later and all(p.timestamp >= middle - datetime.timedelta(seconds=1) for p in later)
        assert len(later) < len(sbx.get_metrics())
        earlier = sbx.get_metrics(end=middle)
        assert earlier and all(p.timestamp <= middle + datetime.timedelta(seconds=1) for p in earlier)
        # A window that ends before the sandbox existed is empty.
        assert sbx.get_metrics(start=created - datetime.timedelta(hours=2),
                               end=created - datetime.timedelta(hours=1)) == []

        base = f"{api.base}/sandboxes/{sbx.sandbox_id}/metrics"
        r = api.get(base, params={"start": 20, "end": 10})
        assert r.status_code == 400 and "Invalid time range" in r.json()["message"], r.text
        r = api.get(base, params={"start": "yesterday"})
        assert r.status_code == 400 and "unix seconds" in r.json()["message"], r.text
    finally:
        sbx.kill()


def test_many_sandboxes_at_once(server, api):
    a = Sandbox.create(timeout=120)
    b = Sandbox.create(timeout=120)
    try:
        _until("samples of both", lambda: a.get_metrics() and b.get_metrics())
        r = api.get(f"{api.base}/sandboxes/metrics",
                    params={"sandbox_ids": f"{a.sandbox_id},{b.sandbox_id},nosuchsandbox"})
        assert r.status_code == 200, r.text
        got = r.json()["sandboxes"]
        assert set(got) == {a.sandbox_id, b.sandbox_id}
        assert got[a.sandbox_id]["memTotal"] > 0 and "timestamp" in got[a.sandbox_id]
        r = api.get(f"{api.base}/sandboxes/metrics",
                    params={"sandbox_ids": ",".join(f"s{i}" for i in range(101))})
        assert r.status_code == 400 and "at most 100" in r.json()["message"], r.text
        # No key, no metrics.
        r = requests.get(f"{api.base}/sandboxes/metrics", params={"sandbox_ids": a.sandbox_id}, timeout=10)
        assert r.status_code == 401
    finally:
        a.kill()
        b.kill()


def _scrape(url: str, **headers) -> dict[str, float]:
    """`GET /metrics` parsed with the Prometheus project's own parser: sample name and labels
    -> value."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    r = requests.get(url + "/metrics", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_prometheus_sees_sandboxes_and_operations(server):
    runtime = os.environ.get("WARREN_E2E_RUNTIME", "ns")
    before = _scrape(server.url, **{"X-API-KEY": API_KEY})
    creates = before.get("warren_operation_duration_seconds_count{operation=create}", 0)
    execs = before.get("warren_operation_duration_seconds_count{operation=exec}", 0)
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("true")
        sbx.commands.run("true")
        try:
            Sandbox.create("no-such-template-here")
        except Exception:  # noqa: BLE001 - the failure is what is counted
            pass
        # A scraper sends the key as a bearer token.
        after = _scrape(server.url, Authorization=f"Bearer {API_KEY}")
        running = f"warren_sandboxes{{runtime={runtime},state=running,template=base}}"
        assert after.get(running, 0) >= 1, sorted(after)
        assert after["warren_operation_duration_seconds_count{operation=create}"] >= creates + 2
        assert after["warren_operation_errors_total{kind=not_found,operation=create}"] >= 1
        assert after["warren_sandbox_limit{}"] == 40
        assert after["warren_concurrent_sandboxes{}"] >= 1
        assert after["warren_operation_duration_seconds_count{operation=exec}"] >= execs + 2, "command starts"
        assert after["warren_network_slots{state=in_use}"] >= 1, "the sandbox's slot"
        assert after["warren_network_slot_target{}"] >= 0
        assert {"warren_network_slots{state=ready}", "warren_network_slots{state=creating}",
                "warren_network_slots{state=broken}"} <= set(after)
        assert not any(k.startswith("warren_sandbox_cpu_seconds") for k in after), "per-sandbox series are opt-in"
    finally:
        sbx.kill()
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 401
    assert requests.get(server.url + "/metrics", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401


def test_per_sandbox_series_when_asked(server):
    server.stop()
    srv = Server(server.data_dir, server.extra_args + ("--metrics-per-sandbox",))
    srv.port, srv.url = server.port, server.url
    srv.start()
    try:
        sbx = Sandbox.create(timeout=120)
        try:
            sbx.commands.run("timeout 3 sh -c 'while :; do :; done' || true")
            got = _scrape(srv.url, **{"X-API-KEY": API_KEY})
            labels = f"{{sandbox_id={sbx.sandbox_id},template=base}}"
            assert got[f"warren_sandbox_cpu_seconds{labels}"] > 1.0, "the burner's CPU time"
            assert got[f"warren_sandbox_memory_bytes{labels}"] > 0
        finally:
            sbx.kill()
        got = _scrape(srv.url, **{"X-API-KEY": API_KEY})
        assert not any(sbx.sandbox_id in k for k in got), "a killed sandbox's series go"
    finally:
        srv.stop()
        server.start()


def test_warren_top_shows_each_sandbox_and_its_use(server):
    binary = warren_bin()
    env = dict(os.environ, WARREN_API_KEY=API_KEY)
    busy = Sandbox.create(timeout=120)
    idle = Sandbox.create(timeout=120)
    try:
        busy.commands.run("timeout 60 sh -c 'while :; do :; done'", background=True)
        _until("a sample of the burner", lambda: any(p.cpu_used_pct > 20 for p in busy.get_metrics()))
        assert idle.get_metrics()
        out = subprocess.run([binary, "top", "--once", "--server", server.url], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "running" in lines[0] and "SANDBOX" in lines[2], out.stdout
        rows = {line.split()[0]: line.split() for line in lines[3:] if line.strip()}
        assert busy.sandbox_id in rows and idle.sandbox_id in rows, out.stdout
        ids = [line.split()[0] for line in lines[3:] if line.strip()]
        assert ids.index(busy.sandbox_id) < ids.index(idle.sandbox_id), "busiest first"
        row = rows[busy.sandbox_id]
        assert row[1] == "base" and row[2] == "running"
        used, limit = row[5].split("/")
        assert int(limit) == Sandbox.get_info(busy.sandbox_id).memory_mb and int(used) >= 0
    finally:
        busy.kill()
        idle.kill()


def _prepared(server) -> dict:
    """The server's sandboxes prepared ahead, from its Prometheus text."""
    text = requests.get(f"{server.url}/metrics", headers={"X-API-KEY": API_KEY}, timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith('warren_prepared_sandboxes{state="ready"}'):
            out["ready"] = int(float(line.split()[-1]))
        elif line.startswith("warren_prepared_sandbox_target "):
            out["target"] = int(float(line.split()[-1]))
        elif line.startswith("warren_prepared_sandbox_memory_bytes "):
            out["memory_bytes"] = int(float(line.split()[-1]))
    return out


def test_creates_claim_sandboxes_prepared_ahead(server):
    if os.environ.get("WARREN_E2E_RUNTIME", "ns") != "ns":
        pytest.skip("only the ns runtime prepares sandboxes ahead (the vm runtime keeps warm QEMUs)")
    Sandbox.create(timeout=120).kill()
    def ready():
        pool = _prepared(server)
        return pool if pool.get("ready", 0) >= 1 else None

    pool = _until("a sandbox prepared after a create", ready)
    assert pool["target"] >= 1 and pool["memory_bytes"] > 0, pool
    server.log.flush()
    with open(server.log.name, "rb") as f:
        f.seek(0, os.SEEK_END)
        offset = f.tell()
    sbx = Sandbox.create(envs={"FROM_CREATE": "yes"}, timeout=120)
    try:
        out = sbx.commands.run("hostname; echo $FROM_CREATE; echo $E2B_SANDBOX_ID").stdout.split()
        assert out == [sbx.sandbox_id, "yes", sbx.sandbox_id]
        with open(server.log.name, "rb") as f:
            f.seek(offset)
            claimed = [line for line in f.read().decode(errors="replace").splitlines()
                       if "prepared sandbox claimed" in line]
        assert any(sbx.sandbox_id in line for line in claimed), claimed
        info = Sandbox.get_info(sbx.sandbox_id)
        m = _until("a first sample", sbx.get_metrics)[-1]
        assert m.mem_total == info.memory_mb * MIB, "the create's memory limit, applied at the claim"
    finally:
        sbx.kill()

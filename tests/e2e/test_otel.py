"""OpenTelemetry export (`warren serve --otlp-endpoint`): a small OTLP/HTTP collector on
loopback (requests decoded with the opentelemetry-proto package) receives the server's spans,
metrics and logs. A create sent with a W3C `traceparent` is a server span under the caller's
span, with the operation and its stages below it; a command started with one prints a
`$TRACEPARENT` of the caller's trace whose span is an exported `sandbox.exec`, child of the
caller's span. The standard OTEL_* variables are honoured (service name, headers)."""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import os
import secrets
import subprocess
import tempfile
import threading
import time

import pytest
import requests
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from support.warren import API_KEY, Server, same_on_every_runtime, warren_bin

WARREN = warren_bin()
SERVICE = "warren-e2e-otel"
SPAN_KIND_SERVER = 2


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attrs(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


class Collector:
    """OTLP/HTTP with protobuf bodies, as the specification has it: POST /v1/traces,
    /v1/metrics, /v1/logs, answered with the (empty) export responses."""

    REQUESTS = {
        "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest,
                       trace_service_pb2.ExportTraceServiceResponse),
        "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest,
                        metrics_service_pb2.ExportMetricsServiceResponse),
        "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest,
                     logs_service_pb2.ExportLogsServiceResponse),
    }

    def __init__(self):
        self.lock = threading.Lock()
        self.spans: list[dict] = []
        self.metrics: list[dict] = []
        self.logs: list[dict] = []
        self.headers: list[dict] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                kinds = Collector.REQUESTS.get(self.path)
                if kinds is None or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404 if kinds is None else 415)
                    self.end_headers()
                    return
                collector.take(self.path, kinds[0].FromString(body), dict(self.headers))
                out = kinds[1]().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def take(self, path: str, req, headers: dict) -> None:
        with self.lock:
            self.headers.append({k.lower(): v for k, v in headers.items()})
            if path == "/v1/traces":
                for rs in req.resource_spans:
                    resource = _attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            self.spans.append(dict(
                                name=s.name, kind=s.kind, trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(), parent=s.parent_span_id.hex(),
                                start=s.start_time_unix_nano, end=s.end_time_unix_nano,
                                attrs=_attrs(s.attributes), resource=resource,
                                error=s.status.code == 2))
            elif path == "/v1/metrics":
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            kind = m.WhichOneof("data")
                            points = [dict(attrs=_attrs(p.attributes),
                                           value=getattr(p, "count", None) if kind == "histogram"
                                           else getattr(p, p.WhichOneof("value")))
                                      for p in getattr(m, kind).data_points]
                            self.metrics.append(dict(name=m.name, kind=kind, unit=m.unit, points=points))
            else:
                for rl in req.resource_logs:
                    resource = _attrs(rl.resource.attributes)
                    for sl in rl.scope_logs:
                        for r in sl.log_records:
                            self.logs.append(dict(body=_value(r.body), attrs=_attrs(r.attributes),
                                                  trace_id=r.trace_id.hex(), span_id=r.span_id.hex(),
                                                  severity=r.severity_text, scope=sl.scope.name,
                                                  resource=resource))

    def wait(self, what: str, pred, seconds: float = 30):
        deadline = time.monotonic() + seconds
        while True:
            with self.lock:
                got = pred(self)
            if got:
                return got
            if time.monotonic() > deadline:
                with self.lock:
                    names = sorted({s["name"] for s in self.spans})
                    metrics = sorted({m["name"] for m in self.metrics})
                pytest.fail(f"the collector never got {what} (spans: {names}; metrics: {metrics}; "
                            f"{len(self.logs)} log records)")
            time.sleep(0.2)

    def trace(self, trace_id: str) -> list[dict]:
        return [s for s in self.spans if s["trace_id"] == trace_id]

    def stop(self):
        self.httpd.shutdown()


@pytest.fixture(scope="module")
def otel(server):
    """The suite's server again, exporting to a collector of this module (its batches sent
    every 200 ms and its metrics every second, so the test need not wait long)."""
    same_on_every_runtime("export is control-plane code; the runtimes only add stage spans")
    collector = Collector()
    settings = {
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20otel-test",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_BLRP_SCHEDULE_DELAY": "200",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    server.stop()
    srv = Server(server.data_dir, server.extra_args + ("--otlp-endpoint", collector.url))
    srv.port, srv.url = server.port, server.url
    try:
        srv.start()
        yield srv, collector
    finally:
        srv.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        collector.stop()
        server.start()


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _create(srv, traceparent: str | None = None) -> dict:
    headers = {"X-API-KEY": API_KEY}
    if traceparent:
        headers["traceparent"] = traceparent
    r = requests.post(srv.url + "/v2/sandboxes", json={"templateID": "base", "timeout": 120},
                      headers=headers, timeout=120)
    assert r.status_code == 201, r.text
    return r.json()


def _kill(srv, sid: str, traceparent: str | None = None) -> None:
    headers = {"X-API-KEY": API_KEY}
    if traceparent:
        headers["traceparent"] = traceparent
    assert requests.delete(f"{srv.url}/sandboxes/{sid}", headers=headers, timeout=60).status_code == 204


def _envelope(msg: dict) -> bytes:
    body = json.dumps(msg).encode()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def _run_traced(srv, created: dict, command: str, traceparent: str) -> tuple[str, dict]:
    """Starts `command` through the proxy with envd's `process.Start` (Connect, JSON
    envelopes), as an instrumented agent framework would, with `traceparent`; its stdout and
    end event."""
    r = requests.post(
        srv.url + "/process.Process/Start",
        data=_envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}}),
        headers={
            "E2b-Sandbox-Id": created["sandboxID"],
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": created["envdAccessToken"],
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "traceparent": traceparent,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out, end, data = b"", None, r.content
    while data:
        flags, n = data[0], int.from_bytes(data[1:5], "big")
        msg, data = json.loads(data[5:5 + n] or b"{}"), data[5 + n:]
        if flags & 0x02:
            assert "error" not in msg, msg
            continue
        event = msg.get("event", {})
        if "data" in event and "stdout" in event["data"]:
            out += base64.b64decode(event["data"]["stdout"])
        if "end" in event:
            end = event["end"]
    assert end is not None, "the command's end event"
    return out.decode(), end


def _children(spans: list[dict], parent: dict) -> list[dict]:
    return [s for s in spans if s["parent"] == parent["span_id"]]


def _descendants(spans: list[dict], root: dict) -> list[dict]:
    out, todo = [], [root]
    while todo:
        kids = _children(spans, todo.pop())
        out += kids
        todo += kids
    return out


def test_a_traced_create_is_a_server_span_with_its_stages(otel):
    srv, col = otel
    trace_id, caller, tp = _traceparent()
    created = _create(srv, tp)
    sid = created["sandboxID"]
    _kill(srv, sid, tp)

    def complete(c):
        spans = c.trace(trace_id)
        names = {s["name"] for s in spans}
        need = {"POST /v2/sandboxes", "sandbox.create", "runtime.create", "agent.init",
                "DELETE /sandboxes/{sandbox_id}", "sandbox.kill", "runtime.kill"}
        return spans if need <= names else None

    spans = col.wait("the create's and the kill's spans", complete)
    by_name = {s["name"]: s for s in spans}
    server = by_name["POST /v2/sandboxes"]
    assert server["parent"] == caller, "the caller's span is the request's parent"
    assert server["kind"] == SPAN_KIND_SERVER
    assert server["attrs"]["http.request.method"] == "POST"
    assert server["attrs"]["http.route"] == "/v2/sandboxes"
    assert server["attrs"]["http.response.status_code"] == 201
    assert server["resource"]["service.name"] == SERVICE

    create = by_name["sandbox.create"]
    assert create["parent"] == server["span_id"]
    assert create["attrs"]["warren.operation"] == "create"
    assert create["attrs"]["warren.sandbox.id"] == sid
    stage = by_name["runtime.create"]
    assert stage["parent"] == create["span_id"]
    assert stage["attrs"]["warren.runtime"] == os.environ.get("WARREN_E2E_RUNTIME", "ns")
    below = {s["name"] for s in _descendants(spans, stage)}
    assert {"agent.init", "network.slot.acquire"} <= below, below
    for s in [server, create, stage, *_descendants(spans, stage)]:
        assert server["start"] <= s["start"] <= s["end"] <= server["end"], s["name"]

    kill = by_name["sandbox.kill"]
    assert kill["parent"] == by_name["DELETE /sandboxes/{sandbox_id}"]["span_id"]
    assert _children(spans, kill)[0]["name"] == "runtime.kill"

    # The server's log events carry the trace of the span they happened in.
    running = col.wait("the create's log record", lambda c: [
        r for r in c.logs if r["body"] == "sandbox running" and r["trace_id"] == trace_id])
    assert running[0]["attrs"]["sandbox_id"] == sid
    assert running[0]["span_id"] == create["span_id"]
    # OTEL_EXPORTER_OTLP_HEADERS, percent-decoded as the specification says.
    assert all(h.get("authorization") == "Bearer otel-test" for h in col.headers)


def test_an_untraced_request_is_a_root_span_and_failures_are_marked(otel):
    srv, col = otel
    r = requests.post(srv.url + "/v2/sandboxes", json={"templateID": "no-such-template-otel"},
                      headers={"X-API-KEY": API_KEY}, timeout=30)
    assert r.status_code == 404, r.text
    spans = col.wait("the failed create", lambda c: [
        s for s in c.spans if s["name"] == "sandbox.create" and s["error"]])
    create = spans[-1]
    assert create["attrs"]["error.type"] == "not_found"
    request = [s for s in col.trace(create["trace_id"]) if s["span_id"] == create["parent"]]
    assert request and request[0]["name"] == "POST /v2/sandboxes"
    assert request[0]["parent"] == "", "no traceparent: the request is a root"
    assert request[0]["attrs"]["http.response.status_code"] == 404


def test_a_command_with_a_traceparent_is_an_exec_span_of_the_callers_trace(otel):
    srv, col = otel
    created = _create(srv)
    sid = created["sandboxID"]
    try:
        trace_id, tool_span, tp = _traceparent()
        out, end = _run_traced(srv, created, "echo $TRACEPARENT", tp)
        assert end.get("exitCode", 0) == 0, end
        version, seen_trace, exec_span, flags = out.strip().split("-")
        assert (version, seen_trace, flags) == ("00", trace_id, "01"), out
        assert exec_span != tool_span and len(exec_span) == 16

        spans = col.wait("the exec span", lambda c: [
            s for s in c.spans if s["name"] == "sandbox.exec" and s["span_id"] == exec_span])
        s = spans[0]
        assert s["trace_id"] == trace_id
        assert s["parent"] == tool_span, "the agent framework's tool span is the exec's parent"
        assert s["attrs"]["warren.sandbox.id"] == sid
        assert s["attrs"]["process.exit.code"] == 0
        assert s["attrs"]["process.pid"] > 0
        assert s["attrs"]["process.command_args"] == ["/bin/bash", "-l", "-c", "echo $TRACEPARENT"]
        assert s["start"] <= s["end"]
        # The proxy's span of the traced request is in the same trace, also the caller's child.
        proxied = col.wait("the proxy's span", lambda c: [
            p for p in c.trace(trace_id) if p["name"] == "sandbox.proxy"])
        assert proxied[0]["parent"] == tool_span
        assert proxied[0]["attrs"]["warren.sandbox.id"] == sid
        # The audit entries are log records; the command's end carries its trace.
        ended = col.wait("the command's audit record", lambda c: [
            r for r in c.logs if r["attrs"].get("event.name") == "process.end"
            and r["trace_id"] == trace_id])
        assert ended[0]["attrs"]["warren.sandbox.id"] == sid
        assert ended[0]["span_id"] == exec_span
    finally:
        _kill(srv, sid)


def test_metrics_arrive(otel):
    srv, col = otel
    created = _create(srv)
    try:
        def sandboxes(c):
            return [p for m in c.metrics if m["name"] == "warren.sandboxes" for p in m["points"]
                    if p["attrs"].get("warren.sandbox.state") == "running" and p["value"] >= 1]

        points = col.wait("a running sandbox counted", sandboxes)
        assert points[-1]["attrs"]["warren.sandbox.template"] == "base"

        def creates(c):
            return [m for m in c.metrics if m["name"] == "warren.operation.duration"
                    and any(p["attrs"].get("warren.operation") == "create" and p["value"] >= 1
                            for p in m["points"])]

        hist = col.wait("the create latency histogram", creates)[-1]
        assert hist["kind"] == "histogram" and hist["unit"] == "s"
        names = {m["name"] for m in col.metrics}
        assert {"warren.sandboxes.live", "warren.sandboxes.limit"} <= names, names
    finally:
        _kill(srv, created["sandboxID"])


def test_a_bad_endpoint_is_refused_at_start():
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([WARREN, "serve", "--data-dir", d, "--listen", "127.0.0.1:0",
                            "--otlp-endpoint", "grpc://127.0.0.1:4317"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "must start with http:// or https://" in r.stderr, r.stderr

"""The sandbox-wide variables the service reads from the agent's GET /envs."""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
pytest.importorskip("jupyter_client", reason="jupyter_client is not installed (the image has it)")

from warren_interp import contexts  # noqa: E402


def _agent(body):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = body.encode()
            self.send_response(200 if self.path == "/envs" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_variables_come_from_the_agent_and_bad_names_are_dropped(monkeypatch):
    srv = _agent(json.dumps({"A_VAR": "1", "E2B_SANDBOX_ID": "sbx", "bad-name": "x", "N": 3}))
    try:
        monkeypatch.setattr(contexts, "AGENT_ENVS_URL", f"http://127.0.0.1:{srv.server_port}/envs")
        assert contexts.sandbox_env() == {"A_VAR": "1", "E2B_SANDBOX_ID": "sbx"}
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_agent_that_cannot_answer_gives_nothing(monkeypatch):
    srv = _agent("not json")
    try:
        monkeypatch.setattr(contexts, "AGENT_ENVS_URL", f"http://127.0.0.1:{srv.server_port}/envs")
        assert contexts.sandbox_env() == {}
    finally:
        srv.shutdown()
        srv.server_close()
    monkeypatch.setattr(contexts, "AGENT_ENVS_URL", f"http://127.0.0.1:{srv.server_port}/envs")
    assert contexts.sandbox_env() == {}


def test_sandbox_variables_are_set_for_good_and_a_new_sandbox_reseeds(monkeypatch):
    ctx = contexts.Context("python", "/tmp")
    code = ctx._sandbox_env_code({"A": "it's"}, reseed=True)
    ns = {}
    monkeypatch.delenv("A", raising=False)
    import random

    random.seed(1)
    before = random.random()
    random.seed(1)
    exec(code, ns)
    assert os.environ["A"] == "it's"
    # Reseeded from the kernel's pool: not the sequence seed 1 gives.
    assert random.random() != before
    # Nothing of ours is left in the user's namespace.
    assert [k for k in ns if k != "__builtins__"] == []
    bash = contexts.Context("bash", "/tmp")._sandbox_env_code({"A": "it's"}, reseed=False)
    assert bash == "export A='it'\\''s'"

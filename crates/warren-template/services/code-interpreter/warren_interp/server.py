"""HTTP front end of the code interpreter (E2B code-interpreter protocol, port 49999).

Standard library only: a threading HTTP/1.1 server, one thread per request. An execution
streams its lines as chunks the moment the kernel produces them, and checks between messages
whether the client has gone (the socket reads EOF) so it can interrupt the kernel at once
instead of at the next keepalive.

Routes (see docs/code-interpreter.md):
  GET    /health                 "OK"
  POST   /execute                {"code", "context_id"?, "language"?, "env_vars"?} -> JSON lines
  POST   /contexts               {"language"?, "cwd"?} -> {"id", "language", "cwd"}
  GET    /contexts               [{"id", "language", "cwd"}, ...]
  DELETE /contexts/<id>          null
  POST   /contexts/<id>/restart  null
"""

import json
import os
import select
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from . import contexts

REGISTRY = contexts.Registry()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "warren-interp/1"

    def setup(self):
        super().setup()
        # Lines are small writes; without this, Nagle's algorithm holds each one back until
        # the previous is acknowledged, and delayed ACKs turn that into ~40 ms per execution.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):  # one line per request on stderr (the log file)
        sys.stderr.write("%s %s\n" % (self.command, fmt % args))

    # --- helpers --------------------------------------------------------------------------

    def _path(self):
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("the request body must be a JSON object")
        return value

    def _send(self, status, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status, value):
        self._send(status, json.dumps(value))

    def _text(self, status, text):
        self._send(status, text, "text/plain; charset=utf-8")

    def _client_gone(self):
        """True once the client closed its side (EOF on a readable socket)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # --- routes ---------------------------------------------------------------------------

    def do_GET(self):
        path = self._path()
        if path == "/health":
            return self._json(200, "OK")
        if path == "/contexts":
            return self._json(200, REGISTRY.list())
        self._text(404, "Not found")

    def do_DELETE(self):
        parts = self._path().strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":
            if REGISTRY.remove(parts[1]):
                return self._json(200, None)
            return self._text(404, f"Context {parts[1]} not found")
        self._text(404, "Not found")

    def do_POST(self):
        try:
            body = self._body()
        except ValueError as e:
            return self._text(400, f"Invalid request body: {e}")
        parts = self._path().strip("/").split("/")
        try:
            if parts == ["execute"]:
                return self._execute(body)
            if parts == ["contexts"]:
                ctx = REGISTRY.create(body.get("language"), body.get("cwd"))
                return self._json(200, ctx.describe())
            if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
                ctx = REGISTRY.get(parts[1])
                if ctx is None:
                    return self._text(404, f"Context {parts[1]} not found")
                with ctx.lock:
                    ctx.restart()
                return self._json(200, None)
        except contexts.UnsupportedLanguage as e:
            return self._text(400, str(e))
        except Exception as e:  # kernel failed to start, and the like
            return self._text(500, f"{type(e).__name__}: {e}")
        self._text(404, "Not found")

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self._text(400, "The field 'code' (a string) is required")
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            return self._text(400, "Only one of context_id or language can be provided")
        if context_id:
            ctx = REGISTRY.get(context_id)
            if ctx is None:
                return self._text(404, f"Context {context_id} not found")
        else:
            ctx = REGISTRY.default_for(language)
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict):
            return self._text(400, "The field 'env_vars' must be an object")

        # Queue behind a running execution of the same context; give up if the client does.
        while not ctx.lock.acquire(timeout=0.5):
            if self._client_gone():
                return
        restore = None
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def emit(line):
                data = (json.dumps(line) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                restore = ctx.execute(code, env_vars, emit, self._client_gone)
            except (OSError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # asyncio's CancelledError is not an Exception
                # Removed by another request while this one ran (its kernel and channels
                # vanish under us), or a kernel that could not be restarted.
                if ctx.removed:
                    name, value = "ContextRemoved", f"Context {ctx.id} was removed"
                else:
                    name, value = "InternalError", f"{type(e).__name__}: {e}"
                emit({"type": "error", "name": name, "value": value, "traceback": ""})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            # Env vars are undone after the response, off the client's clock.
            threading.Thread(target=ctx.cleanup, args=(restore,), daemon=True).start()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _default_context(language):
    try:
        REGISTRY.create(language, contexts.DEFAULT_CWD, default=True)
    except Exception as e:  # it is created again on first use
        print(f"default {language} context did not start: {e}", flush=True)


def main():
    host, _, port = os.environ.get("WARREN_INTERP_LISTEN", "0.0.0.0:49999").rpartition(":")
    # The default contexts exist before the port opens, so "port open" means ready. The
    # kernels start in parallel; JavaScript is best effort (Python is what must work).
    js = threading.Thread(target=_default_context, args=("javascript",))
    js.start()
    REGISTRY.create("python", contexts.DEFAULT_CWD, default=True)
    js.join()
    threading.Thread(target=REGISTRY.watch, daemon=True).start()
    server = Server((host, int(port)), Handler)
    print(f"code interpreter listening on {host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

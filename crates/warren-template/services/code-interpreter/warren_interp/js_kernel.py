"""A small Jupyter kernel for JavaScript, on ipykernel's Kernel base class.

It drives one Node.js process (the base image's Node 18) running js_runner.js: code goes in on
the runner's stdin, the code's stdout and stderr are streamed as they come, and the outcome
(value, error, done) comes back on a separate pipe so that it never mixes with what the code
prints. The runner keeps the state; if it dies (process.exit(), a crash) a new one is started
and the execution that killed it reports the error.

Why our own: the maintained JavaScript kernels need native ZeroMQ bindings fetched from outside
the Debian archive; this one needs nothing beyond Node and ipykernel.
"""

import codecs
import json
import os
import select
import signal
import subprocess
import sys
import time

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js_runner.js")
INTERRUPT_GRACE_SECONDS = 3.0


def _default_signals():
    # ipykernel ignores SIGINT and Python ignores SIGPIPE; Node must see both as usual (it
    # handles SIGINT itself, see js_runner.js).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


class JavaScriptKernel(Kernel):
    implementation = "warren-javascript"
    implementation_version = "1.0"
    language = "javascript"
    language_version = "18"
    language_info = {
        "name": "javascript",
        "mimetype": "application/javascript",
        "file_extension": ".js",
    }
    banner = "JavaScript (Node.js)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.node = None
        self._start_node()

    def _start_node(self):
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, WARREN_JS_FD=str(write_fd))
        self.node = subprocess.Popen(
            ["node", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(write_fd,), env=env, preexec_fn=_default_signals,
        )
        os.close(write_fd)
        self.ctrl = read_fd
        self.pending = b""

    def _stop_node(self):
        if self.node is not None:
            self.node.kill()
            self.node.wait()
            for f in (self.node.stdin, self.node.stdout, self.node.stderr):
                f.close()
            os.close(self.ctrl)
            self.node = None

    def _stream(self, name, text):
        if text and not self._silent:
            self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False, *, cell_id=None):
        self._silent = silent
        if not code.strip():
            return self._reply(None)
        try:
            self.node.stdin.write((json.dumps({"code": code}) + "\n").encode())
            self.node.stdin.flush()
        except OSError:
            return self._node_died()
        error = None
        interrupted_at = None
        decoders = {
            self.node.stdout.fileno(): ("stdout", codecs.getincrementaldecoder("utf-8")("replace")),
            self.node.stderr.fileno(): ("stderr", codecs.getincrementaldecoder("utf-8")("replace")),
        }
        while True:
            try:
                if interrupted_at and time.monotonic() - interrupted_at > INTERRUPT_GRACE_SECONDS:
                    # Still running asynchronous work that SIGINT cannot stop: start over.
                    self._stop_node()
                    self._start_node()
                    return self._reply(("KeyboardInterrupt", "Interrupted", ""))
                fds = [self.ctrl, *decoders]
                ready, _, _ = select.select(fds, [], [], 0.1)
                for fd in ready:
                    data = os.read(fd, 65536)
                    if fd in decoders:
                        name, decoder = decoders[fd]
                        self._stream(name, decoder.decode(data))
                        continue
                    if not data:
                        return self._node_died()
                    self.pending += data
                    while b"\n" in self.pending:
                        line, self.pending = self.pending.split(b"\n", 1)
                        message = json.loads(line)
                        if message["type"] == "result" and not silent:
                            self.send_response(self.iopub_socket, "execute_result", {
                                "execution_count": self.execution_count,
                                "data": {"text/plain": message["text"]},
                                "metadata": {},
                            })
                        elif message["type"] == "error":
                            error = (message["name"], message["value"], message["traceback"])
                        elif message["type"] == "done":
                            self._drain(decoders)
                            return self._reply(error)
            except KeyboardInterrupt:
                # Node got the same SIGINT (one process group) and stops synchronous code.
                interrupted_at = interrupted_at or time.monotonic()

    def _drain(self, decoders):
        """Output the code wrote just before it finished."""
        while True:
            ready, _, _ = select.select(list(decoders), [], [], 0)
            if not ready:
                return
            got = False
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    got = True
                    name, decoder = decoders[fd]
                    self._stream(name, decoder.decode(data))
            if not got:
                return

    def _node_died(self):
        code = self.node.poll()
        self._stop_node()
        self._start_node()
        return self._reply(("NodeExited", f"node exited with status {code}; a new one was started", ""))

    def _reply(self, error):
        if error is None:
            return {"status": "ok", "execution_count": self.execution_count,
                    "payload": [], "user_expressions": {}}
        name, value, traceback = error
        content = {"ename": name, "evalue": value, "traceback": [traceback] if traceback else []}
        if not self._silent:
            self.send_response(self.iopub_socket, "error", content)
        return dict(content, status="error", execution_count=self.execution_count)

    def do_shutdown(self, restart):
        self._stop_node()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv[0] = "warren-javascript-kernel"
    IPKernelApp.launch_instance(kernel_class=JavaScriptKernel)

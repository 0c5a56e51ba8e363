"""A small Jupyter kernel for JavaScript, TypeScript and Java, on ipykernel's Kernel base class.

It drives one long-lived runner process that keeps the context's state: js_runner.js on the
base image's Node 18 (TypeScript cells are transpiled first), or JavaRunner.java on JShell
(code-interpreter-full). Code goes in on the runner's stdin, the code's stdout and stderr are
streamed as they come, and the outcome (value, error, done: JSON lines) comes back on a
separate pipe so that it never mixes with what the code prints. If the runner dies
(process.exit(), System.exit(), a crash) a new one is started and the execution that killed it
reports the error.

The language is the kernel spec's WARREN_RUNNER_LANGUAGE.

Why our own: the maintained JavaScript kernels need native ZeroMQ bindings fetched from outside
the Debian archive, and the Java one is not in Debian; these need nothing beyond Node, a JDK
and ipykernel.
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

HERE = os.path.dirname(os.path.abspath(__file__))
INTERRUPT_GRACE_SECONDS = 3.0


def _json_request(code):
    return (json.dumps({"code": code}) + "\n").encode()


def _sized_request(code):
    # The Java runner has no JSON parser: the code's length in bytes, a newline, the code.
    data = code.encode()
    return b"%d\n%s" % (len(data), data)


# language -> (argv, extra environment, request encoding, Jupyter language_info)
RUNNERS = {
    "javascript": (
        ["node", os.path.join(HERE, "js_runner.js")], {}, _json_request,
        {"name": "javascript", "mimetype": "application/javascript", "file_extension": ".js"},
    ),
    "typescript": (
        ["node", os.path.join(HERE, "js_runner.js")], {"WARREN_JS_TYPESCRIPT": "1"}, _json_request,
        {"name": "typescript", "mimetype": "text/typescript", "file_extension": ".ts"},
    ),
    "java": (
        # Single-file source launch: compiled in memory at start, nothing to build.
        ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "--add-modules", "jdk.jshell",
         os.path.join(HERE, "JavaRunner.java")],
        {}, _sized_request,
        {"name": "java", "mimetype": "text/x-java-source", "file_extension": ".jshell"},
    ),
}
LANGUAGE = os.environ.get("WARREN_RUNNER_LANGUAGE", "javascript")


def _default_signals():
    # ipykernel ignores SIGINT and Python ignores SIGPIPE; the runner must see both as usual
    # (Node and the JVM handle SIGINT themselves: js_runner.js, JavaRunner.java).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


class RunnerKernel(Kernel):
    implementation = f"warren-{LANGUAGE}"
    implementation_version = "1.0"
    language = LANGUAGE
    language_info = RUNNERS[LANGUAGE][3]
    banner = LANGUAGE

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.runner = None
        self._start_runner()

    def _start_runner(self):
        argv, extra_env, self.encode, _ = RUNNERS[LANGUAGE]
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, WARREN_RUNNER_FD=str(write_fd), **extra_env)
        env.pop("WARREN_RUNNER_LANGUAGE", None)
        self.runner = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(write_fd,), env=env, preexec_fn=_default_signals,
        )
        os.close(write_fd)
        self.ctrl = read_fd
        self.pending = b""

    def _stop_runner(self):
        if self.runner is not None:
            self.runner.kill()
            self.runner.wait()
            for f in (self.runner.stdin, self.runner.stdout, self.runner.stderr):
                f.close()
            os.close(self.ctrl)
            self.runner = None

    def _stream(self, name, text):
        if text and not self._silent:
            self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False, *, cell_id=None):
        self._silent = silent
        if not code.strip():
            return self._reply(None)
        try:
            self.runner.stdin.write(self.encode(code))
            self.runner.stdin.flush()
        except OSError:
            return self._runner_died()
        error = None
        interrupted_at = None
        decoders = {
            self.runner.stdout.fileno(): ("stdout", codecs.getincrementaldecoder("utf-8")("replace")),
            self.runner.stderr.fileno(): ("stderr", codecs.getincrementaldecoder("utf-8")("replace")),
        }
        while True:
            try:
                if interrupted_at and time.monotonic() - interrupted_at > INTERRUPT_GRACE_SECONDS:
                    # Still running asynchronous work that SIGINT cannot stop: start over.
                    self._stop_runner()
                    self._start_runner()
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
                        return self._runner_died()
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
                            if error is None and interrupted_at:
                                # Stopped without an error of its own (JShell's stop).
                                error = ("KeyboardInterrupt", "Interrupted", "")
                            return self._reply(error)
            except KeyboardInterrupt:
                # The runner got the same SIGINT (one process group) and stops the code.
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

    def _runner_died(self):
        code = self.runner.poll()
        self._stop_runner()
        self._start_runner()
        return self._reply((
            "RunnerExited", f"the {LANGUAGE} process exited with status {code}; a new one was started", "",
        ))

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
        self._stop_runner()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv[0] = f"warren-{LANGUAGE}-kernel"
    IPKernelApp.launch_instance(kernel_class=RunnerKernel)

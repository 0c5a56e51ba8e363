"""A small Jupyter kernel for bash, on ipykernel's Kernel base class (which speaks the protocol).

One long-lived interactive bash per kernel keeps state between executions (variables, cwd,
functions). It runs behind a pseudo-terminal so that job control works: an interrupt (the
server sends the kernel SIGINT) becomes ^C on the terminal and stops only the running command,
as in a terminal, and bash stays alive.

Each execution writes the code to a file and sources it, so multi-line code, heredocs and
quotes need no escaping. The end of an execution is bash's prompt, which we set to a marker
carrying `$?`. A terminal merges stdout and stderr, so bash output arrives as stdout.
A non-zero exit status is reported as an error (name `ExitCode`, value the status).
"""

import os
import re
import signal
import sys
import tempfile

import pexpect
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

MARK = "__warren_bash_prompt__"
PROMPT = re.compile(MARK + r"(\d+)" + MARK)
CHUNK_TIMEOUT = 0.1


def _default_signals():
    # The kernel ignores SIGINT (ipykernel) and SIGPIPE (Python); bash and its commands would
    # inherit that, and ^C could then not stop `sleep`, nor a closed pipe stop `yes`.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


class BashKernel(Kernel):
    implementation = "warren-bash"
    implementation_version = "1.0"
    language = "bash"
    language_version = "5"
    language_info = {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh"}
    banner = "Bash"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._cell_file = os.path.join(tempfile.gettempdir(), f".warren-bash-{os.getpid()}.sh")
        self._start_bash()

    def _start_bash(self):
        env = dict(os.environ, TERM="dumb", PAGER="cat", GIT_PAGER="cat")
        self.bash = pexpect.spawn(
            "/bin/bash", ["--norc", "--noprofile", "--noediting", "-i"],
            echo=False, encoding="utf-8", codec_errors="replace", env=env,
            cwd=os.getcwd(), dimensions=(50, 200), preexec_fn=_default_signals,
        )
        # No \r\n translation, no prompt decorations; the marker prompt carries the status.
        self.bash.sendline(
            f"stty -echo -onlcr; PS2=''; unset PROMPT_COMMAND; PS1='{MARK}$?{MARK}'"
        )
        self._read_until_prompt(lambda _text: None, deadline=30)

    def _read_until_prompt(self, out, deadline=None):
        """Streams output to `out` until the prompt; returns bash's exit status."""
        buffer = ""
        waited = 0.0
        while True:
            try:
                buffer += self.bash.read_nonblocking(65536, timeout=CHUNK_TIMEOUT)
            except pexpect.TIMEOUT:
                waited += CHUNK_TIMEOUT
                if deadline is not None and waited > deadline:
                    raise
            match = PROMPT.search(buffer)
            if match:
                out(buffer[: match.start()])
                return int(match.group(1))
            # Flush complete lines as they come; keep a tail that might be half a marker.
            cut = buffer.rfind("\n") + 1
            if cut == 0 and len(buffer) > 4096:
                cut = len(buffer) - len(MARK)
            if cut:
                out(buffer[:cut])
                buffer = buffer[cut:]

    def _stream(self, text):
        if text and not self._silent:
            self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": text})

    def do_execute(self, code, silent, store_history=True, user_expressions=None,
                   allow_stdin=False, *, cell_id=None):
        self._silent = silent
        if not code.strip():
            return self._ok()
        with open(self._cell_file, "w", encoding="utf-8") as f:
            f.write(code if code.endswith("\n") else code + "\n")
        try:
            self.bash.sendline(f". {self._cell_file}")
            status = self._read_until_prompt(self._stream)
        except KeyboardInterrupt:
            # The server interrupted us: ^C to the terminal stops the foreground command.
            self.bash.sendintr()
            try:
                self._read_until_prompt(self._stream, deadline=5)
            except (pexpect.TIMEOUT, pexpect.EOF) as e:
                self.log.warning("interrupt: bash did not come back: %r", e)
                self._restart_bash()
            return self._error("KeyboardInterrupt", "Interrupted")
        except pexpect.EOF:
            # The code ended the shell (`exit`, `set -e` and a failure, ...): start a new one.
            self._restart_bash()
            return self._error("BashExited", "bash exited; a new shell was started")
        if status != 0:
            return self._error("ExitCode", str(status))
        return self._ok()

    def _restart_bash(self):
        try:
            self.bash.close(force=True)
        except Exception:
            pass
        self._start_bash()

    def _ok(self):
        return {"status": "ok", "execution_count": self.execution_count,
                "payload": [], "user_expressions": {}}

    def _error(self, name, value):
        content = {"ename": name, "evalue": value, "traceback": []}
        if not self._silent:
            self.send_response(self.iopub_socket, "error", content)
        return dict(content, status="error", execution_count=self.execution_count)

    def do_shutdown(self, restart):
        try:
            self.bash.close(force=True)
        finally:
            try:
                os.unlink(self._cell_file)
            except OSError:
                pass
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    # The kernel must not die of the SIGINT meant for the running command.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv[0] = "warren-bash-kernel"
    IPKernelApp.launch_instance(kernel_class=BashKernel)

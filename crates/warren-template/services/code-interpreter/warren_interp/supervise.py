"""Keeps the code-interpreter server running: the host starts this file once per sandbox.

The server (and with it every kernel) is restarted whenever it exits or is killed, after a
short pause that grows while it keeps failing quickly, so a crash loop does not eat the CPU.
Output goes to /tmp/warren-interp.log: nobody reads the agent's pipes of a start command, and
a full pipe would block the server.
"""

import os
import signal
import subprocess
import sys
import time

LIB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG = os.environ.get("WARREN_INTERP_LOG", "/tmp/warren-interp.log")


def main():
    log = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    env = dict(os.environ, PYTHONPATH=LIB_DIR, PYTHONUNBUFFERED="1")
    child = None

    def stop(signum, _frame):
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    pause = 0.2
    while True:
        started = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "warren_interp.server"], env=env)
        code = child.wait()
        print(f"supervisor: server exited with {code}; restarting", flush=True)
        # A server that ran for a while gets restarted at once; a crash loop backs off.
        pause = 0.2 if time.monotonic() - started > 30 else min(pause * 2, 5.0)
        time.sleep(pause)


if __name__ == "__main__":
    main()

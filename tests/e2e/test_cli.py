"""The `warren` CLI against the suite's server: what a user types reaches the sandbox intact."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.warren import API_KEY, warren_bin


def warren(server, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    binary = warren_bin()
    env = dict(os.environ, WARREN_API_KEY=API_KEY)
    return subprocess.run([binary, args[0], "--server", server.url, *args[1:]], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def sbx(server):
    from e2b import Sandbox

    s = Sandbox.create(timeout=120, request_timeout=300)
    yield s
    s.kill()


def test_exec_runs_several_arguments_as_exactly_that_argv(server, sbx):
    r = warren(server, "sandbox", "exec", sbx.sandbox_id, "--", "sh", "-c", 'echo "[$0] [$1]"',
               "it's", "two words")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[it's] [two words]\n", r.stdout


def test_exec_runs_one_argument_as_a_shell_command_line(server, sbx):
    r = warren(server, "sandbox", "exec", sbx.sandbox_id, "echo hi | tr h H; exit 3")
    assert r.stdout == "Hi\n", r.stdout
    assert r.returncode == 3, r.stderr

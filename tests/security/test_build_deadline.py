"""Threat model W3-M3 (the builder): one builder serves the whole server, and a build's RUN
steps were limited only to an hour each, with no limit on their number, so one build of
`RUN sleep 3500` steps held the builder for everyone indefinitely. Now a whole build has a
deadline (`--build-timeout-secs`): past it the build fails saying so, and its build sandbox is
killed. (A fair queue per team is the agent-driven cloud's issue.)"""

from __future__ import annotations

import os
import uuid

import pytest
from e2b import Template

import conftest

DEADLINE = 45
RUNTIME = os.environ.get("WARREN_E2E_RUNTIME", "ns")


def sleepers(marker: str) -> list[int]:
    """Host processes whose command line holds `marker` (ns sandboxes' processes are host
    processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_build_past_its_deadline_fails_and_its_sandbox_goes(server):
    # A number of seconds no other test sleeps, so the sandbox's process can be found.
    nap = 3000 + int(uuid.uuid4().int % 500)
    with conftest.restarted_with(server, "--build-timeout-secs", str(DEADLINE)):
        tpl = Template().from_base_image().run_cmd(f"echo {uuid.uuid4().hex}").run_cmd(f"sleep {nap}")
        with pytest.raises(Exception) as stopped:
            Template.build(tpl, f"deadline-{uuid.uuid4().hex[:8]}")
        # Stopped by the deadline (the step's own hour would say so otherwise).
        assert "deadline" in str(stopped.value), stopped.value
        if RUNTIME == "ns":
            left = sleepers(f"sleep {nap}")
            assert not left, f"the build sandbox's process outlived the build: {left}"

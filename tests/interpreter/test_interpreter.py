"""The unmodified e2b-code-interpreter SDK (2.11.5) against code-interpreter-v1 sandboxes.

Every test creates or reuses a sandbox and calls `run_code` right away: create only returns
once the interpreter answers, so there is no waiting in here.
"""

from __future__ import annotations

import base64
import io
import re
import struct
import threading
import time

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    LineChart,
    PieChart,
    SuperChart,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (which must come first)."""
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


# --- state, output, errors -------------------------------------------------------------------


def test_state_is_kept_between_calls(shared):
    first = shared.run_code("x = 41")
    assert first.error is None
    second = shared.run_code("x + 1")
    assert second.text == "42"
    assert second.execution_count == first.execution_count + 1


def test_stdout_and_stderr(shared):
    execution = shared.run_code("import sys\nprint('to out')\nprint('to err', file=sys.stderr)")
    assert execution.logs.stdout == ["to out\n"]
    assert execution.logs.stderr == ["to err\n"]


def test_output_streams_while_code_runs(shared):
    """The first line arrives while the code still waits for a file that only the callback
    writes: if output were buffered until the end, this would never finish."""
    shared.commands.run("rm -f /tmp/go")
    seen = []

    def on_stdout(msg):
        seen.append(msg.line)
        if msg.line.startswith("first"):
            shared.files.write("/tmp/go", "go")

    execution = shared.run_code(
        "import os, time\nprint('first', flush=True)\n"
        "while not os.path.exists('/tmp/go'):\n    time.sleep(0.05)\nprint('second')",
        on_stdout=on_stdout,
        timeout=120,
    )
    assert execution.error is None
    assert seen == ["first\n", "second\n"]


def test_error_with_traceback(shared):
    errors = []
    execution = shared.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    # IPython colours the traceback; the frames are there underneath.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", execution.error.traceback)
    assert "ZeroDivisionError" in plain
    assert "f()" in plain and "return 1 / 0" in plain
    assert errors and errors[0].name == "ZeroDivisionError"
    # The context is still usable.
    assert shared.run_code("'still here'").text == "still here"


# --- rich results ----------------------------------------------------------------------------


def test_matplotlib_png_and_line_chart(shared):
    execution = shared.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(4, 3), dpi=100)\n"
        "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
        "plt.title('Growth'); plt.xlabel('n'); plt.ylabel('n^2')\n"
        "plt.show()"
    )
    assert execution.error is None
    [result] = execution.results
    assert not result.is_main_result
    png = base64.b64decode(result.png)
    width, height = png_size(png)
    # About 400x300: the inline backend trims the figure to its contents.
    assert 300 < width <= 400 and 250 < height <= 350
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        image.load()
        assert image.size == (width, height)
        assert image.getextrema()[0][0] < image.getextrema()[0][1]  # not a blank image
    chart = result.chart
    assert isinstance(chart, LineChart)
    assert chart.title == "Growth"
    assert (chart.x_label, chart.y_label) == ("n", "n^2")
    assert chart.x_scale.value == "linear"
    [series] = chart.elements
    assert series.label == "squares"
    assert series.points == [(1.0, 1.0), (2.0, 4.0), (3.0, 9.0)]


def test_bar_pie_and_superchart(shared):
    execution = shared.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, (a, b) = plt.subplots(1, 2)\n"
        "fig.suptitle('Both')\n"
        "a.bar(['red', 'blue'], [3, 5], label='count'); a.set_title('Bars')\n"
        "b.pie([1, 3], labels=['small', 'large']); b.set_title('Pie')\n"
        "plt.show()"
    )
    assert execution.error is None
    chart = execution.results[0].chart
    assert isinstance(chart, SuperChart)
    assert chart.title == "Both"
    bars, pie = chart.elements
    assert isinstance(bars, BarChart) and isinstance(pie, PieChart)
    assert [(e.label, e.value, e.group) for e in bars.elements] == [
        ("red", 3.0, "count"),
        ("blue", 5.0, "count"),
    ]
    assert [e.label for e in pie.elements] == ["small", "large"]
    assert [e.angle for e in pie.elements] == [90.0, 270.0]


def test_box_and_whisker_chart_with_units(shared):
    execution = shared.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.boxplot([[1, 2, 3, 4, 5], [2, 4, 6, 8, 30]], labels=['a', 'b'])\n"
        "ax.set_xlabel('Group'); ax.set_ylabel('Latency (ms)')\n"
        "plt.show()"
    )
    chart = execution.results[0].chart
    assert isinstance(chart, BoxAndWhiskerChart)
    assert chart.title is None
    assert (chart.y_label, chart.y_unit, chart.x_unit) == ("Latency (ms)", "ms", None)
    a, b = chart.elements
    assert (a.label, a.min, a.first_quartile, a.median, a.third_quartile, a.max) == (
        "a", 1, 2, 3, 4, 5)
    assert (b.label, b.median, b.outliers) == ("b", 6, [30])


def test_dataframe_has_html_text_and_data(shared):
    execution = shared.run_code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"
    )
    result = execution.results[0]
    assert result.is_main_result
    assert "<table" in result.html
    assert result.data == {"a": [1, 2], "b": ["x", "y"]}
    assert "a" in result.text and "x" in result.text


def test_every_mime_representation(shared):
    execution = shared.run_code(
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>rich</b>'\n"
        "    def _repr_markdown_(self): return '**rich**'\n"
        "    def _repr_svg_(self): return '<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>'\n"
        "    def _repr_latex_(self): return r'$\\alpha$'\n"
        "    def _repr_json_(self): return {'k': [1, 2]}\n"
        "    def _repr_javascript_(self): return 'console.log(1)'\n"
        "    def _repr_jpeg_(self): return b'\\xff\\xd8\\xff\\xe0jpeg'\n"
        "    def _repr_pdf_(self): return b'%PDF-1.4'\n"
        "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
        "        return {'application/vnd.warren.test+json': {'ok': True}}\n"
        "    def __repr__(self): return 'Rich()'\n"
        "Rich()"
    )
    assert execution.error is None
    [result] = execution.results
    assert result.is_main_result
    assert result.text == "Rich()"
    assert result.html == "<b>rich</b>"
    assert result.markdown == "**rich**"
    assert result.svg.startswith("<svg")
    assert result.latex == "$\\alpha$"
    assert result.json == {"k": [1, 2]}
    assert result.javascript == "console.log(1)"
    assert base64.b64decode(result.jpeg).startswith(b"\xff\xd8")
    assert base64.b64decode(result.pdf).startswith(b"%PDF")
    assert result.extra == {"application/vnd.warren.test+json": {"ok": True}}


def test_display_calls_are_not_the_main_result(shared):
    execution = shared.run_code(
        "from IPython.display import display, HTML\ndisplay(HTML('<i>side</i>'))\n7 * 6"
    )
    side, main = execution.results
    assert (side.html, side.is_main_result) == ("<i>side</i>", False)
    assert (main.text, main.is_main_result) == ("42", True)
    assert execution.text == "42"


# --- contexts and languages ------------------------------------------------------------------


def test_contexts_create_list_restart_remove(shared):
    ctx = shared.create_code_context(cwd="/home/user/project")
    assert ctx.language == "python" and ctx.cwd == "/home/user/project"
    assert shared.run_code("import os; os.getcwd()", context=ctx).text == "/home/user/project"
    shared.run_code("secret = 'only here'", context=ctx)
    assert shared.run_code("secret", context=ctx).text == "only here"
    # The default context does not see it.
    assert shared.run_code("'secret' in globals()").text == "False"
    listed = shared.list_code_contexts()
    assert ctx.id in [c.id for c in listed]
    assert {"python", "javascript"} <= {c.language for c in listed}  # the default contexts

    shared.restart_code_context(ctx)
    assert shared.run_code("'secret' in globals()", context=ctx).text == "False"
    assert shared.run_code("import os; os.getcwd()", context=ctx).text == "/home/user/project"

    shared.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in shared.list_code_contexts()]
    with pytest.raises(NotFoundException):
        shared.run_code("1", context=ctx)


def test_removing_a_busy_context_ends_its_execution(shared):
    ctx = shared.create_code_context()

    def on_stdout(msg):
        if msg.line.startswith("waiting"):
            shared.remove_code_context(ctx)

    execution = shared.run_code(
        "import time\nprint('waiting', flush=True)\nwhile True:\n    time.sleep(0.05)",
        context=ctx, on_stdout=on_stdout, timeout=120)
    assert execution.error is not None and execution.error.name == "ContextRemoved"
    assert ctx.id not in [c.id for c in shared.list_code_contexts()]


def test_bash(shared):
    execution = shared.run_code("echo hello; GREETING=hi; cd /tmp", language="bash")
    assert execution.error is None
    assert execution.logs.stdout == ["hello\n"]
    # Variables and the working directory persist in the bash context.
    execution = shared.run_code('echo "$GREETING from $(pwd)"', language="bash")
    assert execution.logs.stdout == ["hi from /tmp\n"]
    failed = shared.run_code("ls /does-not-exist", language="bash")
    assert failed.error is not None and failed.error.value == "2"
    assert "No such file or directory" in "".join(failed.logs.stdout)


def test_bash_context_with_cwd(shared):
    ctx = shared.create_code_context(language="bash", cwd="/home/user/shell")
    assert ctx.language == "bash"
    assert shared.run_code("pwd", context=ctx).logs.stdout == ["/home/user/shell\n"]
    shared.remove_code_context(ctx)


def test_javascript(shared):
    execution = shared.run_code("const base = 40; console.log('from node'); base + 2", language="js")
    assert execution.error is None
    assert execution.text == "42"
    assert execution.logs.stdout == ["from node\n"]
    assert shared.run_code("base * 2", language="javascript").text == "80"
    awaited = shared.run_code("await new Promise((r) => setTimeout(() => r('later'), 10))",
                              language="javascript")
    assert awaited.text == "later"
    imported = shared.run_code("import { join } from 'path'\njoin('a', 'b')", language="js")
    assert imported.text == "a/b"
    failed = shared.run_code("null.field", language="javascript")
    assert failed.error is not None and failed.error.name == "TypeError"
    ctx = shared.create_code_context(language="javascript", cwd="/home/user/js")
    assert shared.run_code("process.cwd()", context=ctx).text == "/home/user/js"
    shared.remove_code_context(ctx)


def test_interrupted_javascript_keeps_its_state(shared):
    shared.run_code("var survivor = 'alive'", language="javascript")
    with pytest.raises(TimeoutException):
        shared.run_code("while (true) {}", language="javascript", timeout=3)
    assert shared.run_code("survivor", language="javascript", timeout=120).text == "alive"


def test_unsupported_language_is_a_clear_error(shared):
    with pytest.raises(SandboxException, match="not supported"):
        shared.run_code("1", language="r")


def test_create_time_env_vars_reach_every_kernel(server):
    # On vm the service and its first kernel start in the template's snapshot, before the
    # sandbox exists: the variables of the create must still reach the code it runs.
    sbx = Sandbox.create(timeout=300, request_timeout=300, envs={"WARREN_CREATE_VAR": "created"})
    try:
        code = "import os; os.environ.get('WARREN_CREATE_VAR', 'unset') + ' ' + os.environ.get('E2B_SANDBOX_ID', '')"
        assert sbx.run_code(code).text == f"created {sbx.sandbox_id}"
        bash = sbx.run_code('echo "${WARREN_CREATE_VAR:-unset}"', language="bash")
        assert bash.logs.stdout == ["created\n"]
        # A per-execution value wins for that execution only.
        assert sbx.run_code(code, envs={"WARREN_CREATE_VAR": "once"}).text.startswith("once ")
        assert sbx.run_code(code).text.startswith("created ")
    finally:
        sbx.kill()


def test_sandboxes_do_not_share_random_state(server, shared):
    # On vm every sandbox's first kernel was started in the one template snapshot: without a
    # reseed each would draw the same "random" numbers.
    other = Sandbox.create(timeout=300, request_timeout=300)
    try:
        code = "import random; random.random()"
        assert shared.run_code(code).text != other.run_code(code).text
        bash = 'echo $RANDOM$RANDOM$RANDOM'
        assert (shared.run_code(bash, language="bash").logs.stdout
                != other.run_code(bash, language="bash").logs.stdout)
    finally:
        other.kill()


def test_env_vars_per_execution(shared):
    code = "import os; os.environ.get('WARREN_TEST_VAR', 'unset')"
    assert shared.run_code(code, envs={"WARREN_TEST_VAR": "set"}).text == "set"
    assert shared.run_code(code).text == "unset"
    bash = shared.run_code('echo "${WARREN_TEST_VAR:-unset}"', language="bash",
                           envs={"WARREN_TEST_VAR": "bash"})
    assert bash.logs.stdout == ["bash\n"]
    bash = shared.run_code('echo "${WARREN_TEST_VAR:-unset}"', language="bash")
    assert bash.logs.stdout == ["unset\n"]
    js = "process.env.WARREN_TEST_VAR ?? 'unset'"
    assert shared.run_code(js, language="javascript", envs={"WARREN_TEST_VAR": "js"}).text == "js"
    assert shared.run_code(js, language="javascript").text == "unset"


# --- timeouts, interrupts, reconnect ---------------------------------------------------------


def test_timeout_interrupts_the_kernel(shared):
    shared.run_code("kept = 'yes'")
    with pytest.raises(TimeoutException):
        shared.run_code("import time; time.sleep(600)", timeout=3)
    # The disconnect interrupted the sleep: the next call runs (it would otherwise queue
    # behind a 600 s sleep and hit its own timeout), and the kernel kept its state.
    execution = shared.run_code("kept", timeout=120)
    assert execution.text == "yes"


def test_interrupted_bash_command(shared):
    with pytest.raises(TimeoutException):
        shared.run_code("sleep 600", language="bash", timeout=3)
    execution = shared.run_code("echo after", language="bash", timeout=120)
    assert execution.logs.stdout == ["after\n"]


def test_reconnect_from_a_second_client(shared):
    shared.run_code("shared_value = 1234")
    other = Sandbox.connect(shared.sandbox_id)
    assert other.run_code("shared_value").text == "1234"


def test_parallel_contexts_run_independently(shared):
    ctx = shared.create_code_context()
    shared.commands.run("rm -f /tmp/release")
    out = {}

    def waiter():
        out["v"] = shared.run_code(
            "import os, time\nwhile not os.path.exists('/tmp/release'):\n    time.sleep(0.05)\n"
            "'released'", context=ctx, timeout=120).text

    t = threading.Thread(target=waiter)
    t.start()
    # The default context runs while the other one is busy, and releases it.
    shared.run_code("open('/tmp/release', 'w').close()")
    t.join()
    assert out["v"] == "released"
    shared.remove_code_context(ctx)


# --- supervision -----------------------------------------------------------------------------


def test_killed_kernel_recovers(fresh):
    died = fresh.run_code("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert died.error is not None and died.error.name == "KernelDied"
    assert fresh.run_code("1 + 1").text == "2"
    # Killed from outside while idle: the next execution still works.
    pid = fresh.run_code("import os; os.getpid()").text
    # Kernels run as root (as on E2B), so killing one takes root.
    fresh.commands.run(f"kill -9 {pid}", user="root")
    assert fresh.run_code("2 + 2").text == "4"


def test_killed_server_comes_back(fresh):
    fresh.run_code("before = 1")
    pids = fresh.commands.run("pgrep -f 'warren_interp.server'").stdout.split()
    assert len(pids) == 1
    fresh.commands.run(f"kill -9 {pids[0]}", user="root")
    # The supervisor restarts it; until its port is open the proxy answers with an error.
    # Retried with a backoff up to a deadline (far beyond a restart's few seconds), so a
    # server that never comes back fails here with the last error, not at pytest's timeout.
    deadline = time.monotonic() + 120
    delay = 0.1
    while True:
        try:
            execution = fresh.run_code("1 + 1", timeout=60)
            break
        except SandboxException as e:
            if time.monotonic() > deadline:
                raise AssertionError("the interpreter server did not come back within 120 s") from e
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    assert execution.text == "2"
    health = fresh.commands.run("curl -s http://127.0.0.1:49999/health")
    assert health.stdout == '"OK"'
    new = fresh.commands.run("pgrep -f 'warren_interp.server'").stdout.split()
    assert new and new != pids


def test_sandbox_killed_during_execution(fresh, outcome_within):
    """The stream is cut, not ended cleanly: the SDK reports the kill instead of returning a
    silently truncated result."""

    def on_stdout(msg):
        if msg.line.startswith("running"):
            fresh.kill()

    # The execution's client deadline (300 s) is far beyond the bounded wait, and the code
    # outlives both: only the kill can end the wait in time, and a client timeout ("Execution
    # timed out", with no connection error behind it) cannot pass for the kill.
    ended = outcome_within(120, lambda: fresh.run_code(
        "import time\nprint('running', flush=True)\ntime.sleep(600)",
        on_stdout=on_stdout, timeout=300))
    assert ended is not None, "the kill did not cut the execution's stream"
    assert isinstance(ended, TimeoutException), repr(ended)
    assert "killed" in str(ended), str(ended)
    assert isinstance(ended.__cause__, (httpx.ReadError, httpx.RemoteProtocolError)), repr(ended.__cause__)


def test_execute_needs_a_token(server, shared):
    """Threat model C1: the interpreter runs code for whoever reaches it, so the proxy lets
    through only requests with the sandbox's access or traffic token (the SDK sends both)."""
    import requests

    url = server.url + "/execute"
    route = {"E2b-Sandbox-Id": shared.sandbox_id, "E2b-Sandbox-Port": "49999",
             "Content-Type": "application/json"}
    body = '{"code": "print(6 * 7)"}'
    r = requests.post(url, headers=route, data=body, timeout=60)
    assert r.status_code == 403, r.text
    assert "42" not in r.text
    r = requests.post(url, headers={**route, "X-Access-Token": shared._envd_access_token}, data=body, timeout=60)
    assert r.status_code == 200 and "42" in r.text
    # The contexts routes get only the traffic token from the SDK; it is enough.
    r = requests.get(server.url + "/contexts", headers={**route, "E2B-Traffic-Access-Token": shared.traffic_access_token}, timeout=60)
    assert r.status_code == 200, r.text

"""What E2B's code-interpreter sandboxes do that code written against them relies on: a
TypeScript kernel, code running as root in /home/user, PIL images shown as results, and
create-time env vars in every kernel. (R and Java: test_full.py.)
"""

from __future__ import annotations

import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_typescript_kernel(shared):
    execution = shared.run_code(
        "const message: string = 'Hello, World!'; console.log(message)", language="ts"
    )
    assert execution.error is None, execution.error
    assert execution.logs.stdout == ["Hello, World!\n"]
    # State, types, interfaces and top-level await, in the default TypeScript context.
    typed = shared.run_code(
        "interface Point { x: number; y: number }\n"
        "const p: Point = { x: 20, y: 22 }\n"
        "function sum(q: Point): number { return q.x + q.y }\n"
        "sum(p)",
        language="typescript",
    )
    assert typed.text == "42"
    assert shared.run_code("await Promise.resolve<string>(message)", language="ts").text == "Hello, World!"
    assert shared.run_code("process.cwd()", language="ts").text == "/home/user"
    imported = shared.run_code("import { join } from 'path'\njoin('a', 'b')", language="ts")
    assert imported.text == "a/b"
    # A syntax error is an error of the cell, not of the context.
    broken = shared.run_code("const x: = 1", language="ts")
    assert broken.error is not None and broken.error.name == "SyntaxError"
    assert shared.run_code("message.length", language="ts").text == "13"
    # The JavaScript context is another one.
    assert shared.run_code("typeof message", language="js").text == "undefined"


def test_typescript_contexts_and_env_vars(shared):
    ctx = shared.create_code_context(language="ts", cwd="/home/user/ts")
    assert ctx.language == "typescript"
    assert shared.run_code("process.cwd()", context=ctx).text == "/home/user/ts"
    code = "process.env.WARREN_TS_VAR ?? 'unset'"
    assert shared.run_code(code, context=ctx, envs={"WARREN_TS_VAR": "set"}).text == "set"
    assert shared.run_code(code, context=ctx).text == "unset"
    shared.remove_code_context(ctx)


def test_code_runs_as_root_in_the_home_directory(shared):
    python = shared.run_code("import os, pathlib; print(os.getuid(), pathlib.Path.cwd())")
    assert python.logs.stdout == ["0 /home/user\n"]
    assert "".join(shared.run_code("id -un; pwd", language="bash").logs.stdout) == "root\n/home/user\n"
    assert shared.run_code("process.getuid()", language="js").text == "0"
    # Commands keep the sandbox's default user.
    assert shared.commands.run("id -un").stdout.strip() == "user"


def test_pil_images_are_shown_as_results(shared):
    setup = (
        "import numpy\nfrom PIL import Image\n"
        "image = Image.fromarray((numpy.random.rand(16, 16, 3) * 255).astype('uint8')).convert('RGBA')\n"
    )
    shown = shared.run_code(setup + "image.show()\nprint('shown')")
    assert shown.error is None, shown.error
    assert shown.logs.stdout == ["shown\n"]
    assert len(shown.results) == 1 and shown.results[0].png
    saved = shared.run_code(setup + "image.save('/tmp/saved.png')\nprint('saved')")
    assert len(saved.results) == 1 and saved.results[0].png
    assert shared.files.read("/tmp/saved.png", format="bytes")[:8] == PNG_SIGNATURE
    # Saving to a file object is not a display (as on E2B).
    to_buffer = shared.run_code(setup + "import io; image.save(io.BytesIO(), 'PNG')")
    assert to_buffer.results == []
    last = shared.run_code(setup + "image")
    assert last.results[0].png and last.results[0].is_main_result


def test_r_and_java_name_the_template_that_has_them(shared):
    for language in ("r", "java"):
        with pytest.raises(SandboxException, match="code-interpreter-full"):
            shared.run_code("1", language=language)


def test_create_time_env_vars_reach_node_kernels(server):
    sbx = Sandbox.create(timeout=300, request_timeout=300, envs={"WARREN_CREATE_VAR": "created"})
    try:
        for language in ("js", "ts"):
            result = sbx.run_code("process.env.WARREN_CREATE_VAR", language=language)
            assert result.text == "created", language
    finally:
        sbx.kill()

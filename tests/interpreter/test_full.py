"""The code-interpreter-full template: code-interpreter-v1 plus R (IRkernel) and Java
(JShell) kernels, driven by the unmodified e2b-code-interpreter SDK."""

from __future__ import annotations

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

FULL = "code-interpreter-full"


@pytest.fixture(scope="module")
def full(server, build_template):
    build_template(FULL)
    sbx = Sandbox.create(FULL, timeout=600, request_timeout=300, envs={"TEST_ENV_VAR": "supertest"})
    yield sbx
    sbx.kill()


def test_r_kernel(full):
    hello = full.run_code('print("Hello, World!")', language="r")
    assert hello.error is None, hello.error
    assert hello.logs.stdout == ['[1] "Hello, World!"\n']
    assert full.run_code("getwd()", language="r").results[0].text.strip() == '[1] "/home/user"'
    full.run_code("x <- c(1, 2, 3)", language="r")
    assert full.run_code("sum(x) * 7", language="r").results[0].text.strip() == "[1] 42"
    failed = full.run_code('stop("broken")', language="r")
    assert failed.error is not None and "broken" in failed.error.value
    # The failure did not cost the context its state.
    assert full.run_code("length(x)", language="r").results[0].text.strip() == "[1] 3"


def test_r_env_vars(full):
    created = full.run_code("Sys.getenv('TEST_ENV_VAR')", language="r")
    assert created.results[0].text.strip() == '[1] "supertest"'
    once = full.run_code("Sys.getenv('FOO')", language="r", envs={"FOO": "bar"})
    assert once.results[0].text.strip() == '[1] "bar"'
    after = full.run_code("Sys.getenv('FOO', unset = 'default')", language="r")
    assert after.results[0].text.strip() == '[1] "default"'
    overridden = full.run_code("Sys.getenv('TEST_ENV_VAR')", language="r", envs={"TEST_ENV_VAR": "over"})
    assert overridden.results[0].text.strip() == '[1] "over"'
    assert full.run_code("Sys.getenv('TEST_ENV_VAR')", language="r").results[0].text.strip() == '[1] "supertest"'


def test_java_kernel(full):
    hello = full.run_code('System.out.println("Hello, World!")', language="java")
    assert hello.error is None, hello.error
    assert hello.logs.stdout == ["Hello, World!\n"]
    assert full.run_code('System.getProperty("user.dir")', language="java").text == "/home/user"
    declared = full.run_code(
        "import java.util.*;\n"
        "int twice(int n) { return 2 * n; }\n"
        "List<Integer> xs = new ArrayList<>(List.of(3, 1, 2));\n"
        "Collections.sort(xs);\n"
        "xs",
        language="java",
    )
    assert declared.text == "[1, 2, 3]"
    assert full.run_code("twice(21)", language="java").text == "42"
    broken = full.run_code("int y = ;", language="java")
    assert broken.error is not None and broken.error.name == "CompilationException"
    thrown = full.run_code("Object o = null; o.toString()", language="java")
    assert thrown.error is not None and "NullPointerException" in thrown.error.name
    assert full.run_code("xs.size()", language="java").text == "3"


def test_java_env_vars_are_system_properties(full):
    created = full.run_code('System.getProperty("TEST_ENV_VAR")', language="java")
    assert created.text == "supertest"
    once = full.run_code('System.getProperty("FOO")', language="java", envs={"FOO": "bar"})
    assert once.text == "bar"
    assert full.run_code('System.getProperty("FOO", "default")', language="java").text == "default"


def test_interrupted_java_keeps_its_state(full):
    full.run_code('String survivor = "alive";', language="java")
    with pytest.raises(TimeoutException):
        full.run_code("while (true) {}", language="java", timeout=5)
    assert full.run_code("survivor", language="java", timeout=120).text == "alive"

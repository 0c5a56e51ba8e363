"""`sandbox.commands`: foreground runs (process.Process/Start) through the official SDK."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    Sandbox,
    TimeoutException,
)

from _helpers import q, wait_until


def test_echo_stdout_is_exact(sandbox: Sandbox):
    r = sandbox.commands.run('echo "Hello World"')
    assert r.stdout == "Hello World\n"
    assert r.stderr == ""
    assert r.exit_code == 0
    assert r.error is None


def test_stderr_is_separate(sandbox: Sandbox):
    r = sandbox.commands.run("echo out; echo err 1>&2")
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"
    assert r.exit_code == 0


def test_output_callbacks(sandbox: Sandbox):
    out, err = [], []
    r = sandbox.commands.run(
        "echo one; echo two 1>&2; echo three",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "one\nthree\n" == r.stdout
    assert "".join(err) == "two\n" == r.stderr


@pytest.mark.parametrize("code", [1, 3, 127, 255])
def test_nonzero_exit_raises(sandbox: Sandbox, code: int):
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run(f"echo partial; echo oops 1>&2; exit {code}")
    e = ei.value
    assert e.exit_code == code
    assert e.stdout == "partial\n"
    assert e.stderr == "oops\n"
    assert e.error == f"exit status {code}"


def test_command_not_found_is_127(sandbox: Sandbox):
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("definitely-not-a-command-xyz")
    assert ei.value.exit_code == 127
    assert "definitely-not-a-command-xyz" in ei.value.stderr


def test_special_characters(sandbox: Sandbox):
    text = "!@#$%^&*()_+-=[]{}|;':\",./<>?`~\\ tab\there"
    r = sandbox.commands.run(f"printf '%s' {q(text)}")
    assert r.stdout == text


def test_unicode(sandbox: Sandbox):
    text = "héllo wörld — 日本語 🎉"
    r = sandbox.commands.run(f"printf '%s\\n' {q(text)}")
    assert r.stdout == text + "\n"


def test_broken_utf8_becomes_replacement_char(sandbox: Sandbox):
    # Mirrors the SDK's own test: a dangling lead byte right at a chunk-ish boundary.
    r = sandbox.commands.run('printf "' + "a" * 8191 + '\\xe2"')
    assert r.stdout == "a" * 8191 + "\ufffd"


def test_broken_utf8_in_the_middle(sandbox: Sandbox):
    r = sandbox.commands.run("printf 'a\\xffb\\xc3\\x28c'")
    assert r.stdout == "a\ufffdb\ufffd(c"


def test_multiline_output(sandbox: Sandbox):
    r = sandbox.commands.run("printf 'line1\\nline2\\n\\nline4\\n'")
    assert r.stdout == "line1\nline2\n\nline4\n"


def test_multiline_script(sandbox: Sandbox):
    script = "x=1\nfor i in 1 2 3; do\n  x=$((x * 2))\ndone\necho $x\n"
    assert sandbox.commands.run(script).stdout == "8\n"


def test_large_output_is_complete_and_ordered(sandbox: Sandbox):
    # ~1.9 MB, spread over many stream chunks.
    r = sandbox.commands.run("seq 1 300000")
    lines = r.stdout.splitlines()
    assert len(lines) == 300000
    assert lines[0] == "1" and lines[-1] == "300000"
    assert lines == [str(i) for i in range(1, 300001)]


def test_binary_heavy_output_length(sandbox: Sandbox):
    r = sandbox.commands.run("head -c 1048576 /dev/zero | tr '\\0' x")
    assert r.stdout == "x" * 1048576


def test_env_vars_per_command(sandbox: Sandbox):
    envs = {"FOO": "bar", "WITH_SPACES": "a b  c", "QUOTES": "it's \"q\"", "EMPTY": ""}
    r = sandbox.commands.run(
        'printf "%s|%s|%s|%s|%s" "$FOO" "$WITH_SPACES" "$QUOTES" "${EMPTY-unset}" "${NOPE-unset}"',
        envs=envs,
    )
    assert r.stdout == "bar|a b  c|it's \"q\"||unset"


def test_env_vars_do_not_leak_between_commands(sandbox: Sandbox, unique: str):
    name = f"WARREN_T_{unique.upper()}"
    sandbox.commands.run("true", envs={name: "1"})
    assert sandbox.commands.run(f'echo "${{{name}-unset}}"').stdout == "unset\n"


def test_standard_environment(sandbox: Sandbox):
    r = sandbox.commands.run('printf "%s|%s|%s|%s" "$USER" "$LOGNAME" "$HOME" "$PATH"')
    user, logname, home, path = r.stdout.split("|")
    assert (user, logname, home) == ("user", "user", "/home/user")
    assert "/usr/bin" in path.split(":")


def test_default_cwd_is_home(sandbox: Sandbox):
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"


def test_cwd(sandbox: Sandbox, workdir: str):
    assert sandbox.commands.run("pwd", cwd=workdir).stdout == workdir + "\n"
    assert sandbox.commands.run("pwd", cwd="/").stdout == "/\n"


def test_missing_cwd_is_invalid_argument(sandbox: Sandbox, unique: str):
    with pytest.raises(InvalidArgumentException) as ei:
        sandbox.commands.run("pwd", cwd=f"/nonexistent-{unique}")
    assert f"/nonexistent-{unique}" in str(ei.value)


def test_default_user(sandbox: Sandbox):
    r = sandbox.commands.run('whoami; echo "$HOME"; id -u')
    name, home, uid = r.stdout.splitlines()
    assert name == "user"
    assert home == "/home/user"
    assert uid != "0"
    assert uid == sandbox.commands.run("id -u user", user="root").stdout.strip()


def test_root_user(sandbox: Sandbox):
    r = sandbox.commands.run('whoami; echo "$HOME"; id -u; pwd', user="root")
    assert r.stdout.splitlines() == ["root", "/root", "0", "/root"]


def test_explicit_default_user(sandbox: Sandbox):
    assert sandbox.commands.run("whoami", user="user").stdout == "user\n"


def test_supplementary_groups(sandbox: Sandbox):
    expected = sandbox.commands.run("id -G user", user="root").stdout.split()
    assert sandbox.commands.run("id -G").stdout.split() == expected


def test_unknown_user_is_rejected(sandbox: Sandbox, unique: str):
    with pytest.raises(AuthenticationException) as ei:
        sandbox.commands.run("whoami", user=f"nouser{unique}")
    assert f"nouser{unique}" in str(ei.value)


def test_stdin_closed_by_default(sandbox: Sandbox):
    # Without stdin=True the process gets no stdin pipe: `cat` reads EOF immediately.
    r = sandbox.commands.run("cat; echo rc=$?", timeout=10)
    assert r.stdout == "rc=0\n"


def test_timeout_raises_and_kills(sandbox: Sandbox, unique: str):
    marker = f"warren-timeout-{unique}"
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run(f"sleep 10 # {marker}", timeout=2)
    assert time.monotonic() - start < 9, "the command outlived its timeout"

    # The agent ends the process together with the stream (Connect-Timeout-Ms is its lifetime).
    def gone() -> bool:
        return not any(marker in " ".join(p.args) for p in sandbox.commands.list())

    wait_until(gone, timeout=5, message=f"process {marker} still listed after its timeout")


def test_timeout_not_hit(sandbox: Sandbox):
    r = sandbox.commands.run("sleep 0.2; echo done", timeout=10)
    assert r.stdout == "done\n"


def test_zero_timeout_means_unlimited(sandbox: Sandbox):
    assert sandbox.commands.run("echo ok", timeout=0).stdout == "ok\n"


def test_concurrent_commands(sandbox: Sandbox):
    def run(i: int) -> str:
        return sandbox.commands.run(f"sleep 0.{i % 3}; echo job-{i}").stdout

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, range(16)))
    assert results == [f"job-{i}\n" for i in range(16)]


def test_bash_login_shell_args(sandbox: Sandbox):
    # The SDK runs `/bin/bash -l -c <cmd>`; $0 and positional handling must be bash's.
    r = sandbox.commands.run('echo "$0"; shopt -q login_shell && echo login')
    assert r.stdout == "/bin/bash\nlogin\n"

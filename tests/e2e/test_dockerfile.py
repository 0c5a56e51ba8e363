"""Dockerfiles built by the server (Warren's extension of the build API: `dockerfile`,
`contextFilesHash`, `buildArgs` on `POST /v2/templates/{id}/builds/{buildID}`), and
`warren template build -f`: several stages with `COPY --from`, ARG with a build argument,
ENV, WORKDIR, USER, CMD as the start command, COPY from the uploaded context, refusals that
name their line, wildcard sources, and `.dockerignore`.

The builds start from `e2bdev/base` (Warren's `base`), so nothing is pulled or installed from
the internet. Built images are shared across runs: each build that must run its steps has a
per-run nonce in a RUN.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import time
import uuid

import pytest
from e2b import Sandbox

from support.warren import API_KEY, same_on_every_runtime, slow_on_vm, warren_bin


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _register(api, name: str) -> tuple[str, str]:
    r = api.post(api.base + "/v3/templates", json={"name": name})
    assert r.status_code == 202, r.text
    return r.json()["templateID"], r.json()["buildID"]


def _upload(api, tid: str, archive: bytes) -> str:
    digest = hashlib.sha256(archive).hexdigest()
    r = api.get(f"{api.base}/templates/{tid}/files/{digest}")
    assert r.status_code == 201, r.text
    if not r.json()["present"]:
        # The signed URL authenticates itself: no API key.
        up = __import__("requests").put(r.json()["url"], data=archive, timeout=60)
        assert up.status_code == 200, up.text
    return digest


def _wait(api, tid: str, bid: str) -> tuple[dict, list[str]]:
    logs: list[str] = []
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        r = api.get(f"{api.base}/templates/{tid}/builds/{bid}/status", params={"logsOffset": len(logs)})
        assert r.status_code == 200, r.text
        page = r.json()
        logs += [e["message"] for e in page["logEntries"]]
        if page["status"] in ("ready", "error") and not page["logEntries"]:
            return page, logs
        if not page["logEntries"]:
            time.sleep(0.5)
    pytest.fail(f"build {bid} did not end; log so far: {logs[-20:]}")


MULTI_STAGE = """\
# A two-stage build: the first stage makes a file, the second copies it.
ARG BASE=e2bdev/base
FROM ${{BASE}} AS maker
RUN mkdir -p /out/sub && echo "made {nonce}" > /out/sub/artifact \\
 && ln -s sub/artifact /out/link
RUN echo never-copied > /elsewhere

FROM $BASE
ARG GREETING=hello
ENV WHO=world
ENV MSG="${{GREETING}} $WHO"
WORKDIR /srv/app
COPY --from=maker /out/ ./from-maker/
COPY app.txt conf/ ./
LABEL purpose=test
EXPOSE 8080
COPY *.txt /srv/globbed/
USER worker
RUN id -un > /tmp/who && echo "$MSG" > /tmp/msg
CMD ["python3", "-m", "http.server", "8080"]
"""


def test_a_multi_stage_dockerfile_builds_and_runs(server, api):
    slow_on_vm('two stages built in emulation (vm builds: test_templates.py)')
    name = _name("df-multi")
    tid, bid = _register(api, name)
    ctx = _upload(api, tid, _tar({"app.txt": b"app file\n", "b.txt": b"b\n", "conf/settings.ini": b"[x]\n", "conf/c.txt": b"c\n"}))
    body = {
        "dockerfile": MULTI_STAGE.format(nonce=uuid.uuid4().hex),
        "contextFilesHash": ctx,
        "buildArgs": {"GREETING": "hi"},
    }
    r = api.post(f"{api.base}/v2/templates/{tid}/builds/{bid}", json=body)
    assert r.status_code == 202, r.text
    page, logs = _wait(api, tid, bid)
    assert page["status"] == "ready", (page, logs[-30:])
    assert any("building stage 'maker'" in l for l in logs), logs
    assert any("Dockerfile line 15: LABEL ignored" in l for l in logs), logs
    assert not any(l.startswith("CACHED template image") for l in logs), logs
    # The same Dockerfile again: the stage and the template both come from the cache.
    tid2, bid2 = _register(api, name)
    assert tid2 == tid
    r = api.post(f"{api.base}/v2/templates/{tid}/builds/{bid2}", json=body)
    assert r.status_code == 202, r.text
    page, logs = _wait(api, tid, bid2)
    assert page["status"] == "ready", (page, logs[-30:])
    assert sum(l.startswith("CACHED template image") for l in logs) == 2, logs
    sb = Sandbox.create(name, timeout=60)
    try:
        run = lambda c: sb.commands.run(c).stdout.strip()  # noqa: E731
        # COPY --from: the directory's content, the symlink kept as a link.
        assert run("cat /srv/app/from-maker/sub/artifact").startswith("made ")
        assert run("readlink /srv/app/from-maker/link") == "sub/artifact"
        assert run("test -e /elsewhere && echo yes || echo no") == "no"
        # COPY from the context: a file, and a directory's content merged into the WORKDIR.
        assert run("cat /srv/app/app.txt") == "app file"
        assert run("cat /srv/app/settings.ini") == "[x]"
        # A wildcard copies what it matches at its depth only.
        assert run("ls /srv/globbed") == "app.txt\nb.txt"
        # USER and WORKDIR are the sandbox's defaults; ARG took the build argument.
        assert run("id -un") == "worker"
        assert run("pwd") == "/srv/app"
        assert run("cat /tmp/who") == "worker"
        assert run("cat /tmp/msg") == "hi world"
        # CMD is the start command: running once the create returned.
        assert "http.server" in run("ps -eo args")
    finally:
        sb.kill()


def test_a_failing_run_names_its_dockerfile_line(server, api):
    same_on_every_runtime('Dockerfile line numbers in failures')
    tid, bid = _register(api, _name("df-fail"))
    text = f"FROM e2bdev/base\n\nRUN echo {uuid.uuid4().hex}\nRUN exit 3\n"
    r = api.post(f"{api.base}/v2/templates/{tid}/builds/{bid}", json={"dockerfile": text})
    assert r.status_code == 202, r.text
    page, _ = _wait(api, tid, bid)
    assert page["status"] == "error"
    assert "Dockerfile line 4: failed to run command 'exit 3'" in page["reason"]["message"], page


def test_refused_dockerfiles_and_conflicts_are_400_with_the_line(server, api):
    same_on_every_runtime('Dockerfile parsing')
    tid, bid = _register(api, _name("df-bad"))
    url = f"{api.base}/v2/templates/{tid}/builds/{bid}"
    cases = [
        ({"dockerfile": "FROM e2bdev/base\nRUN true\nSHELL [\"/bin/zsh\", \"-c\"]\n"},
         "Dockerfile line 3: SHELL is not supported"),
        ({"dockerfile": "FROM e2bdev/base\nCOPY --link a /a\n", "contextFilesHash": "a" * 64},
         "Dockerfile line 2: COPY --link is not supported"),
        ({"dockerfile": "FROM e2bdev/base\nRUN <<EOF\necho\nEOF\n"}, "Dockerfile line 2: RUN with a heredoc"),
        ({"dockerfile": "FROM e2bdev/base\n\nCOPY a.txt /a\n"}, "Dockerfile line 3: COPY needs the build context"),
        ({"dockerfile": "FROM e2bdev/base\nCOPY --from=alpine:3 /x /x\n"}, "Dockerfile line 2: COPY --from=alpine:3"),
        ({"dockerfile": "FROM e2bdev/base\n", "fromTemplate": "base", "steps": []},
         "dockerfile conflicts with steps, fromTemplate"),
        ({"fromTemplate": "base", "buildArgs": {"A": "b"}}, "go with dockerfile"),
    ]
    for body, want in cases:
        r = api.post(url, json=body)
        assert r.status_code == 400, (body, r.status_code, r.text)
        assert want in r.json()["message"], (want, r.json())
    # A context that was never uploaded is refused before the build starts.
    r = api.post(url, json={"dockerfile": "FROM e2bdev/base\nCOPY a /a\n", "contextFilesHash": "b" * 64})
    assert r.status_code == 400 and "never uploaded" in r.json()["message"], r.text
    # Nothing of that started the build: it still takes a good request.
    status = api.get(f"{api.base}/templates/{tid}/builds/{bid}/status").json()
    assert status["status"] == "waiting", status


def _cli_builds_dockerfiles(binary: str) -> bool:
    out = subprocess.run([binary, "template", "build", "--help"], capture_output=True, text=True)
    return "--build-arg" in out.stdout


def test_the_cli_builds_a_context_minus_its_dockerignore(server, tmp_path):
    same_on_every_runtime('the CLI and .dockerignore')
    binary = warren_bin()
    if not _cli_builds_dockerfiles(binary):
        pytest.skip(f"{binary} has no `template build -f` (the Dockerfile build is not wired into the CLI)")
    (tmp_path / "kept.txt").write_text("kept\n")
    (tmp_path / "secret.txt").write_text("must not be sent\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("log\n")
    (tmp_path / ".dockerignore").write_text("secret.txt\nlogs\n")
    (tmp_path / "Dockerfile").write_text(
        f"FROM e2bdev/base\nARG N\nRUN echo $N\nCOPY . /ctx/\nRUN ls -A /ctx > /tmp/ctx-files\n"
    )
    name = _name("df-cli")
    env = dict(os.environ, WARREN_URL=server.url, WARREN_API_KEY=API_KEY)
    out = subprocess.run(
        [binary, "template", "build", name, str(tmp_path), "--build-arg", f"N={uuid.uuid4().hex}"],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "RUN echo" in out.stdout, out.stdout
    sb = Sandbox.create(name, timeout=60)
    try:
        files = sb.commands.run("cat /tmp/ctx-files").stdout.split()
        assert sorted(files) == [".dockerignore", "Dockerfile", "kept.txt"], files
    finally:
        sb.kill()
    # A refused Dockerfile: exit code 1 and the line, before anything is built.
    (tmp_path / "Dockerfile").write_text("FROM e2bdev/base\nONBUILD RUN x\n")
    out = subprocess.run([binary, "template", "build", name, str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode != 0 and "Dockerfile line 2: ONBUILD is not supported" in out.stderr, out

"""Templates from registry images (`Template().from_image(...)`), pulled from a real registry
on loopback (tests/support/registry.py) that the server reaches as Docker Hub's mirror.

The image is a busybox root filesystem with no bash, sudo, glibc or `user` account: the agent
is injected and the default-user phase is applied where the image allows it.
"""

from __future__ import annotations

import uuid

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from support.registry import Layer, busybox_layer


def _build(tpl, name):
    logs: list[str] = []
    info = Template.build(tpl, name, on_build_logs=lambda l: logs.append(l.message))
    return info, logs


def test_a_bare_image_from_a_registry_builds_and_runs(server, registry):
    nonce = uuid.uuid4().hex[:12]
    # The top layer removes a file and empties a directory of the one below (whiteouts).
    top = (
        Layer()
        .dir("srv")
        .file("srv/.wh.gone.txt", b"")
        .dir("srv/cache")
        .file("srv/cache/.wh..wh..opq", b"")
        .file("srv/cache/new", b"fresh\n")
        .file("srv/hello.txt", f"hello {nonce}\n".encode())
        .gz()
    )
    digest = registry.push(
        "library/tiny", nonce, [busybox_layer(), top],
        {"Env": ["PATH=/usr/bin:/bin", "GREETING=hi from the image"], "WorkingDir": "/srv", "Cmd": ["sh"]},
    )
    name = f"tiny-{nonce}"
    # `tiny:<tag>` is Docker Hub's library/tiny, served by the mirror.
    tpl = Template().from_image(f"tiny:{nonce}").run_cmd(
        'echo "$GREETING in $(pwd)" > /tmp/made-by-build; id -un >> /tmp/made-by-build'
    )
    info, logs = _build(tpl, name)
    assert any(digest in l for l in logs), logs
    sb = Sandbox.create(name, timeout=60)
    try:
        run = lambda c: sb.commands.run(c).stdout.strip()
        assert run("cat /srv/hello.txt") == f"hello {nonce}"
        assert run("test -e /srv/gone.txt && echo present || echo gone") == "gone"
        assert run("ls /srv/cache") == "new"
        # The image's Env reached the build, which ran in its WorkingDir as the default user.
        assert run("cat /tmp/made-by-build") == "hi from the image in /srv\nuser"
        assert run("id -un") == "user"
        # Build-time variables stay out of the sandbox's processes (E2B semantics).
        assert run("echo \"[$GREETING]\"") == "[]"
    finally:
        sb.kill()
    # The same image again: pulled layers come from the cache and the image is reused.
    _, again = _build(Template().from_image(f"tiny:{nonce}").run_cmd("true"), name)
    assert any(l.startswith("CACHED image") for l in again), again


def test_a_missing_image_fails_the_base_step_clearly(server, registry):
    with pytest.raises(BuildException) as e:
        _build(Template().from_image(f"nope-{uuid.uuid4().hex[:8]}:1"), f"missing-{uuid.uuid4().hex[:8]}")
    assert "not found" in str(e.value), str(e.value)

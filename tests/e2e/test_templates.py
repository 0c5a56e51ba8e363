"""Template builds through the unmodified E2B SDK: every step type, the cache, failures that
name their step, start and ready commands, names and deletion, and bad input.

The builds start from `base` (what `from_base_image()` asks for), so they need no network
beyond loopback: nothing is installed from the internet.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
import uuid

import pytest
import requests
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from support.warren import same_on_every_runtime, slow_on_vm


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def context(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text('print("hi from app")\n')
    os.symlink("main.py", tmp_path / "app" / "link.py")
    (tmp_path / "a.txt").write_text("alpha\n")
    (tmp_path / "b.txt").write_text("beta\n")
    (tmp_path / "notes.md").write_text("not copied\n")
    return tmp_path


def build(tpl, name, **kw):
    logs: list[str] = []
    info = Template.build(tpl, name, on_build_logs=lambda l: logs.append(l.message), **kw)
    return info, logs


def test_every_step_type_lands_in_the_sandbox(server, context):
    slow_on_vm('seven step types in one build (vm builds: test_start_and_ready_commands_run_before_create_returns)')
    name = _name("steps")
    tpl = (
        Template(file_context_path=str(context))
        .from_base_image()
        # A fresh first step: images are cached by content across runs and runtimes.
        .run_cmd(f"echo building as $(id -un) {uuid.uuid4().hex}")
        .set_envs({"GREETING": "hello", "B": "$GREETING world"})
        .run_cmd("echo $B > /tmp/b.txt")
        .copy("app", "/app")
        .copy("*.txt", "/opt/texts/", user="root", mode=0o640)
        .make_dir("/srv/data", user="root")
        .make_symlink("/opt/texts/a.txt", "/srv/data/a-link", user="root")
        .run_cmd("touch /srv/data/made-by-root && rm -f /srv/data/missing", user="root")
        .set_user("worker")
        .run_cmd("id -un > /tmp/who-built")
        .set_workdir("/home/worker/project")
        .run_cmd("pwd > here.txt")
    )
    info, logs = build(tpl, name)
    assert info.template_id and info.build_id
    assert any("[stdout]: building as user" in l for l in logs), logs
    sb = Sandbox.create(name, timeout=60)
    try:
        run = lambda c: sb.commands.run(c).stdout.strip()  # noqa: E731
        # The final USER and WORKDIR are the sandbox's defaults.
        assert run("id -un") == "worker"
        assert run("pwd") == "/home/worker/project"
        assert run("cat here.txt") == "/home/worker/project"
        assert run("cat /tmp/who-built") == "worker"
        # ENV expands against the build env, and build-time variables stay out of sandboxes.
        assert run("cat /tmp/b.txt") == "hello world"
        assert run("echo \"[$GREETING]\"") == "[]"
        # COPY: a directory is merged, symlinks stay links, the owner defaults to the build's
        # user; a glob copies every match into a directory with the given owner and mode.
        assert run("python3 /app/link.py") == "hi from app"
        assert run("readlink /app/link.py") == "main.py"
        assert run("stat -c %U /app/main.py /app") == "user\nuser"
        assert run("ls /opt/texts") == "a.txt\nb.txt"
        assert run("stat -c '%U %a' /opt/texts/a.txt") == "root 640"
        assert run("readlink /srv/data/a-link") == "/opt/texts/a.txt"
        assert run("test -e /srv/data/made-by-root && echo yes") == "yes"
    finally:
        sb.kill()


# Three builds, two of them packed: under TCG each vm build exports and packs a whole root
# filesystem, so this test needs more than the suite's default limit.
@pytest.mark.timeout(900)
def test_unchanged_steps_come_from_the_cache(server, context):
    slow_on_vm('three builds, two packed (the cache is the same code on both runtimes)')
    name = _name("cache")
    # Unique to this run, so the first build is cold.
    one = f"echo one > /tmp/one # {uuid.uuid4().hex}"
    base = Template(file_context_path=str(context)).from_base_image().run_cmd(one)
    _, cold = build(base.run_cmd("echo two > /tmp/two"), name)
    assert not any(l.startswith("CACHED") for l in cold), cold
    # The same steps again: nothing runs.
    _, warm = build(
        Template(file_context_path=str(context)).from_base_image().run_cmd(one).run_cmd("echo two > /tmp/two"),
        name,
    )
    assert any(l.startswith("CACHED [builder 1/2]") for l in warm), warm
    assert any(l.startswith("CACHED [builder 2/2]") for l in warm), warm
    # A changed last step: the first is cached, the second runs.
    _, partial = build(
        Template(file_context_path=str(context)).from_base_image().run_cmd(one).run_cmd("echo three > /tmp/two"),
        name,
    )
    assert any(l.startswith("CACHED [builder 1/2]") for l in partial), partial
    assert any(l.startswith("[builder 2/2] RUN echo three") for l in partial), partial
    sb = Sandbox.create(name, timeout=60)
    try:
        assert sb.commands.run("cat /tmp/one /tmp/two").stdout == "one\nthree\n"
    finally:
        sb.kill()


def test_skip_cache_rebuilds_every_step(server, context):
    same_on_every_runtime("what skip_cache does to the cache")
    name = _name("forced")
    one = f"echo one > /tmp/one # {uuid.uuid4().hex}"
    tpl = lambda: Template(file_context_path=str(context)).from_base_image().run_cmd(one).run_cmd("echo 2 > /tmp/two")
    build(tpl(), name)
    _, forced = build(tpl(), name, skip_cache=True)
    assert not any(l.startswith("CACHED") for l in forced), forced
    assert any(l.startswith("[builder 2/2] RUN echo 2") for l in forced), forced


def test_a_failing_step_names_itself(server, context):
    same_on_every_runtime('how a failed step is reported')
    tpl = Template().from_base_image().run_cmd("true").run_cmd("echo oops >&2; exit 3")
    with pytest.raises(BuildException) as e:
        build(tpl, _name("fails"))
    assert "failed to run command 'echo oops >&2; exit 3'" in str(e.value)
    assert "exit status 3" in str(e.value)
    tpl = Template().from_base_image().run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as e:
        build(tpl, _name("nouser"))
    assert "invalid username: 'root123'" in str(e.value)


def test_the_failed_step_is_in_the_status(server, api):
    same_on_every_runtime('the status of a failed build')
    r = api.post(server.url + "/v3/templates", json={"name": _name("status")})
    assert r.status_code == 202, r.text
    t = r.json()
    r = api.post(
        f"{server.url}/v2/templates/{t['templateID']}/builds/{t['buildID']}",
        json={"fromImage": "e2bdev/base", "force": False,
              "steps": [{"type": "RUN", "args": ["true"], "force": False},
                        {"type": "RUN", "args": ["false"], "force": False}]},
    )
    assert r.status_code == 202, r.text
    status = None
    for _ in range(600):
        status = api.get(f"{server.url}/templates/{t['templateID']}/builds/{t['buildID']}/status").json()
        if status["status"] in ("ready", "error"):
            break
        time.sleep(0.2)
    assert status["status"] == "error", status
    assert status["reason"]["step"] == "2", status
    # Log pages honour the offset and end with an empty page.
    first = api.get(f"{server.url}/templates/{t['templateID']}/builds/{t['buildID']}/status?logsOffset=0").json()
    n = len(first["logEntries"])
    assert n > 0
    end = api.get(f"{server.url}/templates/{t['templateID']}/builds/{t['buildID']}/status?logsOffset={n}").json()
    assert end["logEntries"] == []


def test_start_and_ready_commands_run_before_create_returns(server, context):
    name = _name("svc")
    tpl = (
        Template()
        .from_base_image()
        .run_cmd("mkdir -p /tmp/site && echo served > /tmp/site/index.html")
        .set_workdir("/tmp/site")
        .set_envs({"SVC_MODE": "from-build"})
        .set_start_cmd("date +%s.%N > /tmp/started; echo $SVC_MODE > /tmp/mode; sleep 1; "
                       "python3 -m http.server 8080",
                       "curl -sf -o /dev/null localhost:8080")
    )
    build(tpl, name, cpu_count=2, memory_mb=768)
    sandboxes = []
    try:
        started = []
        for _ in range(2):
            asked = time.time()
            sb = Sandbox.create(name, timeout=60)
            sandboxes.append(sb)
            # Its ready command passed before create returned: no retry needed.
            assert sb.commands.run("curl -s localhost:8080/index.html").stdout == "served\n"
            # The start command ran with the build's environment.
            assert sb.commands.run("cat /tmp/mode").stdout == "from-build\n"
            started.append((asked, float(sb.commands.run("cat /tmp/started").stdout)))
        (first_asked, first), (second_asked, second) = started
        if os.environ.get("WARREN_E2E_RUNTIME", "ns") == "vm":
            # Every VM is a fork of the template's snapshot, taken once its service was
            # ready: the second sandbox's service is the one started for the first create.
            assert second == first and second < second_asked, started
        else:
            # A namespace sandbox starts its own service.
            assert first > first_asked and second > second_asked, started
        if os.environ.get("WARREN_E2E_RUNTIME", "ns") == "vm":
            # The template's cpuCount and memoryMB are the VM's.
            sb = sandboxes[1]
            assert sb.commands.run("nproc").stdout.strip() == "2"
            kib = int(sb.commands.run("awk '/MemTotal/ {print $2}' /proc/meminfo").stdout)
            assert 600 * 1024 < kib <= 768 * 1024, kib
    finally:
        for sb in sandboxes:
            sb.kill()


def test_names_listing_and_deletion(server, api, context):
    same_on_every_runtime('names, tags, listing and deletion')
    name = _name("named")
    info, _ = build(Template().from_base_image().run_cmd("true"), name)
    assert Template.exists(name)
    assert not Template.exists(_name("never-built"))
    assert Template.exists("base")
    listed = {t["templateID"]: t for t in api.get(server.url + "/templates").json()}
    assert info.template_id in listed
    assert listed[info.template_id]["aliases"] == [name]
    assert listed[info.template_id]["buildStatus"] == "ready"
    assert listed[info.template_id]["spawnCount"] == 0
    # Tags name builds: assigned, listed, used in a create, removed.
    tagged = Template.assign_tags(f"{name}:default", ["v1", "prod"])
    assert sorted(tagged.tags) == ["prod", "v1"] and tagged.build_id == info.build_id
    tags = {t.tag: t.build_id for t in Template.get_tags(info.template_id)}
    assert tags == {"default": info.build_id, "v1": info.build_id, "prod": info.build_id}
    Template.remove_tags(name, ["prod"])
    assert {t.tag for t in Template.get_tags(name)} == {"default", "v1"}
    r = api.post(server.url + "/v2/sandboxes", json={"templateID": f"{name}:prod"})
    assert r.status_code == 404, r.text
    r = api.delete(server.url + "/templates/tags", json={"name": name, "tags": ["default"]})
    assert r.status_code == 400 and "default" in r.json()["message"], r.text
    r = api.post(server.url + "/templates/tags", json={"target": f"{name}:nope", "tags": ["x"]})
    assert r.status_code == 404, r.text
    r = api.post(server.url + "/templates/tags", json={"target": name, "tags": ["Bad Tag"]})
    assert r.status_code == 400, r.text
    # Deletion is refused while a sandbox uses the template.
    sb = Sandbox.create(f"{name}:v1", timeout=60)
    try:
        r = api.delete(f"{server.url}/templates/{info.template_id}")
        assert r.status_code == 409, r.text
        assert sb.sandbox_id in r.json()["message"]
        listed = {t["templateID"]: t for t in api.get(server.url + "/templates").json()}
        assert listed[info.template_id]["spawnCount"] == 1
        assert listed[info.template_id]["lastSpawnedAt"]
    finally:
        sb.kill()
    r = api.delete(f"{server.url}/templates/{info.template_id}")
    assert r.status_code == 204, r.text
    assert not Template.exists(name)
    r = api.post(server.url + "/v2/sandboxes", json={"templateID": name})
    assert r.status_code == 404, r.text


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for n, data in members:
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_bad_build_input_gets_clear_errors(server, api):
    same_on_every_runtime('input checks before any build')
    r = api.post(server.url + "/v3/templates", json={"name": "Not A Name!"})
    assert r.status_code == 400 and "Invalid name" in r.json()["message"], r.text
    r = api.post(server.url + "/v3/templates", json={"name": "base"})
    assert r.status_code == 400, r.text
    r = api.post(server.url + "/v3/templates", json={"name": _name("bad"), "cpuCount": 3})
    assert r.status_code == 400 and "cpuCount" in r.json()["message"], r.text
    t = api.post(server.url + "/v3/templates", json={"name": _name("bad")}).json()
    trigger = f"{server.url}/v2/templates/{t['templateID']}/builds/{t['buildID']}"
    for steps, want in [
        ([{"type": "FROB", "args": ["x"]}], "step 1 (FROB): unknown step type"),
        ([{"type": "RUN", "args": []}], "step 1 (RUN)"),
        ([{"type": "COPY", "args": ["a", "/a"]}], "filesHash is required"),
        ([{"type": "COPY", "args": ["a", "/a"], "filesHash": "f" * 64}], "never uploaded"),
    ]:
        r = api.post(trigger, json={"fromImage": "e2bdev/base", "steps": steps})
        assert r.status_code == 400, r.text
        assert want in r.json()["message"], r.text
    r = api.get(f"{server.url}/templates/{t['templateID']}/files/not-a-hash")
    assert r.status_code == 400, r.text
    # Upload links authenticate themselves; hostile archives are refused and leave nothing.
    # (A hash of its own: uploads are kept per team across runs.)
    h = uuid.uuid4().hex * 2
    link = api.get(f"{server.url}/templates/{t['templateID']}/files/{h}")
    assert link.status_code == 201, link.text
    assert link.json()["present"] is False
    url = link.json()["url"]
    r = requests.put(url.replace("token=", "token=0"), data=_tar([("a", b"x")]), timeout=30)
    assert r.status_code == 403, r.text
    for members, why in [([("../escape", b"x")], ".."), ([("/etc/passwd", b"x")], "absolute")]:
        r = requests.put(url, data=_tar(members), timeout=30)
        assert r.status_code == 400, r.text
        assert why in r.json()["message"], r.text
    assert api.get(f"{server.url}/templates/{t['templateID']}/files/{h}").json()["present"] is False
    r = requests.put(url, data=_tar([("ok.txt", b"fine")]), timeout=30)
    assert r.status_code == 200, r.text
    assert api.get(f"{server.url}/templates/{t['templateID']}/files/{h}").json()["present"] is True
    # Unknown builds and templates.
    r = api.get(f"{server.url}/templates/{t['templateID']}/builds/{uuid.uuid4()}/status")
    assert r.status_code == 404, r.text
    r = api.get(f"{server.url}/templates/nope/builds/{t['buildID']}/status")
    assert r.status_code == 404, r.text


def test_build_in_background_reports_building_at_once(server):
    same_on_every_runtime('build scheduling')
    # Unique to this run: a fully cached build would be ready at once.
    tpl = Template().from_base_image().run_cmd(f"sleep 2 # {uuid.uuid4().hex}")
    info = Template.build_in_background(tpl, _name("bg"))
    status = Template.get_build_status(info)
    assert status.status.value == "building", status
    # Let it finish, so the server is not stopped mid-build.
    for _ in range(600):
        if Template.get_build_status(info).status.value in ("ready", "error"):
            break
        time.sleep(0.2)
    assert Template.get_build_status(info).status.value == "ready"

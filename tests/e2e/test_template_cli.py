"""`warren template ...` over the API: list, info, logs, tags, delete, disk use and prune."""

from __future__ import annotations

import json
import uuid

from e2b import Sandbox, Template

from support.registry import busybox_layer
from support.warren import same_on_every_runtime
from test_cli import warren


def _ok(r):
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


def test_template_commands_show_tag_log_and_delete(server):
    same_on_every_runtime('the template CLI')
    name = f"cli-{uuid.uuid4().hex[:8]}"
    info = Template.build(Template().from_base_image().run_cmd("true"), name)
    listed = json.loads(_ok(warren(server, "template", "list", "--json")))
    assert any(t["templateID"] == info.template_id for t in listed["built"]), listed
    assert {c["name"] for c in listed["catalog"]} >= {"base"}
    out = _ok(warren(server, "template", "info", name))
    assert info.template_id in out and info.build_id in out, out
    log = _ok(warren(server, "template", "logs", name))
    assert f"Template image" in log or "CACHED template image" in log, log
    _ok(warren(server, "template", "tag", name, "v7"))
    tags = json.loads(_ok(warren(server, "template", "tags", name, "--json")))
    assert {t["tag"] for t in tags} == {"default", "v7"}, tags
    _ok(warren(server, "template", "untag", name, "v7"))
    r = warren(server, "template", "untag", name, "default")
    assert r.returncode != 0 and "default" in r.stderr, (r.stdout, r.stderr)
    _ok(warren(server, "template", "delete", name))
    r = warren(server, "template", "info", name)
    assert r.returncode != 0 and "no template" in r.stderr, (r.stdout, r.stderr)


def test_prune_frees_what_nothing_uses_and_keeps_what_is_tagged(server, registry):
    # Deleting a snapshot is each runtime's own (tested with it); what prune picks is not.
    same_on_every_runtime("what prune keeps and frees")
    name = f"prune-{uuid.uuid4().hex[:8]}"
    nonce = uuid.uuid4().hex
    # Two builds of one name: the first one's image is then untagged.
    Template.build(Template().from_base_image().run_cmd(f"echo first > /tmp/v # {nonce}"), name)
    Template.build(Template().from_base_image().run_cmd(f"echo second > /tmp/v # {nonce}"), name)
    before = json.loads(_ok(warren(server, "template", "disk", "--json")))
    assert before["imagesUnused"]["count"] >= 1 and before["layers"]["count"] >= 1, before
    freed = json.loads(_ok(warren(server, "template", "prune", "--json")))
    assert freed["imagesUnused"]["count"] >= 1 and freed["prunableBytes"] > 0, freed
    after = json.loads(_ok(warren(server, "template", "disk", "--json")))
    assert after["imagesUnused"]["count"] == 0 and after["layers"]["count"] == 0, after
    assert after["imagesInUse"]["count"] >= 1, after
    # The tagged build still runs.
    sb = Sandbox.create(name, timeout=60)
    try:
        assert sb.commands.run("cat /tmp/v").stdout == "second\n"
    finally:
        sb.kill()
    # Pulls still work after their layer cache was emptied.
    registry.push("library/after-prune", nonce[:12], [busybox_layer()], {"Cmd": ["sh"]})
    Template.build(Template().from_image(f"after-prune:{nonce[:12]}").run_cmd("true"), f"{name}-pulled")

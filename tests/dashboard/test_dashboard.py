"""The web dashboard served by `warren serve` under /dashboard/, in headless chromium: log in,
find a sandbox, run a command in its terminal, upload a file, pause and resume it."""

from __future__ import annotations

import os
import re
import uuid

import pytest
import requests
from support.warren import API_KEY
from playwright.sync_api import expect


def _shot(page, shots: str, name: str) -> None:
    page.screenshot(path=os.path.join(shots, f"{name}.png"), full_page=True)


def test_assets_are_served_with_types_and_a_strict_policy(server):
    index = requests.get(server.url + "/dashboard/", timeout=10)
    assert index.status_code == 200, "the dashboard is not built into this binary: " + index.text[:300]
    assert index.headers["content-type"].startswith("text/html")
    csp = index.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert index.headers["x-content-type-options"] == "nosniff"
    # No inline scripts: every script is a file of this origin.
    scripts = re.findall(r"<script[^>]*>", index.text)
    assert scripts and all('src="/dashboard/assets/' in s for s in scripts), scripts
    js = re.search(r'src="(/dashboard/assets/[^"]+\.js)"', index.text).group(1)
    asset = requests.get(server.url + js, timeout=10)
    assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]
    assert "immutable" in asset.headers["cache-control"]
    css = re.search(r'href="(/dashboard/assets/[^"]+\.css)"', index.text).group(1)
    assert requests.get(server.url + css, timeout=10).headers["content-type"].startswith("text/css")
    # The page's own routes get the page; a missing asset is a 404, not the page.
    deep = requests.get(server.url + "/dashboard/sandboxes/anything", timeout=10)
    assert deep.status_code == 200 and deep.text == index.text
    assert requests.get(server.url + "/dashboard/assets/missing.js", timeout=10).status_code == 404
    bare = requests.get(server.url + "/dashboard", timeout=10, allow_redirects=False)
    assert bare.status_code in (301, 308) and bare.headers["location"] == "/dashboard/"
    # Serving the page opened no data to callers without a key.
    assert requests.get(server.url + "/v2/sandboxes", timeout=10).status_code == 401


@pytest.fixture
def sandbox(server):
    from e2b import Sandbox

    tag = uuid.uuid4().hex[:12]
    sbx = Sandbox.create(timeout=600, metadata={"suite": "dashboard", "run": tag}, request_timeout=300)
    yield sbx, tag
    sbx.kill()


def test_dashboard_drives_a_sandbox(server, sandbox, browser_page, shots, tmp_path):
    sbx, tag = sandbox
    page = browser_page
    page.goto(server.url + "/dashboard/")

    # A wrong key is refused with a message, and not kept.
    page.fill("#api-key", "not-a-key")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login-status [role=alert]")
    assert "not accepted" in page.inner_text("#login-status")
    _shot(page, shots, "01-login-refused")

    page.fill("#api-key", API_KEY)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#sandboxes")
    assert page.evaluate("sessionStorage.getItem('warren.apiKey')") == API_KEY

    # The list, narrowed by metadata to this test's sandbox.
    page.fill("#filter-metadata", f"run={tag}")
    page.click("#filters button[type=submit]")
    row = page.locator(f"#sandboxes tr[data-sandbox='{sbx.sandbox_id}']")
    row.wait_for()
    expect(page.locator("#sandboxes tbody tr")).to_have_count(1)
    assert row.get_attribute("data-state") == "running"
    assert f"run={tag}" in row.inner_text()
    _shot(page, shots, "02-sandboxes")
    # The state filter: a running sandbox is not among the paused ones.
    page.uncheck("#filter-running")
    expect(page.locator("#sandboxes tbody tr")).to_have_count(0)
    page.check("#filter-running")
    expect(page.locator("#sandboxes tbody tr")).to_have_count(1)
    # A filter that matches nothing shows nothing.
    page.fill("#filter-template", "no-such-template")
    page.click("#filters button[type=submit]")
    expect(page.locator("#sandboxes tbody tr")).to_have_count(0)
    page.fill("#filter-template", "")
    page.click("#filters button[type=submit]")
    row.wait_for()

    # The sandbox's page: live metrics first.
    row.locator("a").click()
    page.wait_for_selector("#details[data-state=running]")
    expect(page.locator("#metrics-status")).to_contain_text("CPU", timeout=30_000)
    assert page.locator("#chart-cpu canvas").count() == 1
    # Live: the page keeps polling, and the chart grows.
    expect(page.locator("#chart-cpu")).to_have_attribute("data-points", re.compile(r"^([2-9]|\d\d+)$"), timeout=30_000)
    _shot(page, shots, "03-sandbox-metrics")

    # The terminal: a command typed into xterm.js runs in the sandbox and its output shows.
    page.click("button[data-tab=Terminal]")
    page.wait_for_selector("#terminal[data-ready=true]")
    page.click("#terminal")
    page.keyboard.type("echo dash-$((6*7)) from $(whoami)")
    page.keyboard.press("Enter")
    expect(page.locator("#terminal .xterm-rows")).to_contain_text("dash-42 from user", timeout=30_000)
    _shot(page, shots, "04-terminal")

    # Files: upload one, see it listed, and find it in the sandbox with its content.
    page.click("button[data-tab=Files]")
    page.wait_for_selector("#files tbody tr")
    upload = tmp_path / "from-the-dashboard.txt"
    content = f"uploaded by the dashboard test {tag}\n"
    upload.write_text(content)
    page.set_input_files("#files-upload", str(upload))
    page.wait_for_selector("#files tr[data-name='from-the-dashboard.txt']")
    assert sbx.files.read("/home/user/from-the-dashboard.txt") == content
    _shot(page, shots, "05-files")
    # ... and download it back.
    with page.expect_download() as download:
        page.click("#files tr[data-name='from-the-dashboard.txt'] button.download")
    assert download.value.suggested_filename == "from-the-dashboard.txt"
    with open(download.value.path()) as f:
        assert f.read() == content

    # Processes started through the API are listed (the terminal's shell ended with its tab).
    sbx.commands.run("sleep 600", background=True)
    page.click("button[data-tab=Processes]")
    expect(page.locator("#processes")).to_contain_text("sleep 600", timeout=30_000)

    # Pause, then resume, with the page's buttons; the API agrees each time.
    page.click("#action-pause")
    page.wait_for_selector("#details[data-state=paused]", timeout=180_000)
    assert requests.get(f"{server.url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": API_KEY},
                        timeout=10).json()["state"] == "paused"
    _shot(page, shots, "06-paused")
    page.click("#action-resume")
    page.wait_for_selector("#details[data-state=running]", timeout=180_000)
    assert requests.get(f"{server.url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": API_KEY},
                        timeout=10).json()["state"] == "running"
    assert sbx.files.read("/home/user/from-the-dashboard.txt") == content

    # Events: the pause and resume are there where the server records events; where it has no
    # events route the tab says so. Logs likewise show something either way.
    events = requests.get(f"{server.url}/events/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": API_KEY}, timeout=10)
    page.click("button[data-tab=Events]")
    if events.status_code == 200:
        expect(page.locator("#records")).to_contain_text("sandbox.lifecycle.paused")
        expect(page.locator("#records")).to_contain_text("sandbox.lifecycle.resumed")
        _shot(page, shots, "07-events")
    else:
        assert events.status_code == 404, events.text
        expect(page.locator("#panel")).to_contain_text("not available")
    page.click("button[data-tab=Logs]")
    expect(page.locator("#panel")).to_contain_text(re.compile(r"\S"))

    # Templates and snapshots: what the API lists, the page lists.
    h = {"X-API-KEY": API_KEY}
    templates = requests.get(server.url + "/templates", headers=h, timeout=30).json()
    page.click("header a[href='#/templates']")
    page.wait_for_selector("#templates")
    expect(page.locator("#templates tbody tr")).to_have_count(len(templates))
    _shot(page, shots, "08-templates")
    snap = requests.post(f"{server.url}/sandboxes/{sbx.sandbox_id}/snapshots", headers=h,
                         json={"name": f"dashboard-{tag}"}, timeout=300)
    assert snap.status_code == 201, snap.text
    try:
        page.click("header a[href='#/snapshots']")
        listed = page.locator(f"#snapshots tr:has-text('dashboard-{tag}')")
        expect(listed).to_have_count(1)
        assert sbx.sandbox_id in listed.inner_text()
        _shot(page, shots, "09-snapshots")
    finally:
        requests.delete(f"{server.url}/templates/{snap.json()['snapshotID']}", headers=h, timeout=60)

    # The key never appeared in a URL, and the page logged no errors (CSP violations included).
    assert not [u for u in page.requests if API_KEY in u]
    assert API_KEY not in page.url
    assert not page.errors, page.errors

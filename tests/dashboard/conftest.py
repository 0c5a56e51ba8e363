"""The dashboard suite: `warren serve` (the shared harness, tests/support) and Debian's
chromium driven by Playwright, headless, with a fresh profile per test.

WARREN_BIN, WARREN_E2E_DATA_DIR, WARREN_E2E_RUNTIME (default `ns`) and WARREN_REQUIRE_ALL as in
tests/e2e. WARREN_CHROMIUM: the browser (default /usr/bin/chromium). WARREN_DASHBOARD_SHOTS: where
screenshots go (default target/dashboard-screenshots). The browser reaches only the server on
loopback.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# The session-wide server of tests/e2e and its raw REST helper.
from support.fixtures import _registry, api, server  # noqa: F401 (fixtures)
from support.warren import ROOT, require

CHROMIUM = os.environ.get("WARREN_CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing that would reach past loopback (updates, sync, QUIC probes).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def shots():
    """The directory screenshots are saved to."""
    path = os.environ.get("WARREN_DASHBOARD_SHOTS", os.path.join(ROOT, "target", "dashboard-screenshots"))
    os.makedirs(path, exist_ok=True)
    print(f"dashboard screenshots: {path}")
    return path


@pytest.fixture
def browser_page(server):
    """A page in a fresh headless chromium profile; console errors are collected in
    `page.errors` (a CSP violation or an uncaught exception shows up there), request URLs in
    `page.requests`."""
    require(f"Debian's chromium at {CHROMIUM} (scripts/setup.sh installs it)", os.access(CHROMIUM, os.X_OK))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require("Python playwright (pip install -r tests/dashboard/requirements.txt)", False)
        raise
    profile = tempfile.mkdtemp(prefix="warren-dashboard-profile-")
    with sync_playwright() as p:
        # launch_persistent_context passes the fresh profile as --user-data-dir.
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            accept_downloads=True,
        )
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        page.errors = []  # type: ignore[attr-defined]
        # Chromium logs every 4xx as "Failed to load resource"; the page handles those (a wrong
        # key, an endpoint the server lacks). Anything else logged as an error counts.
        page.on(  # type: ignore[attr-defined]
            "console",
            lambda m: m.type == "error"
            and not m.text.startswith("Failed to load resource")
            and page.errors.append(m.text),
        )
        page.on("pageerror", lambda e: page.errors.append(str(e)))  # type: ignore[attr-defined]
        page.requests = []  # type: ignore[attr-defined]
        page.on("request", lambda r: page.requests.append(r.url))  # type: ignore[attr-defined]
        page.set_default_timeout(60_000)
        try:
            yield page
        finally:
            # What the page showed last: the first thing to look at when a test failed.
            shots = os.environ.get("WARREN_DASHBOARD_SHOTS", os.path.join(ROOT, "target", "dashboard-screenshots"))
            os.makedirs(shots, exist_ok=True)
            page.screenshot(path=os.path.join(shots, "last-page.png"), full_page=True)
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)

"""The fixtures several suites share, over `support.warren`. A suite's conftest imports the ones
it uses by name (pytest takes the fixtures it finds in a conftest's namespace), e.g.

    from support.fixtures import _registry, api, server  # noqa: F401 (fixtures)

`server` needs `_registry` beside it; `registry` needs `_registry` too.
"""

from __future__ import annotations

import pytest
import requests

from . import registry as loopback_registry
from . import warren


@pytest.fixture(scope="session")
def _registry():
    """A registry on loopback for templates built from images (None where this host has no
    `docker-registry`: the tests that need it then skip or fail through `require`)."""
    if not loopback_registry.available():
        yield None
        return
    r = loopback_registry.Registry()
    yield r
    r.stop()


@pytest.fixture
def registry(_registry):
    warren.require(
        "Debian's docker-registry and busybox-static (scripts/setup.sh installs them)", _registry is not None
    )
    assert loopback_registry.available()
    return _registry


@pytest.fixture(scope="session")
def server(_registry):
    """One `warren serve` for the session (`support.warren.session_server`)."""
    with warren.session_server(_registry) as srv:
        yield srv


@pytest.fixture
def api(server):
    """Raw REST helper for bad-input tests."""
    s = requests.Session()
    s.headers["X-API-KEY"] = warren.API_KEY
    s.base = server.url  # type: ignore[attr-defined]
    return s


@pytest.fixture
def outcome_within():
    """`outcome_within(seconds, call)`: what ended `call` within `seconds` (None: nothing did).
    For tests of "X cuts a stream": give the stream a client deadline far beyond `seconds`, so
    that only X can end the wait in time and a client timeout cannot pass for it."""
    return warren.outcome_within

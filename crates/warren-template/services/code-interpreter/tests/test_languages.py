"""Unit tests of language names as the SDKs send them (needs jupyter_client, as the image has)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
pytest.importorskip("jupyter_client", reason="jupyter_client is not installed (the image has it)")

from warren_interp import contexts  # noqa: E402


def test_aliases_case_and_blanks_normalise():
    assert contexts.normalise_language(None) == "python"
    assert contexts.normalise_language("  ") == "python"
    assert contexts.normalise_language("JS") == "javascript"
    assert contexts.normalise_language("Bash") == "bash"


def test_an_unknown_language_is_refused_with_what_is_available():
    with pytest.raises(contexts.UnsupportedLanguage, match="available: bash, javascript, python"):
        contexts.check_language("cobol")
    contexts.check_language("python")

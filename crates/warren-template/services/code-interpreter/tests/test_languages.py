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


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """A kernel directory holding the specs code-interpreter-v1 installs."""
    for spec in ("warren-python", "warren-bash", "warren-javascript", "warren-typescript"):
        (tmp_path / spec).mkdir()
    monkeypatch.setattr(contexts, "KERNEL_DIR", str(tmp_path))
    return tmp_path


def test_an_unknown_language_is_refused_with_what_is_available(kernels):
    available = "available: bash, javascript, python, typescript"
    with pytest.raises(contexts.UnsupportedLanguage, match=available):
        contexts.check_language("cobol")
    contexts.check_language("python")
    contexts.check_language(contexts.normalise_language("ts"))


def test_r_and_java_point_at_the_full_template_until_installed(kernels):
    with pytest.raises(contexts.UnsupportedLanguage, match="code-interpreter-full"):
        contexts.check_language("r")
    (kernels / "warren-r").mkdir()
    contexts.check_language("r")
    with pytest.raises(contexts.UnsupportedLanguage, match="available: bash, javascript, "
                       "python, r, typescript"):
        contexts.check_language("java")

"""Sphinx configuration of pathlock's API reference.

Build it from the repository root:

    pip install -e '.[docs]'
    python -m sphinx -b html docs/api build/docs
"""

import tomllib
from pathlib import Path

from sphinx.application import Sphinx

_pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
_project = tomllib.loads(_pyproject.read_text(encoding="utf-8"))["project"]

project = "pathlock"
author = "pathlock contributors"
copyright = "pathlock contributors"
release = _project["version"]
version = release

extensions = ["sphinx.ext.autodoc"]

# The docstrings are reStructuredText prose; the types go in the signatures.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"

html_theme = "alabaster"
html_title = f"pathlock {release}: API reference"

# Objects that callers receive from pathlock and never construct: their
# constructors' parameters are internal, so their signatures are left out.
_NO_CONSTRUCTOR = {
    "pathlock.CustomerLocks",
    "pathlock.Lease",
    "pathlock.WaitPolicy",
    "pathlock.waiting.Delays",
}


def _hide_constructor(
    _app: Sphinx,
    what: str,
    name: str,
    _obj: object,
    _options: object,
    _signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str | None] | None:
    if what == "class" and name in _NO_CONSTRUCTOR:
        return "", return_annotation
    return None


def setup(app: Sphinx) -> None:
    """Hide the constructors of the objects in ``_NO_CONSTRUCTOR``."""
    app.connect("autodoc-process-signature", _hide_constructor)

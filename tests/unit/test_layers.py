"""The modules of the package import each other in one direction only: no
import circle, counting the imports made inside functions (a circle that
works only because one side imports late is still a circle), not those made
for type checking alone (``if TYPE_CHECKING:``).

Read from the source with :mod:`ast`, so that it sees every import whether
or not it runs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import pathlock

PACKAGE = Path(pathlock.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported(module: str, path: Path) -> Iterator[str]:
    """The package's modules that ``module`` imports, anywhere in it but in
    ``if TYPE_CHECKING:`` blocks."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while nodes:
        node = nodes.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                nodes.extend(child.orelse)
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    name = f"{base}.{alias.name}"
                    yield name if name in MODULES else base
            nodes.append(child)


GRAPH = {
    module: {name for name in _imported(module, path) if name in MODULES and name != module}
    for module, path in MODULES.items()
}


def _circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(GRAPH[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def test_the_graph_is_read() -> None:
    # The reading itself: known arrows, one of them made inside a function.
    assert "pathlock._backends" in GRAPH["pathlock.migrate"]
    assert "pathlock.migrate" in GRAPH["pathlock._embedded"]
    assert "pathlock._core.limits" in GRAPH["pathlock._core.validation"]
    assert "pathlock.dialects" in GRAPH["pathlock._batch"]


def test_no_import_circle() -> None:
    assert _circles() == []


def test_a_circle_would_be_found() -> None:
    GRAPH["pathlock._core.limits"].add("pathlock._core.validation")
    try:
        assert _circles() == [["pathlock._core.limits", "pathlock._core.validation"]]
    finally:
        GRAPH["pathlock._core.limits"].discard("pathlock._core.validation")


# The modules that decide without I/O: the core (a request's steps, the queue
# rules, the values they decide on, the hints, the renewal schedule, the
# checks of callers' values), every module in its folder, and the public
# paths and wait policies. They run in tests and in the asyncio API's
# greenlets alike; none of them may need the database layer.
CORE = sorted(name for name in MODULES if name.startswith("pathlock._core"))
DECISIONS = (*CORE, "pathlock.paths", "pathlock.waiting")


def test_the_core_is_a_folder_of_its_own() -> None:
    assert "pathlock._core" in CORE
    assert {"pathlock._core.flow", "pathlock._core.fairness", "pathlock._core.records"} <= set(CORE)
    assert "pathlock._core.schedule" in CORE


# What the core may import besides itself: the public values and rules it
# decides on and with.
CORE_READS = {
    "pathlock.clock",
    "pathlock.errors",
    "pathlock.lease",
    "pathlock.paths",
    "pathlock.settings",
    "pathlock.types",
    "pathlock.waiting",
}


def test_the_core_imports_only_itself_and_the_public_values() -> None:
    outside = {
        (module, other)
        for module in CORE
        for other in GRAPH[module]
        if other not in CORE and other not in CORE_READS and other != "pathlock"
    }
    assert outside == set()


# Imports one module in a fresh interpreter without running the package's
# __init__ (which imports the whole API): what that module needs, only.
_IMPORT_ALONE = """
import importlib, json, sys, types
package = types.ModuleType("pathlock")
package.__path__ = [sys.argv[1]]
sys.modules["pathlock"] = package
importlib.import_module(sys.argv[2])
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(module: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALONE, str(PACKAGE), module],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout))


@pytest.mark.parametrize("module", DECISIONS)
def test_the_decisions_load_no_database_layer(module: str) -> None:
    loaded = _loaded_by(module)
    assert module in loaded
    database = sorted(
        name
        for name in loaded
        if name.split(".")[0] == "sqlalchemy"
        or name.startswith(("pathlock.dialects", "pathlock.schema", "pathlock._statements"))
    )
    assert database == []


def test_loading_one_module_alone_is_measured() -> None:
    # The measure itself: the store loads the database layer.
    loaded = _loaded_by("pathlock._store")
    assert {"sqlalchemy", "pathlock._statements", "pathlock.dialects"} <= loaded

"""docs/EXTENDING.md names files that exist, links to places that exist,
documents exactly the members of the dialect interface, and is right that a
new database touches no module outside pathlock/dialects/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pathlock import dialects
from pathlock.dialects.base import ASYNC_DRIVERS, Dialect

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "EXTENDING.md"

# Fenced code blocks: their contents are code, not references to the repository.
_FENCED = re.compile(r"^ *```.*?^ *```", re.DOTALL | re.MULTILINE)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A repository path: relative, at least one slash, a file of these kinds or a
# directory (a trailing slash). A segment with <...> is one the reader creates.
_PATH = re.compile(r"[\w.<>-]+(?:/[\w.<>*-]+)+(?:\.(?:py|md|toml|rst)|/)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def _prose(path: Path) -> str:
    return _FENCED.sub("", path.read_text(encoding="utf-8"))


def _paths() -> list[str]:
    return [span for span in _CODE_SPAN.findall(_prose(DOC)) if _PATH.fullmatch(span)]


def _exists(path: str) -> bool:
    parts = path.rstrip("/").split("/")
    for index, part in enumerate(parts):
        if "<" in part:  # a file to create: its directory must exist
            return (ROOT.joinpath(*parts[:index])).is_dir()
    if "*" in path:
        return any(ROOT.glob(path))
    target = ROOT / path
    return target.is_dir() if path.endswith("/") else target.is_file()


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file."""
    return {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        for heading in _HEADING.findall(_prose(path))
    }


def test_every_path_in_backticks_exists() -> None:
    paths = _paths()
    assert len(paths) > 20, f"too few paths found, is the pattern broken? {paths}"
    assert [path for path in paths if not _exists(path)] == []


def test_every_link_and_anchor_exists() -> None:
    broken = []
    for link in _LINK.findall(_prose(DOC)):
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        page = (DOC.parent / target).resolve() if target else DOC
        if not page.is_file() or (anchor and anchor not in _anchors(page)):
            broken.append(link)
    assert broken == []


def _interface_table() -> list[str]:
    """The first cells of the rows of the table headed ``| Member |``."""
    lines = _prose(DOC).splitlines()
    starts = [n for n, line in enumerate(lines) if re.match(r"\| *Member *\|", line)]
    assert len(starts) == 1, "expected one table headed | Member |"
    cells = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        cells.append(re.split(r"(?<!\\)\|", line)[1].strip())
    return cells


def test_the_interface_table_documents_exactly_the_dialect_members() -> None:
    members = {name for name in vars(Dialect) if not name.startswith("_")}
    members |= set(Dialect.__annotations__)
    named = []
    for cell in _interface_table():
        span = _CODE_SPAN.search(cell)
        assert span is not None, f"no member in backticks: {cell!r}"
        identifier = re.match(r"\w+", span[1])
        assert identifier is not None, cell
        named.append(identifier[0])
    assert len(named) == len(set(named)), f"a member is documented twice: {sorted(named)}"
    assert sorted(set(named) - members) == [], "not members of Dialect"
    assert sorted(members - set(named)) == [], "members of Dialect missing from the table"


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_no_module_outside_the_dialects_names_a_database_or_a_driver() -> None:
    """What "The files" promises: a new family is one module, because no
    other module keeps a list of databases or drivers to extend. (The
    benchmarks measure MySQL and MariaDB only; the revisions spell their own.)"""
    names = {*dialects.names(), *ASYNC_DRIVERS, "pymysql"}
    package = ROOT / "pathlock"
    outside = [
        path
        for path in package.rglob("*.py")
        if not path.is_relative_to(package / "dialects")
        and not path.is_relative_to(package / "bench")
    ]
    assert len(outside) > 20
    named = {
        str(path.relative_to(ROOT)): sorted(_literals(path) & names)
        for path in [*outside, ROOT / "migrations" / "env.py"]
    }
    assert {path: found for path, found in named.items() if found} == {}

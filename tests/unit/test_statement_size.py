"""What a request sends to the database grows linearly with the request, and
the largest request allowed fits the smallest default packet of a server.

Sizes are measured as PyMySQL sends the statements: compiled for MySQL, every
value escaped by the driver and written in, in UTF-8. Before, every ancestor
of every path travelled spelled out: one valid path of 2,000 components made
a 4 MB statement, five of them more than MariaDB's default 16 MiB packet.
"""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql.converters import escape_item
from sqlalchemy.dialects.mysql import pymysql as mysql_pymysql
from sqlalchemy.sql.expression import Executable

from pathlock import InvalidArgument, PathLockError, RequestTooLarge
from pathlock._core.records import GrantRequest, lease_data
from pathlock._core.validation import MAX_DATA
from pathlock._parameters import grant_parameters, waiter_parameters
from pathlock._statements.common import _integer_rows
from pathlock._statements.conflicts import blockers_query, shape
from pathlock._statements.grants import BUMP, grant_statement
from pathlock._statements.queue import ENQUEUE
from pathlock.paths import (
    MAX_PATH_LENGTH,
    MAX_REQUEST_CHARACTERS,
    MAX_REQUEST_PATHS,
    ancestors,
    descendants_range,
    normalize_request,
    prefix_lengths,
)
from pathlock.types import Owner

# The smallest default max_allowed_packet among the servers pathlock runs on
# (MySQL 5.7; MariaDB 10.11 has 16 MiB, MySQL 8 64 MiB).
SMALLEST_DEFAULT_PACKET = 4 * 1024 * 1024

_DIALECT = mysql_pymysql.dialect()


def _sent(statement: Executable, parameters: dict[str, Any]) -> int:
    """Bytes of ``statement`` as PyMySQL writes it to the socket."""
    compiled = statement.compile(dialect=_DIALECT)  # type: ignore[attr-defined]
    state = compiled.construct_expanded_state(parameters)
    if compiled.positional:
        values: Any = tuple(escape_item(state.parameters[k], "utf8mb4") for k in state.positiontup)
    else:
        values = {k: escape_item(v, "utf8mb4") for k, v in state.parameters.items()}
    return len((state.statement % values).encode())


# The most data a lease may carry, in the bytes that cost the most to send: a
# NUL is escaped to two characters, and a byte over 0x7F is two in UTF-8.
_DATA = lease_data(b"\x00\xff" * (MAX_DATA // 2))


def _request(
    exclusive: Sequence[str],
    shared: Sequence[str] = (),
    data: bytes | None = None,
    shallow: frozenset[str] = frozenset(),
) -> GrantRequest:
    paths = normalize_request(exclusive, shared)
    owner = Owner("n" * 255, 2**31 - 1, "t" * 64)
    return GrantRequest(2**62, "f" * 32, paths, owner, "r" * 1000, 30.0, data=data, shallow=shallow)


def _sizes(request: GrantRequest) -> dict[str, int]:
    """Bytes of every statement the request sends: the grant with the
    sentinel write before it (one packet), the blockers query, the enqueue."""
    parameters = grant_parameters(request, None)
    grant = grant_statement(shape(request.paths, request.shallow), queued=True)
    return {
        "grant": _sent(BUMP, {"c_id": request.customer_id}) + _sent(grant, parameters),
        "blockers": _sent(blockers_query(shape(request.paths, request.shallow)), parameters),
        "enqueue": _sent(ENQUEUE, waiter_parameters(request, waiter_ttl=5.0)),
    }


# -- linear growth -------------------------------------------------------------------


def test_a_path_of_2000_components_makes_a_small_statement() -> None:
    deep = "/a" * 2000
    sizes = _sizes(_request([deep]))
    # 4,018,913 and 4,014,409 bytes before.
    assert sizes["grant"] < 100_000
    assert sizes["blockers"] < 100_000


def test_statements_grow_linearly_with_the_depth() -> None:
    shallow = _sizes(_request(["/a" * 500]))
    deep = _sizes(_request(["/a" * 2000]))
    for name in ("grant", "blockers"):
        # Four times the depth: about four times the bytes, not sixteen.
        assert deep[name] < 4.5 * shallow[name], name


def test_five_deep_paths_fit_easily() -> None:
    paths = [f"/{n}" + "/a" * 1998 for n in range(5)]
    sizes = _sizes(_request(paths))
    assert max(sizes.values()) < 1_000_000  # 20 MB before


# -- the largest requests allowed ---------------------------------------------------

# Each at the limits, with the characters that cost the most bytes: four-byte
# characters (emoji) in one-character components (the most ancestors), and
# backslashes (escaped twice: by LIKE and by the driver).
_WIDE = [f"/{n:03d}" + "/\U0001f600" * 48 for n in range(MAX_REQUEST_PATHS)]
_DEEP_EMOJI = [f"/{n:02d}" + "/\U0001f600" * 1998 for n in range(25)]
_DEEP_BACKSLASH = [f"/{n:02d}" + "/\\" * 1998 for n in range(25)]
_MANY_SHORT = [f"/p{n}" for n in range(MAX_REQUEST_PATHS)]


@pytest.mark.parametrize(
    "paths",
    [_WIDE, _DEEP_EMOJI, _DEEP_BACKSLASH, _MANY_SHORT],
    ids=["1000-paths-of-100-emoji-chars", "25-paths-of-4000-emoji-chars", "backslashes", "short"],
)
@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
@pytest.mark.parametrize("depth", ["subtree", "depth-0"])
def test_the_largest_requests_fit_the_smallest_default_packet(
    paths: list[str], shared: bool, depth: str
) -> None:
    assert len(paths) <= MAX_REQUEST_PATHS
    assert sum(len(path) for path in paths) <= MAX_REQUEST_CHARACTERS
    # Every other path at depth 0: the statement carries each path's depth.
    shallow = frozenset(paths[::2]) if depth == "depth-0" else frozenset()
    if shared:
        request = _request([], paths, _DATA, shallow)
    else:
        request = _request(paths, data=_DATA, shallow=shallow)
    sizes = _sizes(request)
    assert max(sizes.values()) < SMALLEST_DEFAULT_PACKET, sizes


# -- the limits ----------------------------------------------------------------------


def test_a_request_at_both_limits_is_accepted() -> None:
    paths = [f"/{n:03d}" + "x" * 96 for n in range(MAX_REQUEST_PATHS)]
    assert sum(map(len, paths)) == MAX_REQUEST_CHARACTERS
    assert len(normalize_request(paths, ())) == MAX_REQUEST_PATHS


def test_one_path_too_many_is_refused() -> None:
    paths = [f"/p{n}" for n in range(MAX_REQUEST_PATHS + 1)]
    with pytest.raises(RequestTooLarge) as raised:
        normalize_request(paths[:500], paths[500:])
    error = raised.value
    assert (error.limit, error.maximum, error.size) == ("paths", MAX_REQUEST_PATHS, None)
    assert "more than 1,000 paths" in str(error)
    assert "at most 1,000 per request" in str(error)


def test_duplicates_do_not_count_against_the_limit() -> None:
    paths = ["/same", "/same/"] * MAX_REQUEST_PATHS
    assert normalize_request(paths, paths) == (("/same", "exclusive"),)


def test_one_character_too_many_is_refused() -> None:
    paths = [f"/{n:02d}" + "x" * (MAX_PATH_LENGTH - 3) for n in range(25)] + ["/"]
    size = sum(map(len, paths))
    assert size == MAX_REQUEST_CHARACTERS + 1
    with pytest.raises(RequestTooLarge) as raised:
        normalize_request(paths, ())
    error = raised.value
    assert (error.limit, error.maximum, error.size) == ("characters", 100_000, size)
    assert f"{size:,} characters of paths in total" in str(error)


def test_the_error_is_a_value_error_of_pathlock_and_pickles() -> None:
    error = RequestTooLarge("characters", 100_000, 100_001)
    assert isinstance(error, InvalidArgument)
    assert isinstance(error, PathLockError)
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301
    assert (copy.limit, copy.maximum, copy.size, str(copy)) == (
        "characters",
        100_000,
        100_001,
        str(error),
    )


# -- prefixes ------------------------------------------------------------------------

_COMPONENT = st.text(alphabet=st.sampled_from("ab\U0001f600%_\\ "), min_size=1, max_size=3)


@settings(max_examples=200)
@given(st.lists(_COMPONENT, max_size=8))
def test_prefix_lengths_cut_exactly_the_ancestors_and_the_path(components: list[str]) -> None:
    path = "/" + "/".join(components)
    assert [path[:n] for n in prefix_lengths(path)] == [*ancestors(path), path]


def test_prefix_rows_of_any_number_are_one_table_for_sqlite() -> None:
    # SQLite refuses compound SELECTs of more than 500 terms: the rows nest.
    rows = [(k, n) for k in range(40) for n in range(1, 2502)]
    with sqlite3.connect(":memory:") as connection:
        count, total = connection.execute(
            f"SELECT COUNT(*), SUM(k * 10000 + n) FROM ({_integer_rows(rows)})"
        ).fetchone()
    assert (count, total) == (len(rows), sum(k * 10000 + n for k, n in rows))


def test_prefix_rows_are_only_ever_integers() -> None:
    with pytest.raises(TypeError):
        _integer_rows([(0, "1); DROP TABLE path_locks; --")])  # type: ignore[list-item]


# -- descendants ---------------------------------------------------------------------

_ANY_CHAR = st.sampled_from([" ", "-", "0", "a", "\u00e9", "\uffff", "\U0001f600", "\U0010ffff"])


@settings(max_examples=300)
@given(
    st.lists(st.text(_ANY_CHAR, min_size=1, max_size=2), max_size=3),
    st.lists(st.text(_ANY_CHAR, min_size=1, max_size=2), max_size=4),
)
def test_descendants_range_holds_exactly_the_descendants(
    first: list[str], second: list[str]
) -> None:
    path, other = ("/" + "/".join(parts) for parts in (first, second))
    low, high = descendants_range(path)
    descendant = other != path and path in ancestors(other)
    # Code point order is UTF-8 byte order: what the collations compare.
    assert (low <= other < high) is (descendant or other == path == "/")
    assert (low.encode() <= other.encode() < high.encode()) is (low <= other < high)

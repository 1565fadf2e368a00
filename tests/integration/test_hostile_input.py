"""Hostile input through the public API, against the real databases (issue 5, part 3).

Two promises, checked on every backend with hypothesis:

- A bad argument is refused with a :class:`PathLockError` (``InvalidPath``,
  ``InvalidArgument``, or ``ArgumentTypeError`` for a wrong type) before
  anything is written: an independent read of the three tables (plain SQL,
  not pathlock's queries) finds them exactly as they were, the test's customer
  absent and no sentinel version moved.
- A valid but odd path (LIKE wildcards, the escape character, quotes, spaces,
  SQL-shaped text, emoji, CJK, NFD spellings, 4000 characters) locks exactly
  itself: it blocks itself, its ancestors and its descendants, never a
  neighbour that differs by a wildcard or an escape, and is stored byte for
  byte as normalized.

Trailing spaces are part of a path and of a node id on every backend: on
MariaDB/MySQL the tables use a NO PAD binary collation (revision 0003), since
``utf8mb4_bin`` is PAD SPACE and let ``/a `` meet ``/a``.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable, Collection, Iterator
from decimal import Decimal
from pathlib import PurePosixPath

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, bindparam, text

from pathlock import (
    ArgumentTypeError,
    InvalidArgument,
    InvalidPath,
    InvalidPathType,
    Lease,
    PathLockError,
    PathLockManager,
)
from pathlock._core.validation import MAX_INTERVAL, MAX_TTL, MIN_TTL
from pathlock.paths import MAX_PATH_LENGTH

# The fixtures are per test, not per example: every example either changes
# nothing (that is what it checks) or undoes what it did.
_FIXTURES_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
REFUSALS = settings(max_examples=60, deadline=None, suppress_health_check=_FIXTURES_OK)
GRANTS = settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURES_OK)
MANAGERS = settings(max_examples=12, deadline=None, suppress_health_check=_FIXTURES_OK)


# -- independent reads ------------------------------------------------------------

_TABLES = {"customer_locks": "customer_id", "path_locks": "id", "path_lock_waiters": "ticket"}


def _snapshot(engine: Engine, customers: Collection[int]) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the three tables, every column, of ``customers``: what
    "nothing was written" compares. Scoped to the customers a test uses, so
    that nothing another test left running elsewhere can disturb it."""
    ids = sorted(customer for customer in customers if 0 <= customer < 2**63)
    with engine.connect() as connection:
        return {
            table: [
                tuple(row)
                for row in connection.execute(
                    text(
                        f"SELECT * FROM {table} WHERE customer_id IN :ids ORDER BY {key}"
                    ).bindparams(bindparam("ids", expanding=True)),
                    {"ids": ids},
                )
            ]
            for table, key in _TABLES.items()
        }


def _customer_rows(engine: Engine, customer_id: int) -> dict[str, int]:
    with engine.connect() as connection:
        return {
            table: connection.execute(
                text(f"SELECT COUNT(*) FROM {table} WHERE customer_id = :c"), {"c": customer_id}
            ).scalar_one()
            for table in _TABLES
        }


_ABSENT = dict.fromkeys(_TABLES, 0)


def _stored(engine: Engine, lease_id: str, column: str = "path") -> list[tuple[str, str]]:
    """``column`` of a lease's rows as the database holds it: the UTF-8 bytes
    in hex, and the mode."""
    # PostgreSQL has no HEX(): its UTF-8 bytes, in hex, through encode().
    hexed = (
        f"UPPER(encode(convert_to({column}, 'UTF8'), 'hex'))"
        if engine.dialect.name == "postgresql"
        else f"HEX({column})"
    )
    with engine.connect() as connection:
        rows = connection.execute(
            text(f"SELECT {hexed}, mode FROM path_locks WHERE lease_id = :l ORDER BY path"),
            {"l": lease_id},
        )
        return [(str(value), str(mode)) for value, mode in rows]


def _hex(value: str) -> str:
    return value.encode("utf-8").hex().upper()


# -- fixtures --------------------------------------------------------------------


def _quiet(url: str, node_id: str | None = None) -> PathLockManager:
    # No heartbeat: no renewal writes rows behind a test that compares snapshots.
    node = node_id or f"hostile-{secrets.token_hex(4)}"
    return PathLockManager(url, node_id=node, ttl=120.0, heartbeat=False)


@pytest.fixture
def holder(database_url: str) -> Iterator[PathLockManager]:
    with _quiet(database_url) as manager:
        yield manager


@pytest.fixture
def prober(database_url: str) -> Iterator[PathLockManager]:
    """Another owner (another node id) on the same database."""
    with _quiet(database_url) as manager:
        yield manager


@pytest.fixture
def busy(holder: PathLockManager) -> Iterator[tuple[int, Lease]]:
    """Another customer, holding a lease: its rows and sentinel version must
    not move either."""
    customer = secrets.randbelow(2**62) + 1
    lease = holder.for_customer(customer).lock_paths("/busy", shared=["/other"], reason="busy")
    yield customer, lease
    lease.release()


def _refused(
    engine: Engine,
    call: Callable[[], object],
    error: type[PathLockError],
    fresh_customer: int,
    *watched: int,
) -> PathLockError:
    """Run ``call``, which must raise ``error``; then check that ``fresh_customer``
    still has no row in any table and that no row of the ``watched`` customers
    changed (their sentinel versions included)."""
    customers = {fresh_customer, *watched}
    before = _snapshot(engine, customers)
    with pytest.raises(error) as caught:
        call()
    assert _customer_rows(engine, fresh_customer) == _ABSENT
    assert _snapshot(engine, customers) == before
    return caught.value


def _as_customer(value: object) -> set[int]:
    """The customer id a careless check could make of ``value`` (``int(True)``
    is 1, ``int(7.0)`` is 7): its rows are watched too."""
    try:
        return {int(value)}  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return set()


# -- hostile values -----------------------------------------------------------------

_ODD = "%_\\'\" ;-*ab\u00e9\U0001f600\u6f22\u2028"
odd_parts = st.text(_ODD, min_size=1, max_size=5).filter(lambda part: part not in (".", ".."))
good_paths = st.lists(odd_parts, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))

_CC = [chr(code) for code in [*range(0x20), *range(0x7F, 0xA0)]]


@st.composite
def _with_char(draw: st.DrawFn, chars: st.SearchStrategy[str]) -> str:
    path = draw(good_paths)
    position = draw(st.integers(0, len(path)))
    return path[:position] + draw(chars) + path[position:]


@st.composite
def _with_dots(draw: st.DrawFn) -> str:
    parts = draw(st.lists(odd_parts, max_size=3))
    parts.insert(draw(st.integers(0, len(parts))), draw(st.sampled_from([".", ".."])))
    return "/" + "/".join(parts) + draw(st.sampled_from(["", "/", "//"]))


bad_path_strings = st.one_of(
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "/..",
            "/.",
            "//..//",
            "a/b",
            "Shared",
            " /a",
            "\\a",
            "C:\\a",
            "~/a",
            "../etc/passwd",
            "/" + "x" * MAX_PATH_LENGTH,  # 4001 characters
            "/" + "y" * 4999,  # 5000
            "/" + "\U0001f600" * MAX_PATH_LENGTH,
            "/" + "\u0958" * 2000,  # NFC expands it to 4001
            "/" * (16 * MAX_PATH_LENGTH + 1),  # normalizes to "/", but refused first
            "'; DROP TABLE path_locks; --",  # SQL-shaped and relative
        ]
    ),
    st.integers(MAX_PATH_LENGTH + 1, 5000).map(lambda length: "/" + "z" * (length - 1)),
    _with_char(st.sampled_from(_CC)),
    _with_char(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
    _with_dots(),
    good_paths.map(lambda path: path.lstrip("/")).filter(lambda path: not path.startswith("/")),
)
"""Strings that are never a valid path."""

not_str = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 2**63, 2**63 - 1, 10**5000, 1.5, math.nan]),
    st.binary(max_size=8),
    # (an absolute PurePosixPath is a path; a relative one is refused as any is)
    st.sampled_from([b"/a", bytearray(b"/a"), PurePosixPath("a"), ["/a"], ("/a",), {"/a": 1}]),
)
bad_members = st.one_of(bad_path_strings, not_str)


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[tuple[object, ...], dict[str, object]]:
    """Positional paths and ``shared=`` of a request that must be refused."""
    good = draw(good_paths)
    bad = draw(bad_members)
    kind = draw(
        st.sampled_from(
            ["alone", "after a good one", "shared", "shared after a good one", "bare shared"]
        )
    )
    if kind == "alone":
        return (bad,), {}
    if kind == "after a good one":
        return (good, bad), {}
    if kind == "shared":
        return (), {"shared": [bad]}
    if kind == "shared after a good one":
        return (good,), {"shared": (good + "/s", bad)}
    # shared= given one path (or a non-iterable) instead of an iterable of paths
    bare = draw(st.sampled_from([good, good.encode(), "", None, 5, 2.5, True, 10**5000]))
    return (good,), {"shared": bare}


empty_requests = st.sampled_from(
    [
        ((), {}),
        ((), {"shared": []}),
        ((), {"shared": ()}),
        ((), {"shared": {}}),
        ((), {"shared": set()}),
    ]
)


# -- 1. bad paths are refused before anything is written ------------------------------


@REFUSALS
@given(hostile=st.one_of(hostile_requests(), empty_requests), how=st.sampled_from(range(4)))
def test_bad_paths_are_refused_before_anything_is_written(
    holder: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    busy: tuple[int, Lease],
    hostile: tuple[tuple[object, ...], dict[str, object]],
    how: int,
) -> None:
    paths, options = hostile
    target = customer_id if how % 2 == 0 else busy[0]
    locks = holder.for_customer(target)
    calls: list[Callable[[], object]] = [
        lambda: locks.lock_paths(*paths, **options),  # type: ignore[arg-type]
        lambda: locks.lock_paths(*paths, timeout=0, reason="x", **options),  # type: ignore[arg-type]
        lambda: locks.try_lock_paths(*paths, **options),  # type: ignore[arg-type]
        lambda: locks.try_lock_paths(*paths, ttl=5.0, **options),  # type: ignore[arg-type]
    ]
    error = _refused(raw_engine, calls[how], PathLockError, customer_id, busy[0])
    # A bad value, or (InvalidPathType, a TypeError) a value of the wrong type.
    assert isinstance(error, (InvalidPath, InvalidPathType)), repr(error)
    assert isinstance(error, ValueError) is isinstance(error, InvalidPath)
    assert len(str(error)) < 300
    busy[1].ensure_held()


# -- 2. bad timeouts, ttls, reasons and customer ids ----------------------------------

wrong_type_values = st.one_of(
    st.booleans(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.sampled_from([[1], {"s": 1}, Decimal(1), 1j, object()]),
)
wrong_seconds = wrong_type_values  # None is allowed for both timeout and ttl
bad_timeouts = st.one_of(
    st.floats(max_value=-1e-300),
    st.integers(max_value=-1),
    st.sampled_from([math.nan, -math.inf, -(10**400)]),
)
bad_ttls = st.one_of(
    st.floats(max_value=MIN_TTL / 2),
    st.floats(min_value=MAX_TTL * 1.001),
    st.sampled_from([0, 0.0, -0.0, math.nan, math.inf, -math.inf, 10**400, 2**63]),
)
bad_reasons = st.one_of(
    st.text(max_size=5).map(lambda reason: reason + "\x00"),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF).map(lambda char: "why " + char),
    st.integers(1001, 5000).map(lambda length: "r" * length),
)
wrong_reasons = st.one_of(st.none(), st.booleans(), st.integers(), st.binary(max_size=4))
bad_customers = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.sampled_from([2**64, 10**5000, -(10**5000)]),
)
wrong_customers = st.one_of(
    st.booleans(),
    st.floats(),
    st.sampled_from([1.0, 7.0, "1", "42", b"1", None, Decimal(3), [1], {"c": 1}]),
)

hostile_arguments = st.one_of(
    st.tuples(st.just("timeout"), wrong_seconds, st.just(ArgumentTypeError)),
    st.tuples(st.just("timeout"), bad_timeouts, st.just(InvalidArgument)),
    st.tuples(st.just("ttl"), wrong_seconds, st.just(ArgumentTypeError)),
    st.tuples(st.just("ttl"), bad_ttls, st.just(InvalidArgument)),
    st.tuples(st.just("reason"), wrong_reasons, st.just(ArgumentTypeError)),
    st.tuples(st.just("reason"), bad_reasons, st.just(InvalidArgument)),
    st.tuples(st.just("customer_id"), wrong_customers, st.just(ArgumentTypeError)),
    st.tuples(st.just("customer_id"), bad_customers, st.just(InvalidArgument)),
)


@REFUSALS
@given(
    argument=hostile_arguments, path=good_paths, use_try=st.booleans(), busy_target=st.booleans()
)
def test_bad_arguments_are_refused_before_anything_is_written(
    holder: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    busy: tuple[int, Lease],
    argument: tuple[str, object, type[PathLockError]],
    path: str,
    use_try: bool,
    busy_target: bool,
) -> None:
    name, value, error = argument
    target = busy[0] if busy_target else customer_id

    def call() -> object:
        if name == "customer_id":
            locks = holder.for_customer(value)  # type: ignore[arg-type]
            return locks.lock_paths(path, timeout=0)
        locks = holder.for_customer(target)
        if use_try and name != "timeout":
            return locks.try_lock_paths(path, **{name: value})  # type: ignore[arg-type]
        return locks.lock_paths(path, **{name: value})  # type: ignore[arg-type]

    coerced = _as_customer(value) if name == "customer_id" else set()
    raised = _refused(raw_engine, call, error, customer_id, busy[0], *coerced)
    assert name in str(raised)
    busy[1].ensure_held()


@REFUSALS
@given(value=st.one_of(bad_customers, wrong_customers.filter(lambda value: value is not None)))
def test_bad_customer_ids_are_refused_by_every_reader(
    holder: PathLockManager, raw_engine: Engine, customer_id: int, value: object
) -> None:
    watched = _as_customer(value)
    _refused(raw_engine, lambda: holder.list_locks(value), PathLockError, customer_id, *watched)  # type: ignore[arg-type]
    _refused(raw_engine, lambda: holder.list_waiters(value), PathLockError, customer_id, *watched)  # type: ignore[arg-type]


# -- 3. operators: lease ids, node ids, requested_by ----------------------------------

bad_lease_ids = st.one_of(
    st.text(max_size=40).filter(
        lambda value: not (len(value) == 32 and set(value) <= set("0123456789abcdef"))
    ),
    st.sampled_from(
        [
            "%" * 32,
            "_" * 32,
            "' OR '1'='1' -- " + "0" * 16,
            "0123456789ABCDEF0123456789ABCDEF",
            "0123456789abcdef0123456789abcdef\n",
            "\uff10" * 32,
        ]
    ),
)
bad_node_ids = st.one_of(
    st.just(""),
    st.just("n" * 256),
    st.builds(
        lambda before, char, after: before + char + after,
        st.text(_ODD, max_size=4),
        st.sampled_from(_CC) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.text(_ODD, max_size=4),
    ),
)
bad_requesters = st.one_of(bad_reasons, st.integers(), st.booleans(), st.binary(max_size=3))


wrong_type_pairs = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=4)
).map(lambda value: (value, ArgumentTypeError))


REAL_ID = object()
"""Stands for the held lease's own id (or its node's): only requested_by is bad."""


@st.composite
def hostile_operator_calls(
    draw: st.DrawFn,
) -> tuple[str, object, object, type[PathLockError]]:
    """(operation, id, requested_by, expected error): exactly one is bad."""
    operation = draw(st.sampled_from(["release_lease", "release_node"]))
    bad_id = draw(st.booleans())
    if bad_id:
        ids = bad_lease_ids if operation == "release_lease" else bad_node_ids
        value = draw(st.one_of(ids.map(lambda value: (value, InvalidArgument)), wrong_type_pairs))
        return operation, value[0], "", value[1]
    requester = draw(bad_requesters)
    error = InvalidArgument if isinstance(requester, str) else ArgumentTypeError
    return operation, REAL_ID, requester, error


@REFUSALS
@given(operation=hostile_operator_calls())
def test_bad_operator_calls_release_nothing(
    holder: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    busy: tuple[int, Lease],
    operation: tuple[str, object, object, type[PathLockError]],
) -> None:
    name, value, requested_by, error = operation
    lease = busy[1]
    if value is REAL_ID:  # a bad requested_by must stop the release of a real lease
        value = lease.lease_id if name == "release_lease" else holder.node_id
    release = getattr(holder, name)
    _refused(
        raw_engine, lambda: release(value, requested_by=requested_by), error, customer_id, busy[0]
    )
    lease.ensure_held()


def _lookalikes(node_id: str) -> list[str]:
    """Valid node ids that are not ``node_id`` but that a pattern, a case- or
    accent-insensitive comparison or a prefix test would confuse with it."""
    found = [
        "%",
        "_" * len(node_id),
        node_id[:-1] + "_",
        node_id[:-1] + "%",
        node_id + "%",
        "%" + node_id[1:],
        node_id.upper(),
        node_id[:-1],
        node_id + "x",
        node_id.replace("-", "\\-"),
        node_id + "' OR '1'='1",
        "x' OR node_id LIKE '%",
        unicodedata.normalize("NFD", node_id.replace("e", "\u00e9")),
        node_id.replace("e", "\u00e9"),  # accent-insensitive collations
    ]
    return [other for other in found if other != node_id and 0 < len(other) <= 255]


def test_lookalike_ids_release_nothing(
    holder: PathLockManager, raw_engine: Engine, busy: tuple[int, Lease]
) -> None:
    lease = busy[1]
    before = _snapshot(raw_engine, [busy[0]])
    for node_id in _lookalikes(holder.node_id):
        assert holder.release_node(node_id, requested_by="hostile test") == 0, node_id
    upper = lease.lease_id.upper()
    for lease_id in (secrets.token_hex(16), lease.lease_id[::-1], lease.lease_id[:-1] + "0"):
        if lease_id != lease.lease_id:
            assert holder.release_lease(lease_id) == 0
    with pytest.raises(InvalidArgument):
        holder.release_lease(upper if upper != lease.lease_id else "X" * 32)
    assert _snapshot(raw_engine, [busy[0]]) == before
    lease.ensure_held()


# -- 4. constructor options ---------------------------------------------------------------

bad_options = st.one_of(
    st.tuples(st.just("ttl"), wrong_seconds | st.none(), st.just(ArgumentTypeError)),
    st.tuples(st.just("ttl"), bad_ttls, st.just(InvalidArgument)),
    st.tuples(
        st.just("max_attempts"),
        st.one_of(st.booleans(), st.floats(), st.none(), st.text(max_size=2)),
        st.just(ArgumentTypeError),
    ),
    st.tuples(
        st.just("max_attempts"),
        st.sampled_from([0, -1, -(2**63), 2**63, 10**5000]),
        st.just(InvalidArgument),
    ),
    st.tuples(
        st.just("case_insensitive"),
        st.sampled_from([None, 0, 1, "yes", "", b"", [], [True]]),
        st.just(ArgumentTypeError),
    ),
    st.tuples(
        st.just("cleanup_on_start"),
        st.sampled_from([1, "yes", "false", None, [True], 1.0]),
        st.just(ArgumentTypeError),
    ),
    st.tuples(st.just("node_id"), bad_node_ids, st.just(InvalidArgument)),
    st.tuples(
        st.just("node_id"),
        st.sampled_from([5, True, b"web-1", ["web-1"], 2**63]),
        st.just(ArgumentTypeError),
    ),
)


@MANAGERS
@given(option=bad_options)
def test_bad_constructor_options_are_refused_before_cleanup_runs(
    database_url: str,
    holder: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    busy: tuple[int, Lease],
    option: tuple[str, object, type[PathLockError]],
) -> None:
    # cleanup_on_start=True would delete every row of the holder's node: a
    # refused constructor must not get that far.
    name, value, error = option
    options: dict[str, object] = {"node_id": holder.node_id, "cleanup_on_start": True, name: value}

    def construct() -> None:
        made = PathLockManager(database_url, heartbeat=False, **options)  # type: ignore[arg-type]
        made.close()

    raised = _refused(raw_engine, construct, error, customer_id, busy[0])
    assert name in str(raised)
    busy[1].ensure_held()


@pytest.mark.parametrize("value", [None, 1, "false"])
def test_heartbeat_must_be_a_bool(database_url: str, value: object) -> None:
    def construct() -> None:
        made = PathLockManager(database_url, node_id="hostile-heartbeat", heartbeat=value)  # type: ignore[arg-type]
        made.close()

    with pytest.raises(ArgumentTypeError, match="heartbeat"):
        construct()


# -- 5. the reaper ------------------------------------------------------------------------

bad_batch_sizes = st.one_of(
    st.sampled_from([0, -1, 2**63, 2**64, 10**30, 10**5000, -(10**5000)]).map(
        lambda value: (value, InvalidArgument)
    ),
    st.one_of(st.booleans(), st.floats(), st.none(), st.text(max_size=2)).map(
        lambda value: (value, ArgumentTypeError)
    ),
)
bad_intervals = st.one_of(
    st.one_of(
        st.floats(max_value=0.0),
        st.floats(min_value=MAX_INTERVAL * 1.0001),
        st.sampled_from([math.nan, math.inf, 1e12, 1e300, 10**400, -(10**400), 0]),
    ).map(lambda value: (value, InvalidArgument)),
    wrong_type_values.map(lambda value: (value, ArgumentTypeError)),
)


@st.composite
def hostile_reaper_calls(draw: st.DrawFn) -> tuple[str, dict[str, object], type[PathLockError]]:
    entry = draw(st.sampled_from(["reap_expired", "start_reaper", "add_reaper_job"]))
    if entry == "reap_expired" or draw(st.booleans()):
        batch_size, error = draw(bad_batch_sizes)
        return entry, {"batch_size": batch_size}, error
    interval, error = draw(bad_intervals)
    return entry, {"interval": interval}, error


@pytest.fixture
def expired(holder: PathLockManager) -> tuple[int, str]:
    """An expired lease, of another customer than the test's: (customer, lease id)."""
    customer = secrets.randbelow(2**62) + 1
    lease = holder.for_customer(customer).lock_paths("/expired", ttl=MIN_TTL)
    time.sleep(0.01)
    return customer, lease.lease_id


@REFUSALS
@given(call=hostile_reaper_calls())
def test_bad_reaper_arguments_delete_and_start_nothing(
    holder: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    expired: tuple[int, str],
    call: tuple[str, dict[str, object], type[PathLockError]],
) -> None:
    entry, options, error = call
    scheduler = BackgroundScheduler(daemon=True)  # never started: no thread
    threads = set(threading.enumerate())

    def reap() -> object:
        if entry == "add_reaper_job":
            return holder.add_reaper_job(scheduler, **options)  # type: ignore[arg-type]
        return getattr(holder, entry)(**options)

    _refused(raw_engine, reap, error, customer_id, expired[0])
    assert scheduler.get_jobs() == []
    assert set(threading.enumerate()) <= threads
    assert _stored(raw_engine, expired[1])  # the expired row is still there


def test_the_largest_batch_size_and_interval_work(
    holder: PathLockManager, raw_engine: Engine, expired: tuple[int, str]
) -> None:
    assert holder.reap_expired(batch_size=2**63 - 1) >= 1
    assert _stored(raw_engine, expired[1]) == []
    holder.start_reaper(interval=MAX_INTERVAL, batch_size=2**63 - 1)


# -- 6. odd paths lock exactly themselves -----------------------------------------------


def _parts(path: str) -> list[str]:
    return [] if path == "/" else path[1:].split("/")


def _related(first: str, second: str) -> bool:
    """Equal, ancestor or descendant, by whole components (not pathlock's code)."""
    a, b = _parts(first), _parts(second)
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


def _spellings(path: str) -> list[str]:
    """Other ways to write the same path."""
    return [unicodedata.normalize("NFD", path), "/" + path.replace("/", "//") + "/"]


def _neighbours(path: str) -> list[str]:
    """Paths that differ from ``path`` by a wildcard, an escape or a prefix:
    a pattern built from one of them without escaping would match ``path`` or
    what lies under it."""
    found = [path + "x", path + "%", path + "_", path + "\\"]
    for position, char in enumerate(path):
        if char != "/":
            found.extend(
                path[:position] + other + path[position + 1 :]
                for other in ("%", "_", "x", "\\", "\\\\", "")
            )
            found.append(path[:position] + "%" + path[position:])
    return found


def _usable(path: str) -> bool:
    """A normalized path with no component ending in a space (the PAD SPACE
    cases have their own test) and within the length limit."""
    if path == "/":
        return True
    parts = _parts(path)
    return (
        path.startswith("/")
        and "//" not in path
        and not path.endswith("/")
        and len(path) <= MAX_PATH_LENGTH
        and all(part not in (".", "..") and not part.endswith(" ") for part in parts)
        and unicodedata.is_normalized("NFC", path)
    )


def _blocked(prober: PathLockManager, customer_id: int, path: str, mode: str) -> bool:
    locks = prober.for_customer(customer_id)
    lease = (
        locks.try_lock_paths(path) if mode == "exclusive" else locks.try_lock_paths(shared=[path])
    )
    if lease is None:
        return True
    lease.release()
    return False


clean_parts = odd_parts.filter(lambda part: not part.endswith(" ")).map(
    lambda part: unicodedata.normalize("NFC", part)
)
clean_paths = st.lists(clean_parts, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
modes = st.sampled_from(["exclusive", "shared"])


@GRANTS
@given(path=clean_paths, held_mode=modes, probe_mode=modes, data=st.data())
def test_odd_paths_lock_exactly_themselves(
    holder: PathLockManager,
    prober: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    path: str,
    held_mode: str,
    probe_mode: str,
    data: st.DataObject,
) -> None:
    spelling = data.draw(st.sampled_from([path, *_spellings(path)]))
    locks = holder.for_customer(customer_id)
    held = (
        locks.lock_paths(spelling)
        if held_mode == "exclusive"
        else locks.lock_paths(shared=[spelling])
    )
    try:
        assert held.paths == ((path, held_mode),)
        assert _stored(raw_engine, held.lease_id) == [(_hex(path), held_mode)]
        lineage = ["/" + "/".join(_parts(path)[:n]) for n in range(len(_parts(path)) + 1)]
        candidates = [*lineage, *_spellings(path), path + "/x", path + "/%", path + "/_"]
        for ancestor in lineage[1:]:
            candidates += _neighbours(ancestor)
        probes = sorted({probe for probe in candidates if _usable(probe)})
        drawn = data.draw(st.lists(st.sampled_from(probes), max_size=8, unique=True))
        for probe in [*drawn, path]:
            expected = _related(path, probe) and not held_mode == probe_mode == "shared"
            assert _blocked(prober, customer_id, probe, probe_mode) is expected, (path, probe)
    finally:
        held.release()


# (held, neighbour): each a valid path that must not block the other.
NEIGHBOURS = [
    ("/a%", "/ab"),
    ("/a_b", "/axb"),
    ("/a\\b", "/a\\\\b"),
    ("/a\\_", "/a\\x"),
    ("/%", "/a"),
    ("/_", "/a"),
    ("/\\", "/\\\\"),
    ("/%%", "/%"),
    ("/a%/b", "/ab/b"),
    ("/'", "/''"),
    ("/a'", "/a"),
    ('/a"', "/a"),
    ("/a' OR '1'='1", "/a"),
    ("/x'; DROP TABLE path_locks; --", "/x"),
    ("/a/'; DELETE FROM customer_locks; --", "/a/b"),
    ("/%' OR path LIKE '%", "/anything"),
    ("/%(c_id)s", "/%s"),
    ("/a b", "/a"),
    ("/a\u2028b", "/a"),
    ("/caf\u00e9", "/cafe"),
    ("/\U0001f600", "/\U0001f601"),
    ("/\u6f22\u5b57", "/\u6f22"),
]


@pytest.mark.parametrize(("first", "second"), NEIGHBOURS)
def test_neighbours_never_block_each_other(
    holder: PathLockManager,
    prober: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    first: str,
    second: str,
) -> None:
    locks = holder.for_customer(customer_id)
    for held, other in ((first, second), (second, first)):
        with locks.lock_paths(held) as lease:
            assert _stored(raw_engine, lease.lease_id) == [(_hex(held), "exclusive")]
            assert not _blocked(prober, customer_id, other, "exclusive"), (held, other)
            assert not _blocked(prober, customer_id, other + "/child", "exclusive")
        with locks.lock_paths(held + "/child"):
            # other/% must not match held/child: other's wildcards are escaped.
            assert not _blocked(prober, customer_id, other, "exclusive"), (held, other)
        with locks.lock_paths(held) as lease:
            # ...while the path itself, its descendants and its ancestors are.
            assert _blocked(prober, customer_id, held, "shared")
            assert _blocked(prober, customer_id, held + "/child/x", "exclusive")
            assert _blocked(prober, customer_id, "/", "exclusive")
    # The SQL-shaped ones were values, not statements: the tables are all there.
    assert _customer_rows(raw_engine, customer_id)["customer_locks"] == 1


@pytest.mark.parametrize("filler", ["\U0001f600", "\u6f22", "%", "_", "\\", "'", "e\u0301"])
def test_4000_character_paths_lock_exactly_themselves(
    holder: PathLockManager,
    prober: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    filler: str,
) -> None:
    # Two components, both far past the index's 700-character prefix; the
    # siblings differ only in the last character.
    char = unicodedata.normalize("NFC", filler)
    parent = "/" + char * 1500
    path = parent + "/" + char * (MAX_PATH_LENGTH - len(parent) - 1)
    assert len(path) == MAX_PATH_LENGTH
    sibling = path[:-1] + "x"
    uncle = parent[:-1] + "x"
    with holder.for_customer(customer_id).lock_paths(path.replace(char, filler)) as lease:
        assert lease.paths == ((path, "exclusive"),)
        assert _stored(raw_engine, lease.lease_id) == [(_hex(path), "exclusive")]
        assert _blocked(prober, customer_id, path, "shared")
        assert _blocked(prober, customer_id, parent, "exclusive")
        assert not _blocked(prober, customer_id, sibling, "exclusive")
        assert not _blocked(prober, customer_id, uncle, "exclusive")
        # Unescaped, these would match the held path's parent or the path.
        for pattern in ("/" + "_" * 1500, "/%", "/" + "%" * 1500, parent[:-1] + "_", "/_%"):
            assert _blocked(prober, customer_id, pattern, "exclusive") is (pattern == parent)
    with holder.for_customer(customer_id).lock_paths(parent):
        assert _blocked(prober, customer_id, path, "exclusive")
        assert not _blocked(prober, customer_id, uncle + "/" + char, "exclusive")


# -- 7. valid odd arguments are stored as given --------------------------------------------

odd_text = st.text(_ODD + "\n\t\x1b", max_size=30)
reasons = st.one_of(
    odd_text,
    st.sampled_from(["'; DROP TABLE path_locks; --", "a' OR '1'='1", "\\", "%s", "r" * 1000]),
    st.just("\U0001f600" * 1000),
)


@GRANTS
@given(reason=reasons, path=clean_paths)
def test_odd_reasons_are_stored_as_given(
    holder: PathLockManager, raw_engine: Engine, customer_id: int, reason: str, path: str
) -> None:
    with holder.for_customer(customer_id).lock_paths(path, reason=reason) as lease:
        assert lease.reason == reason
        assert _stored(raw_engine, lease.lease_id, "reason") == [(_hex(reason), "exclusive")]


node_ids = st.one_of(
    st.text(_ODD.replace("\u2028", ""), min_size=1, max_size=20).filter(
        lambda node: not node.endswith(" ")
    ),
    st.sampled_from(["'; DROP TABLE path_locks; --", "%", "_", "\U0001f600" * 255, "n" * 255]),
)


@MANAGERS
@given(node_id=node_ids)
def test_odd_node_ids_are_stored_and_released_exactly(
    database_url: str,
    holder: PathLockManager,
    raw_engine: Engine,
    customer_id: int,
    busy: tuple[int, Lease],
    node_id: str,
) -> None:
    # Node ids are global, not per customer: make this one unique to the test.
    node_id = (node_id + secrets.token_hex(3))[-255:]
    with _quiet(database_url, node_id) as odd:
        lease = odd.for_customer(customer_id).lock_paths("/odd")
        assert _stored(raw_engine, lease.lease_id, "node_id") == [(_hex(node_id), "exclusive")]
        for lookalike in _lookalikes(node_id):
            assert holder.release_node(lookalike) == 0, lookalike
        assert holder.release_node(node_id) == 1
        assert _stored(raw_engine, lease.lease_id) == []
    busy[1].ensure_held()


def test_the_largest_customer_id_works(
    holder: PathLockManager, prober: PathLockManager, raw_engine: Engine
) -> None:
    # BIGINT's maximum is one fixed id, not a random one: the random paths keep
    # the test to itself, and it leaves no lock behind.
    largest = 2**63 - 1
    path = f"/hostile-{secrets.token_hex(8)}"
    with holder.for_customer(largest).lock_paths(path) as lease:
        assert _stored(raw_engine, lease.lease_id) == [(_hex(path), "exclusive")]
        assert _blocked(prober, largest, path + "/x", "exclusive")
        assert not _blocked(prober, largest - 1, path, "exclusive")


# -- 8. the PAD SPACE gap on MariaDB ------------------------------------------------------------


def test_trailing_spaces_are_stored_as_given(
    holder: PathLockManager, raw_engine: Engine, customer_id: int
) -> None:
    # Storage keeps them on both backends; only the comparison below differs.
    paths = ["/a ", "/b  /c ", "/ d/ "]
    with holder.for_customer(customer_id).lock_paths(*paths) as lease:
        assert lease.paths == tuple((path, "exclusive") for path in sorted(paths))
        assert _stored(raw_engine, lease.lease_id) == [
            (_hex(path), "exclusive") for path in sorted(paths)
        ]
        assert [info.path for info in holder.list_locks(customer_id)] == sorted(paths)


# (held, probe, blocked by the path rules); the first five compare, with "=",
# paths that differ only by trailing spaces, which a PAD SPACE collation (such
# as utf8mb4_bin) would find equal.
TRAILING_SPACES = [
    ("/a ", "/a", False),
    ("/a", "/a ", False),
    ("/a ", "/a  ", False),
    ("/a ", "/a/b", False),  # the probe's ancestor /a is compared with the row /a
    ("/a", "/a /b", False),  # the probe's ancestor /a  is compared with the row /a
    ("/a /b", "/a", False),  # only LIKE '/a/%', which does not pad
    ("/a/b", "/a ", False),
    ("/a ", "/a /b", True),
    ("/a ", "/a ", True),
]


@pytest.mark.parametrize(("held", "probe", "expected"), TRAILING_SPACES)
def test_a_trailing_space_is_part_of_the_path(
    holder: PathLockManager,
    prober: PathLockManager,
    customer_id: int,
    held: str,
    probe: str,
    expected: bool,
) -> None:
    with holder.for_customer(customer_id).lock_paths(held):
        assert _blocked(prober, customer_id, probe, "exclusive") is expected


def test_a_trailing_space_is_part_of_a_node_id(
    database_url: str,
    raw_engine: Engine,
    customer_id: int,
) -> None:
    node_id = f"hostile-{secrets.token_hex(4)}"
    with _quiet(database_url, node_id) as manager:
        lease = manager.for_customer(customer_id).lock_paths("/mine")
        released = manager.release_node(node_id + " ")
        still_held = _stored(raw_engine, lease.lease_id)
        lease.release()
    assert released == 0
    assert still_held == [(_hex("/mine"), "exclusive")]

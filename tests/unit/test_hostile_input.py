"""Hostile input to the checks that run before any SQL (issue 5, part 3).

Every value the public API takes goes through :mod:`pathlock.paths` or
:mod:`pathlock._core.validation` first; these tests throw at them what an attacker or
a careless caller would: wrong types, NaN and infinities, ints too large to
print or to convert to a float, control characters, lone surrogates, paths
over the length limit, SQL-shaped and LIKE-shaped text. The contract: a valid
value comes back (normalized), anything else raises a :class:`PathLockError`:
:class:`ArgumentTypeError` (a ``TypeError``) for a wrong type,
:class:`InvalidArgument` (a ``ValueError``; :class:`InvalidPath` for paths) for
a bad value, never another exception. ``tests/unit/test_paths.py`` and
``test_validation.py`` hold the examples; this file holds the hostile sweeps
and an independent oracle for each check. What the database makes of the
values is ``tests/integration/test_hostile_input.py``.
"""

from __future__ import annotations

import math
import pickle
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import PurePosixPath

import pytest
from apscheduler.triggers.interval import IntervalTrigger
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlock._core import validation
from pathlock._core.limits import LEASE_ID_LENGTH, NODE_ID_LENGTH, REASON_LENGTH
from pathlock.errors import (
    ArgumentTypeError,
    InvalidArgument,
    InvalidPath,
    InvalidPathType,
    PathLockError,
)
from pathlock.paths import MAX_PATH_LENGTH, normalize, normalize_request
from pathlock.types import EXCLUSIVE, SHARED

PROPERTY = settings(max_examples=300, deadline=None)
SWEEP = settings(max_examples=150, deadline=None)

# -- strategies ---------------------------------------------------------------------

# Ints past the float range (10**309 and up) and past what str() prints (more
# than 4300 digits): both used to escape as OverflowError / ValueError.
huge_ints = st.integers(300, 5000).map(lambda exponent: 10**exponent)
signed_huge_ints = st.one_of(huge_ints, huge_ints.map(lambda value: -value))
edge_ints = st.sampled_from([0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), 2**64])

numbers = st.one_of(
    st.integers(),
    edge_ints,
    signed_huge_ints,
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]),
)
"""Right type for the checks of seconds and counts, any value."""

not_numbers = st.one_of(
    st.none(),
    st.booleans(),  # bool is an int subclass: True seconds is a bug
    st.text(max_size=5),
    st.binary(max_size=5),
    st.complex_numbers(),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(object()),
)

# Characters that trouble SQL, LIKE, shells, terminals, logs and UTF-8.
_TROUBLE = (
    "\x00\x01\t\n\r\x1b\x7f\x80\x85\x9f"  # C0, DEL, C1: Unicode category Cc
    "\u2028\u2029\u200b\u200d\u202e\ufeff\u00a0"  # separators, invisible, bidi, BOM, NBSP
    "\ufffe\uffff\U0010ffff"  # noncharacters
    "%_\\'\";-/*. "  # LIKE, SQL, paths
    "e\u0301\u00e9\U0001f600\u6f22"  # NFD and NFC, emoji, CJK
)
lone_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
hostile_chars = st.one_of(st.characters(), st.sampled_from(_TROUBLE), lone_surrogates)
hostile_text = st.text(hostile_chars, max_size=40)

anything = st.one_of(
    numbers,
    not_numbers,
    hostile_text,
    hostile_text.map(lambda text: "/" + text),
    st.just(bytearray(b"/a")),
    st.just(memoryview(b"/a")),
    st.just(PurePosixPath("/a")),
    st.lists(signed_huge_ints, min_size=1, max_size=2),  # whose repr() raises
)
"""Values of every type, for the checks that must never raise a foreign error."""

_CHECKS: dict[str, Callable[[object], object]] = {
    "normalize": normalize,
    "normalize case-insensitive": lambda value: normalize(value, case_insensitive=True),
    "normalize_request exclusive": lambda value: normalize_request([value], ()),
    "normalize_request shared": lambda value: normalize_request((), [value]),
    "normalize_request as the exclusive iterable": lambda value: normalize_request(value, ()),
    "normalize_request as the shared iterable": lambda value: normalize_request(["/a"], value),
    "customer_id": validation.customer_id,
    "timeout": validation.timeout,
    "ttl": validation.ttl,
    "interval": validation.interval,
    "reason": validation.reason,
    "node_id": validation.node_id,
    "lease_id": validation.lease_id,
    "batch_size": lambda value: validation.positive_int("batch_size", value),
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: float) -> float:
    """The value as seconds, an int past the float range as an infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


# -- every check: only pathlock's own errors ------------------------------------------


def _failure(check: Callable[[object], object], value: object) -> PathLockError | None:
    """What ``check(value)`` raised, if a PathLockError (anything else escapes)."""
    try:
        check(value)
    except PathLockError as error:
        return error
    return None


@SWEEP
@given(value=anything)
@pytest.mark.parametrize("name", list(_CHECKS))
def test_every_check_fails_only_with_a_pathlock_error(name: str, value: object) -> None:
    error = _failure(_CHECKS[name], value)
    if error is None:
        return
    # One of the two families, never both, and a message that can be shown.
    assert isinstance(error, ArgumentTypeError) != isinstance(error, InvalidArgument)
    assert isinstance(error, TypeError) is isinstance(error, ArgumentTypeError)
    assert isinstance(error, ValueError) is isinstance(error, InvalidArgument)
    assert str(error)
    if isinstance(error, InvalidPath):
        assert len(str(error)) < 300, str(error)
        if not isinstance(value, memoryview):  # the one value that cannot be pickled
            # Errors cross process boundaries, whatever path they carry.
            clone = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own error
            assert type(clone) is InvalidPath
            assert clone.problem == error.problem


@pytest.mark.parametrize("name", list(_CHECKS))
@pytest.mark.parametrize(
    "value",
    [10**5000, -(10**5000), [10**5000]],
    ids=["huge", "huge-negative", "list-of-huge"],
)
def test_ints_too_large_to_print_give_a_clear_error(name: str, value: object) -> None:
    # str() of an int over 4300 digits raises ValueError; float() of one past
    # 1.8e308 raises OverflowError. Neither may escape, and the message must
    # not try to print the digits.
    if name == "timeout" and value == 10**5000:
        assert validation.timeout(value) is None  # longer than any float: no limit
        return
    with pytest.raises(PathLockError) as caught:
        _CHECKS[name](value)
    message = str(caught.value)
    assert len(message) < 300, message
    assert "0" * 400 not in message


# -- numbers: seconds ---------------------------------------------------------------


@PROPERTY
@given(numbers)
def test_timeout_against_an_oracle(value: float) -> None:
    seconds = _as_float(value)
    if math.isnan(seconds) or seconds < 0:
        with pytest.raises(InvalidArgument, match="timeout"):
            validation.timeout(value)
    elif math.isinf(seconds):
        assert validation.timeout(value) is None  # no limit
    else:
        assert validation.timeout(value) == seconds


@PROPERTY
@given(numbers)
def test_ttl_against_an_oracle(value: float) -> None:
    seconds = _as_float(value)
    if validation.MIN_TTL <= seconds <= validation.MAX_TTL:
        result = validation.ttl(value)
        assert result == seconds
        assert type(result) is float
    else:
        with pytest.raises(InvalidArgument, match="ttl"):
            validation.ttl(value)


@PROPERTY
@given(numbers)
def test_interval_against_an_oracle(value: float) -> None:
    seconds = _as_float(value)
    if 0 < seconds <= validation.MAX_INTERVAL:
        assert validation.interval(value) == seconds
    else:
        with pytest.raises(InvalidArgument, match="interval"):
            validation.interval(value)


@PROPERTY
@given(not_numbers)
@pytest.mark.parametrize("check", [validation.timeout, validation.ttl, validation.interval])
def test_seconds_of_the_wrong_type(check: Callable[[object], object], value: object) -> None:
    if value is None and check is validation.timeout:
        assert check(value) is None  # None is "no limit", not a wrong type
        return
    with pytest.raises(ArgumentTypeError, match="number of seconds"):
        check(value)


@PROPERTY
@given(
    st.one_of(
        st.floats(min_value=1e-9, max_value=validation.MAX_INTERVAL),
        st.just(validation.MAX_INTERVAL),
        st.integers(1, int(validation.MAX_INTERVAL)),
    )
)
def test_every_accepted_interval_can_be_scheduled(value: float) -> None:
    # The reaper hands the interval (and a tenth of it as jitter) to
    # APScheduler; an interval it cannot compute with must be refused first.
    seconds = validation.interval(value)
    trigger = IntervalTrigger(seconds=seconds, jitter=seconds / 10)
    now = datetime.now(UTC)
    first = trigger.get_next_fire_time(None, now)
    assert first is not None
    assert trigger.get_next_fire_time(first, first) is not None


@pytest.mark.parametrize("value", [1e12, 1e14, 1e300, 10**400, validation.MAX_INTERVAL * 1.0001])
def test_intervals_the_scheduler_cannot_compute_with_are_refused(value: float) -> None:
    with pytest.raises(InvalidArgument, match="interval"):
        validation.interval(value)


# -- numbers: ids and counts ----------------------------------------------------------


@PROPERTY
@given(st.one_of(st.integers(), edge_ints, signed_huge_ints))
def test_customer_id_against_an_oracle(value: int) -> None:
    if 0 <= value < 2**63:
        assert validation.customer_id(value) == value
    else:
        with pytest.raises(InvalidArgument, match="customer_id") as caught:
            validation.customer_id(value)
        assert len(str(caught.value)) < 4500


@PROPERTY
@given(st.one_of(not_numbers, st.floats(), st.sampled_from([1.0, 42.0, 0.0])))
def test_customer_id_of_the_wrong_type(value: object) -> None:
    if _is_int(value):  # not_numbers holds no ints, booleans aside
        return
    with pytest.raises(ArgumentTypeError, match="customer_id must be an int"):
        validation.customer_id(value)


@PROPERTY
@given(st.one_of(st.integers(), edge_ints, signed_huge_ints))
def test_counts_against_an_oracle(value: int) -> None:
    # Batch sizes become a LIMIT: SQLite binds nothing above 2**63 - 1.
    if 1 <= value < 2**63:
        assert validation.positive_int("batch_size", value) == value
    else:
        with pytest.raises(InvalidArgument, match="batch_size"):
            validation.positive_int("batch_size", value)


@PROPERTY
@given(st.one_of(not_numbers, st.floats()))
def test_counts_of_the_wrong_type(value: object) -> None:
    if _is_int(value):
        return
    with pytest.raises(ArgumentTypeError, match="max_attempts must be an int"):
        validation.positive_int("max_attempts", value)


# -- strings: reason, node_id, lease_id -----------------------------------------------


def _has_category(text: str, *categories: str) -> bool:
    return any(unicodedata.category(char) in categories for char in text)


boundary_text = st.builds(
    lambda length, tail: "x" * length + tail,
    st.sampled_from([NODE_ID_LENGTH - 1, NODE_ID_LENGTH, REASON_LENGTH - 2, REASON_LENGTH]),
    st.text(hostile_chars, max_size=3),
)
"""Text around the length limits, its end drawn from the troublemakers."""


@PROPERTY
@given(st.one_of(hostile_text, boundary_text))
def test_reason_against_an_oracle(value: str) -> None:
    # Free text: control characters other than NUL are allowed (pathlock ls
    # shows them escaped); NUL and lone surrogates cannot be stored.
    if len(value) <= REASON_LENGTH and "\x00" not in value and not _has_category(value, "Cs"):
        assert validation.reason(value) == value
    else:
        with pytest.raises(InvalidArgument, match="reason"):
            validation.reason(value)


@PROPERTY
@given(st.one_of(hostile_text, boundary_text))
def test_node_id_against_an_oracle(value: str) -> None:
    printable = not _has_category(value, "Cc", "Cs")
    if 0 < len(value) <= NODE_ID_LENGTH and printable:
        assert validation.node_id(value) == value
    else:
        with pytest.raises(InvalidArgument, match="node_id"):
            validation.node_id(value)


_HEX = "0123456789abcdef"
lease_like = st.one_of(
    st.text(_HEX, min_size=LEASE_ID_LENGTH, max_size=LEASE_ID_LENGTH),
    st.text(_HEX + "ABCDEF%_\\'\n x", min_size=30, max_size=34),
    hostile_text,
)


@PROPERTY
@given(lease_like)
def test_lease_id_against_an_oracle(value: str) -> None:
    if len(value) == LEASE_ID_LENGTH and all(char in _HEX for char in value):
        assert validation.lease_id(value) == value
    else:
        with pytest.raises(InvalidArgument, match="lease_id"):
            validation.lease_id(value)


@pytest.mark.parametrize(
    "value",
    [
        "0123456789abcdef0123456789abcdef\n",  # a trailing newline: fullmatch, not match + $
        "0123456789ABCDEF0123456789ABCDEF",
        "\uff10" * LEASE_ID_LENGTH,  # fullwidth digits are \d, not [0-9]
        "\u0663" * LEASE_ID_LENGTH,  # Arabic-Indic digits
        "%" * LEASE_ID_LENGTH,  # a LIKE pattern matching every lease
        "_" * LEASE_ID_LENGTH,
        "' OR '1'='1' --                  ",
        " 0123456789abcdef0123456789abcde",
    ],
)
def test_lease_id_lookalikes_are_refused(value: str) -> None:
    with pytest.raises(InvalidArgument, match="lease_id"):
        validation.lease_id(value)


@pytest.mark.parametrize("check", [validation.reason, validation.node_id, validation.lease_id])
@pytest.mark.parametrize(
    "value",
    [None, True, 0, 2**63, 1.5, b"web-1", bytearray(b"x"), ["x"], {"x": 1}, PurePosixPath("x")],
)
def test_strings_of_the_wrong_type(check: Callable[[object], object], value: object) -> None:
    with pytest.raises(ArgumentTypeError, match="must be a str"):
        check(value)


# -- paths: what is refused -----------------------------------------------------------

_CC = [chr(code) for code in [*range(0x20), *range(0x7F, 0xA0)]]


def test_the_control_characters_are_exactly_category_cc() -> None:
    every = [chr(code) for code in range(0x110000)]
    assert [char for char in every if unicodedata.category(char) == "Cc"] == _CC


@pytest.mark.parametrize("char", _CC, ids=lambda char: f"U+{ord(char):04X}")
@pytest.mark.parametrize(
    "template", ["/a{}b", "/{}", "/a/{}", "/a/{}/", "{}/a", "/.{}", "/a/..{}/b", "/{}" + "x" * 4100]
)
def test_every_control_character_is_refused_anywhere(char: str, template: str) -> None:
    raw = template.format(char)
    with pytest.raises(InvalidPath, match=f"control character U\\+{ord(char):04X}") as caught:
        normalize(raw)
    assert caught.value.path == raw
    message = str(caught.value)
    assert char not in message  # shown escaped: a log line stays one line
    assert len(message) < 300


@PROPERTY
@given(lone_surrogates, st.text(max_size=10), st.text(max_size=10), st.booleans())
def test_lone_surrogates_are_refused_anywhere(
    surrogate: str, before: str, after: str, case_insensitive: bool
) -> None:
    raw = "/" + before + surrogate + after
    with pytest.raises(InvalidPath):
        normalize(raw, case_insensitive=case_insensitive)
    with pytest.raises(InvalidPath):
        normalize_request([], ["/ok", raw])


dot_parts = st.lists(st.sampled_from([".", "..", "a", "%", "...", ". ", " ."]), max_size=6)


@PROPERTY
@given(dot_parts, st.lists(st.integers(1, 3), min_size=7, max_size=7), st.booleans())
def test_dot_components_are_refused_however_they_are_spelled(
    parts: list[str], slashes: list[int], case_insensitive: bool
) -> None:
    raw = "/" * slashes[0] + "".join(
        part + "/" * count for part, count in zip(parts, slashes[1:], strict=False)
    )
    if any(part in (".", "..") for part in parts):
        with pytest.raises(InvalidPath, match="component"):
            normalize(raw, case_insensitive=case_insensitive)
    else:
        assert normalize(raw, case_insensitive=case_insensitive) == "/" + "/".join(parts)


@pytest.mark.parametrize(
    ("length", "accepted"),
    [(MAX_PATH_LENGTH, True), (MAX_PATH_LENGTH + 1, False), (5000, False)],
)
@pytest.mark.parametrize("filler", ["x", "%", "_", "\\", "'", "\U0001f600", "\u6f22", "\u00e9"])
def test_length_limit_in_code_points(length: int, accepted: bool, filler: str) -> None:
    # The limit counts code points, whatever their UTF-8 size: 4000 emoji are
    # 16000 bytes, which the utf8mb4 column holds.
    raw = "/" + filler * (length - 1)
    if accepted:
        assert normalize(raw) == raw
    else:
        with pytest.raises(InvalidPath, match=f"longer than {MAX_PATH_LENGTH}") as caught:
            normalize(raw)
        assert len(str(caught.value)) < 300


def test_nfd_input_is_measured_after_composition_at_the_limit() -> None:
    # 7999 code points as written, 4000 once composed: accepted, composed.
    assert normalize("/" + "e\u0301" * 3999) == "/" + "\u00e9" * 3999
    with pytest.raises(InvalidPath, match="longer than"):
        normalize("/" + "e\u0301" * 4000)


def test_raw_input_is_bounded_before_normalization() -> None:
    # 64000 slashes normalize to "/", but the work on absurd input is bounded.
    limit = 16 * MAX_PATH_LENGTH
    assert normalize("/" * limit) == "/"
    with pytest.raises(InvalidPath, match="before normalization") as caught:
        normalize("/" * (limit + 1))
    assert len(str(caught.value)) < 300


_NOT_STR = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    1.5,
    math.nan,
    b"/a",
    bytearray(b"/a"),
    memoryview(b"/a"),
    ["/a"],
    ("/a",),
    {"/a": 1},
    {"/a"},
    Decimal(1),
    Fraction(1, 2),
]


@pytest.mark.parametrize("value", _NOT_STR, ids=lambda value: type(value).__name__)
def test_paths_that_are_not_str_are_refused(value: object) -> None:
    with pytest.raises(InvalidPathType, match="expected a str") as caught:
        normalize(value)
    assert caught.value.path is value
    with pytest.raises(InvalidPathType, match="expected a str"):
        normalize_request(["/ok", value], ())
    with pytest.raises(InvalidPathType, match="expected a str"):
        normalize_request((), ["/ok", value])


@pytest.mark.parametrize(
    "shared",
    ["/a", "", b"/a", None, 0, 1.5, True, 10**5000],
    ids=["str", "empty-str", "bytes", "None", "int", "float", "bool", "huge-int"],
)
def test_shared_must_be_an_iterable_of_paths_not_one(shared: object) -> None:
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request(["/ok"], shared)
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request(shared, ["/ok"])


@pytest.mark.parametrize(
    "shared",
    [bytearray(b"/a"), memoryview(b"/a"), range(3), {1: "/a"}, [["/a"]], [("/a",)], iter([None])],
    ids=["bytearray", "memoryview", "range", "dict-of-ints", "nested-list", "nested-tuple", "iter"],
)
def test_iterables_of_the_wrong_kind_are_refused(shared: object) -> None:
    # Iterable, but of ints or containers: each member is refused as a path.
    with pytest.raises(InvalidPathType, match="expected a str"):
        normalize_request(["/ok"], shared)


def test_a_dict_is_an_iterable_of_its_keys() -> None:
    assert normalize_request([], {"/b": None, "/a": 0}) == (("/a", SHARED), ("/b", SHARED))


@pytest.mark.parametrize(
    "request_",
    [((), ()), ([], []), (iter(()), {}), (set(), frozenset()), (map(str, ()), range(0))],
)
def test_empty_requests_are_refused(request_: tuple[object, object]) -> None:
    with pytest.raises(InvalidPath, match="no paths"):
        normalize_request(*request_)


# -- paths: what is accepted, exactly as given -------------------------------------------


@pytest.mark.parametrize(
    "component",
    [
        "\u2028",  # LINE SEPARATOR (Zl)
        "\u2029",  # PARAGRAPH SEPARATOR (Zp)
        "a\u200bb",  # ZERO WIDTH SPACE (Cf)
        "\u202etxt.exe",  # RIGHT-TO-LEFT OVERRIDE (Cf)
        "\ufeff",  # BOM (Cf)
        "\u00a0",  # NO-BREAK SPACE (Zs)
        "\ufffe\uffff",  # noncharacters (Cn)
        "\U0010ffff",
        "\ue000",  # private use (Co)
    ],
)
def test_characters_outside_cc_and_cs_are_ordinary(component: str) -> None:
    # The contract rejects exactly Unicode categories Cc (C0, DEL, C1) and Cs
    # (lone surrogates). Line separators and invisible format characters are
    # not control characters in Unicode's sense and are locked as written
    # (file systems allow them too); the integration tests show they lock
    # exactly themselves.
    assert normalize("/" + component) == "/" + component
    assert normalize("/a/" + component + "/b") == "/a/" + component + "/b"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/\uff0e\uff0e", "/\uff0e\uff0e"),  # FULLWIDTH FULL STOP: not "..", NFC keeps it
        ("/\u2025", "/\u2025"),  # TWO DOT LEADER: NFKC would make it "..", NFC does not
        ("/.\u0307", "/.\u0307"),  # a dot and a combining dot above: no composition
        ("/a\uff0fb", "/a\uff0fb"),  # FULLWIDTH SOLIDUS is not a separator
        ("/a\u2215b", "/a\u2215b"),  # DIVISION SLASH neither
        ("/a\\..\\b", "/a\\..\\b"),  # backslashes are not separators
    ],
)
def test_lookalikes_of_dots_and_slashes_are_ordinary_characters(raw: str, expected: str) -> None:
    # pathlock never resolves a path, so a lookalike cannot climb out of a
    # folder: it is one more name, distinct from the one it imitates.
    assert normalize(raw) == expected
    assert normalize(raw) not in ("/..", "/a/b")


_SQL_SHAPED = [
    "/'; DROP TABLE path_locks; --",
    "/a' OR '1'='1",
    '/a" OR "1"="1',
    "/a'); DELETE FROM customer_locks; --",
    "/%' OR path LIKE '%",
    "/\\'; --",
    "/a/*comment*/b",
    "/${jndi:ldap:x}",
    "/%s%s%(c_id)s",  # pyformat placeholders inside a value
    "/?/:c_id/:1",
]


@pytest.mark.parametrize("raw", _SQL_SHAPED)
def test_sql_shaped_paths_are_plain_paths(raw: str) -> None:
    assert normalize(raw) == raw
    assert normalize_request([raw], ()) == ((raw, EXCLUSIVE),)


@PROPERTY
@given(st.lists(st.text(st.sampled_from(list("%_\\'\" ab")), min_size=1, max_size=5), max_size=4))
def test_wildcards_quotes_and_spaces_survive_normalization(parts: list[str]) -> None:
    parts = [part for part in parts if part not in (".", "..")]
    raw = "/" + "/".join(parts)
    # Nothing is stripped, trimmed or unescaped: spaces at either end of a
    # component included.
    assert normalize(raw) == raw
    assert normalize(raw + "/") == raw

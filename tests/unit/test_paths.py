"""Unit tests of the pure path logic: normalization, the hierarchy relations and
LIKE escaping. No database: the LIKE semantics are modelled by a small matcher."""

from __future__ import annotations

import itertools
import re
import unicodedata
from pathlib import PurePosixPath, PureWindowsPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlock.errors import InvalidPath, InvalidPathType, PathLockError
from pathlock.paths import (
    LIKE_ESCAPE,
    MAX_PATH_LENGTH,
    ancestors,
    compatible,
    conflicts,
    descendants_pattern,
    escape_like,
    normalize,
    normalize_request,
    overlaps,
)
from pathlock.types import EXCLUSIVE, SHARED, Mode

PROPERTY = settings(max_examples=300, deadline=None)

# -- strategies -------------------------------------------------------------------

# A small alphabet makes shared prefixes (the "/a" vs "/ab" trap) likely and
# includes the LIKE specials, quotes, a space, an accented letter and an emoji.
_SMALL_ALPHABET = "ab.%_\\ '\"\u00e9\U0001f600"
small_components = st.text(_SMALL_ALPHABET, min_size=1, max_size=4).filter(
    lambda part: part not in (".", "..")
)


def _join(parts: list[str]) -> str:
    return "/" + "/".join(parts)


normalized_paths = st.lists(small_components, max_size=4).map(_join)
"""Paths already in canonical form (NFC, no empty, '.' or '..' components)."""

# Components of valid but messy input: anything but '/', control characters and
# surrogates, and never '.' or '..'.
wide_components = st.text(
    st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="/"),
    min_size=1,
    max_size=6,
).filter(lambda part: part not in (".", ".."))


@st.composite
def messy_paths(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A valid path with duplicate and trailing slashes, and its components."""
    parts = draw(st.lists(wide_components, max_size=5))
    raw = "/" * draw(st.integers(1, 3))
    for part in parts:
        raw += part + "/" * draw(st.integers(1, 3))
    if parts and not draw(st.booleans()):
        raw = raw.rstrip("/")
    return raw, parts


_TRICKY = st.sampled_from(["/", "/", "/", ".", ".", "a", "\x00", "\n", "\x7f", "\x85", "\ud800"])
raw_inputs = st.one_of(
    st.text(st.one_of(_TRICKY, st.characters()), max_size=30),
    st.text(st.one_of(_TRICKY, st.characters()), max_size=30).map(lambda text: "/" + text),
)
"""Arbitrary strings, half of them absolute, with the troublemakers over-represented."""


@st.composite
def path_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """Two normalized paths, often related (equal, ancestor, descendant, prefix trap)."""
    first = draw(normalized_paths)
    base = "" if first == "/" else first
    related = st.one_of(
        normalized_paths,
        st.just(first),
        st.sampled_from([*ancestors(first), first]),
        st.lists(small_components, min_size=1, max_size=3).map(lambda parts: base + _join(parts)),
        small_components.map(lambda part: first + part if first != "/" else "/" + part),
    )
    second = draw(related)
    if draw(st.booleans()):
        return second, first
    return first, second


def like(pattern: str, text: str, escape: str = LIKE_ESCAPE) -> bool:
    """SQL ``text LIKE pattern ESCAPE escape`` (binary collation), in Python."""
    regex = []
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            escaped = next(chars, None)
            if escaped is None:
                raise ValueError(f"pattern {pattern!r} ends with the escape character")
            regex.append(re.escape(escaped))
        elif char == "%":
            regex.append(".*")
        elif char == "_":
            regex.append(".")
        else:
            regex.append(re.escape(char))
    return re.fullmatch("".join(regex), text, flags=re.DOTALL) is not None


def test_like_matcher_itself() -> None:
    assert like("/a/%", "/a/b")
    assert like("/a/%", "/a/")
    assert not like("/a/%", "/a")
    assert like("/_", "/x")
    assert not like("/_", "/xy")
    assert like("/\\%", "/%")
    assert not like("/\\%", "/x")
    assert like("/\\\\", "/\\")
    with pytest.raises(ValueError, match="ends with the escape"):
        like("/a\\", "/a")


# -- normalize: examples --------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/", "/"),
        ("//", "/"),
        ("///", "/"),
        ("/a", "/a"),
        ("/a/", "/a"),
        ("//a///b/", "/a/b"),
        ("/a//b//", "/a/b"),
        ("/Shared/marketing/Dallas", "/Shared/marketing/Dallas"),
        ("/a.b/.c/d..", "/a.b/.c/d.."),
        ("/.../x", "/.../x"),
        ("/100%/a_b", "/100%/a_b"),
        ("/back\\slash", "/back\\slash"),
        ('/it\'s/"quoted"', '/it\'s/"quoted"'),
        ("/ spaced /  name ", "/ spaced /  name "),
        ("/\U0001f600/\u2603", "/\U0001f600/\u2603"),
        ("/%/_/\\", "/%/_/\\"),
    ],
)
def test_normalize_examples(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "/.",
        "/..",
        "/./",
        "/../",
        "/a/.",
        "/a/..",
        "/a/./b",
        "/a/../b",
        "/a/b/..",
        "//..//",
        "/a//.//b",
    ],
)
def test_normalize_rejects_dot_components(raw: str) -> None:
    with pytest.raises(InvalidPath, match="component"):
        normalize(raw)


@pytest.mark.parametrize("raw", ["a", "a/b", "./a", "../a", " /a", "\\a", "C:/a", "~/a"])
def test_normalize_rejects_relative_paths(raw: str) -> None:
    with pytest.raises(InvalidPath, match="not absolute"):
        normalize(raw)


def test_normalize_rejects_empty() -> None:
    with pytest.raises(InvalidPath, match="empty"):
        normalize("")


@pytest.mark.parametrize("value", [None, b"/a", 1, ["/a"], ("/a",), 1.5, object()])
def test_normalize_rejects_non_str(value: object) -> None:
    with pytest.raises(InvalidPathType, match="expected a str") as caught:
        normalize(value)
    assert caught.value.path is value
    assert isinstance(caught.value, TypeError)


def test_a_posix_path_object_is_a_path() -> None:
    assert normalize(PurePosixPath("/Shared//a/")) == "/Shared/a"
    with pytest.raises(InvalidPath, match="not absolute"):
        normalize(PureWindowsPath("/Shared/a"))  # its str is "\\Shared\\a"


def test_invalid_path_is_a_value_error_and_a_pathlock_error() -> None:
    with pytest.raises(ValueError, match="invalid path") as caught:
        normalize("relative")
    assert isinstance(caught.value, PathLockError)
    with pytest.raises(TypeError, match="invalid path") as caught:
        normalize(None)
    assert isinstance(caught.value, PathLockError)
    assert not isinstance(caught.value, ValueError)  # one family, never both


@pytest.mark.parametrize(
    "char", ["\x00", "\x01", "\t", "\n", "\r", "\x1b", "\x1f", "\x7f", "\x80", "\x85", "\x9f"]
)
def test_normalize_rejects_control_characters(char: str) -> None:
    with pytest.raises(InvalidPath, match="control character"):
        normalize(f"/a{char}b")
    with pytest.raises(InvalidPath, match="control character"):
        normalize(f"/a/{char}")


@pytest.mark.parametrize("char", [chr(code) for code in (0xD800, 0xDBFF, 0xDC00, 0xDFFF)])
def test_normalize_rejects_lone_surrogates(char: str) -> None:
    with pytest.raises(InvalidPath, match="surrogate"):
        normalize(f"/a{char}")


def test_normalize_rejects_relative_path_with_nul() -> None:
    with pytest.raises(InvalidPath):
        normalize("a\x00")


def test_normalize_length_limit() -> None:
    exactly = "/" + "a" * (MAX_PATH_LENGTH - 1)
    assert len(exactly) == MAX_PATH_LENGTH
    assert normalize(exactly) == exactly
    with pytest.raises(InvalidPath, match="longer than"):
        normalize("/" + "a" * MAX_PATH_LENGTH)


def test_normalize_length_counts_components_and_separators() -> None:
    exactly = "/" + "/".join(["a" * 9] * 400)
    assert len(exactly) == MAX_PATH_LENGTH
    assert normalize(exactly) == exactly
    with pytest.raises(InvalidPath, match="longer than"):
        normalize(exactly + "b")


def test_normalize_length_is_measured_after_collapsing_slashes() -> None:
    raw = "/" * 5000 + "a" + "/" * 5000 + "b" + "/" * 5000
    assert len(raw) > MAX_PATH_LENGTH
    assert normalize(raw) == "/a/b"
    # Trailing slashes past the limit do not count either.
    exactly = "/" + "a" * (MAX_PATH_LENGTH - 1)
    assert normalize(exactly + "/" * 100) == exactly


def test_normalize_length_is_measured_after_nfc() -> None:
    # Decomposed é is two code points, composed one: 4001 raw, 2001 normalized.
    decomposed = "/" + "e\u0301" * 2000
    assert normalize(decomposed) == "/" + "\u00e9" * 2000
    # U+0958 is a composition exclusion: NFC expands it to two code points.
    expanding = "/" + "\u0958" * 2000
    assert len(unicodedata.normalize("NFC", expanding)) == 4001
    with pytest.raises(InvalidPath, match="longer than"):
        normalize(expanding)


def test_normalize_length_is_measured_after_case_folding() -> None:
    # "ß" case-folds to "ss": 2001 characters become 4001.
    raw = "/" + "\u00df" * 2000
    assert normalize(raw) == raw
    with pytest.raises(InvalidPath, match="longer than"):
        normalize(raw, case_insensitive=True)


def test_normalize_nfc() -> None:
    composed = "/caf\u00e9"
    decomposed = "/cafe\u0301"
    assert composed != decomposed
    assert normalize(composed) == normalize(decomposed) == composed
    assert normalize("/Cafe\u0301/Cafe\u0301") == "/Caf\u00e9/Caf\u00e9"


def test_normalize_is_case_sensitive_by_default() -> None:
    assert normalize("/Shared/A") == "/Shared/A"
    assert normalize("/Shared/A") != normalize("/shared/a")
    assert normalize("/STRASSE") != normalize("/stra\u00dfe")


def test_normalize_case_insensitive_folds() -> None:
    assert normalize("/Shared/A", case_insensitive=True) == "/shared/a"
    assert normalize("/Shared/A", case_insensitive=True) == normalize(
        "/shared/a", case_insensitive=True
    )
    assert (
        normalize("/STRASSE", case_insensitive=True)
        == normalize("/stra\u00dfe", case_insensitive=True)
        == "/strasse"
    )
    # Folding and NFC together: upper-case decomposed É equals lower-case composed é.
    assert normalize("/CAFE\u0301", case_insensitive=True) == normalize(
        "/caf\u00e9", case_insensitive=True
    )


def test_normalize_case_insensitive_still_rejects_dot_components() -> None:
    with pytest.raises(InvalidPath, match="component"):
        normalize("/A/../B", case_insensitive=True)


# -- normalize: properties ----------------------------------------------------------


def _try_normalize(raw: str, *, case_insensitive: bool) -> str | None:
    try:
        return normalize(raw, case_insensitive=case_insensitive)
    except InvalidPath:
        return None


def _assert_canonical(result: str) -> None:
    assert result.startswith("/")
    assert "//" not in result
    assert result == "/" or not result.endswith("/")
    assert len(result) <= MAX_PATH_LENGTH
    assert unicodedata.is_normalized("NFC", result)
    if result != "/":
        for part in result[1:].split("/"):
            assert part
            assert part not in (".", "..")
    for char in result:
        assert unicodedata.category(char) not in ("Cc", "Cs"), repr(result)


@PROPERTY
@given(raw_inputs, st.booleans())
def test_normalize_output_is_canonical_and_idempotent(raw: str, case_insensitive: bool) -> None:
    result = _try_normalize(raw, case_insensitive=case_insensitive)
    if result is None:
        return
    _assert_canonical(result)
    assert normalize(result, case_insensitive=case_insensitive) == result


@PROPERTY
@given(messy_paths(), st.booleans())
def test_normalize_messy_valid_paths(messy: tuple[str, list[str]], case_insensitive: bool) -> None:
    raw, parts = messy
    result = normalize(raw, case_insensitive=case_insensitive)
    _assert_canonical(result)
    assert normalize(result, case_insensitive=case_insensitive) == result
    if case_insensitive:
        folded = [unicodedata.normalize("NFC", part.casefold()) for part in parts]
        assert result == _join([unicodedata.normalize("NFC", part) for part in folded])
    else:
        assert result == _join([unicodedata.normalize("NFC", part) for part in parts])


@PROPERTY
@given(raw_inputs)
def test_normalize_accepts_nothing_with_control_characters(raw: str) -> None:
    forbidden = any(unicodedata.category(char) in ("Cc", "Cs") for char in raw)
    if forbidden:
        with pytest.raises(InvalidPath):
            normalize(raw)


@PROPERTY
@given(normalized_paths)
def test_normalize_keeps_canonical_paths_verbatim(path: str) -> None:
    assert normalize(path) == path
    assert normalize(path + "/") == path
    assert normalize(path.replace("/", "//")) == path


@PROPERTY
@given(raw_inputs, st.booleans())
def test_normalize_accepts_exactly_absolute_inputs_with_clean_components(
    raw: str, case_insensitive: bool
) -> None:
    result = _try_normalize(raw, case_insensitive=case_insensitive)
    clean = (
        raw.startswith("/")
        and not any(unicodedata.category(char) in ("Cc", "Cs") for char in raw)
        and not any(part in (".", "..") for part in raw.split("/"))
    )
    # Short inputs only, so the length limit plays no part here.
    assert (result is not None) == clean


# -- ancestors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", []),
        ("/a", ["/"]),
        ("/a/b", ["/", "/a"]),
        ("/a/b/c", ["/", "/a", "/a/b"]),
        ("/Shared/marketing/Dallas", ["/", "/Shared", "/Shared/marketing"]),
        ("/%/_/\\", ["/", "/%", "/%/_"]),
    ],
)
def test_ancestors_examples(path: str, expected: list[str]) -> None:
    assert ancestors(path) == expected


@PROPERTY
@given(normalized_paths)
def test_ancestors_are_the_proper_prefixes_at_separators(path: str) -> None:
    found = ancestors(path)
    if path == "/":
        assert found == []
        return
    parts = path[1:].split("/")
    assert found == [_join(parts[:depth]) for depth in range(len(parts))]
    assert path not in found
    assert found == sorted(found, key=len)
    for ancestor in found:
        assert ancestor == "/" or path.startswith(ancestor + "/")


# -- overlaps, compatible, conflicts ---------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("/a", "/a", True),
        ("/a", "/a/b", True),
        ("/a/b", "/a", True),
        ("/a", "/a/b/c/d", True),
        ("/", "/", True),
        ("/", "/a", True),
        ("/a/b/c", "/", True),
        ("/a", "/ab", False),
        ("/ab", "/a", False),
        ("/a/b", "/a/bc", False),
        ("/a/b", "/a/c", False),
        ("/a", "/b", False),
        ("/a/b", "/b/a", False),
        ("/Shared/marketing/Dallas", "/Shared", True),
        ("/Shared/marketing/Dallas", "/Shared/marketing", True),
        ("/Shared/marketing/Dallas", "/Shared/marketing/Dallas/q3.xls", True),
        ("/Shared/marketing/Dallas", "/Shared/Engineering/test", False),
        ("/Shared/marketing/Dallas", "/Shared/QA", False),
        ("/Shared/marketing/Dallas", "/private/kpatel", False),
        ("/Shared/marketing/Dallas", "/Shared/marketing/Dallas2", False),
        ("/a%", "/ab", False),
        ("/a_", "/ab", False),
    ],
)
def test_overlaps_examples(first: str, second: str, expected: bool) -> None:
    assert overlaps(first, second) is expected
    assert overlaps(second, first) is expected


@PROPERTY
@given(normalized_paths)
def test_root_overlaps_everything(path: str) -> None:
    assert overlaps("/", path)
    assert overlaps(path, "/")


@PROPERTY
@given(path_pairs())
def test_overlaps_matches_the_ancestor_relation(pair: tuple[str, str]) -> None:
    first, second = pair
    expected = first == second or first in ancestors(second) or second in ancestors(first)
    assert overlaps(first, second) is expected
    assert overlaps(second, first) is expected


@PROPERTY
@given(path_pairs(), st.booleans(), st.booleans())
def test_a_lock_at_depth_0_reaches_no_path_below_its_own(
    pair: tuple[str, str], first_shallow: bool, second_shallow: bool
) -> None:
    first, second = pair
    expected = (
        first == second
        or (first in ancestors(second) and not first_shallow)
        or (second in ancestors(first) and not second_shallow)
    )
    assert overlaps(first, second, first_shallow, second_shallow) is expected
    assert overlaps(second, first, second_shallow, first_shallow) is expected


def test_depth_0_examples() -> None:
    assert overlaps("/a", "/a", True, True)
    assert not overlaps("/", "/a", first_shallow=True)
    assert overlaps("/", "/a", second_shallow=True)
    assert not overlaps("/a", "/a/b/c", first_shallow=True)
    assert not overlaps("/a", "/ab", False, False)
    assert conflicts(("/a", SHARED), ("/a", EXCLUSIVE), True, False)
    assert not conflicts(("/a/b", EXCLUSIVE), ("/a", EXCLUSIVE), False, True)


def test_compatible_matrix() -> None:
    assert compatible(SHARED, SHARED)
    assert not compatible(SHARED, EXCLUSIVE)
    assert not compatible(EXCLUSIVE, SHARED)
    assert not compatible(EXCLUSIVE, EXCLUSIVE)


_OVERLAPPING = [("/a", "/a"), ("/a", "/a/b"), ("/a/b", "/a"), ("/", "/x/y")]
_DISJOINT = [("/a", "/ab"), ("/a/b", "/a/c"), ("/a", "/b")]


@pytest.mark.parametrize(
    ("first_mode", "second_mode"), list(itertools.product([SHARED, EXCLUSIVE], repeat=2))
)
@pytest.mark.parametrize(("first", "second"), _OVERLAPPING + _DISJOINT)
def test_conflict_matrix(first: str, second: str, first_mode: Mode, second_mode: Mode) -> None:
    overlapping = (first, second) in _OVERLAPPING
    both_shared = first_mode == second_mode == SHARED
    expected = overlapping and not both_shared
    assert conflicts((first, first_mode), (second, second_mode)) is expected
    assert conflicts((second, second_mode), (first, first_mode)) is expected


@PROPERTY
@given(path_pairs(), st.sampled_from([SHARED, EXCLUSIVE]), st.sampled_from([SHARED, EXCLUSIVE]))
def test_conflicts_property(pair: tuple[str, str], first_mode: Mode, second_mode: Mode) -> None:
    first, second = pair
    result = conflicts((first, first_mode), (second, second_mode))
    assert result is (overlaps(first, second) and not first_mode == second_mode == SHARED)


# -- LIKE escaping ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/plain", "/plain"),
        ("/100%", "/100\\%"),
        ("/a_b", "/a\\_b"),
        ("/back\\slash", "/back\\\\slash"),
        ("%_\\", "\\%\\_\\\\"),
        ("", ""),
    ],
)
def test_escape_like_examples(text: str, expected: str) -> None:
    assert escape_like(text) == expected


@PROPERTY
@given(st.text(_SMALL_ALPHABET + "/x"), st.text(_SMALL_ALPHABET + "/x"))
def test_escaped_text_matches_only_itself(text: str, other: str) -> None:
    pattern = escape_like(text)
    assert like(pattern, text)
    assert like(pattern, other) is (other == text)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a", "/a/%"),
        ("/a/b", "/a/b/%"),
        ("/a%b_c\\d", "/a\\%b\\_c\\\\d/%"),
    ],
)
def test_descendants_pattern_examples(path: str, expected: str) -> None:
    assert descendants_pattern(path) == expected


def test_descendants_pattern_of_root_excludes_root_itself() -> None:
    pattern = descendants_pattern("/")
    assert like(pattern, "/a")
    assert like(pattern, "/a/b")
    assert not like(pattern, "/"), f"{pattern!r} matches the root itself"


def test_descendants_pattern_is_not_fooled_by_wildcards_in_the_path() -> None:
    pattern = descendants_pattern("/a_")
    assert like(pattern, "/a_/x")
    assert not like(pattern, "/ab/x")
    pattern = descendants_pattern("/a%")
    assert like(pattern, "/a%/x")
    assert not like(pattern, "/abc/x")
    assert not like(pattern, "/a/x")
    pattern = descendants_pattern("/a\\")
    assert like(pattern, "/a\\/x")
    assert not like(pattern, "/a/x")


@PROPERTY
@given(path_pairs())
def test_descendants_pattern_matches_exactly_the_proper_descendants(
    pair: tuple[str, str],
) -> None:
    path, other = pair
    expected = other != path and path in ancestors(other)
    assert like(descendants_pattern(path), other) is expected


# -- normalize_request --------------------------------------------------------------


def test_normalize_request_sorts_and_deduplicates() -> None:
    result = normalize_request(["/b", "/a", "/a/", "//a"], ["/c", "/d//", "/c"])
    assert result == (
        ("/a", EXCLUSIVE),
        ("/b", EXCLUSIVE),
        ("/c", SHARED),
        ("/d", SHARED),
    )


def test_normalize_request_exclusive_wins_over_shared() -> None:
    assert normalize_request(["/a"], ["/a"]) == (("/a", EXCLUSIVE),)
    assert normalize_request(["/a/"], ["//a", "/b"]) == (("/a", EXCLUSIVE), ("/b", SHARED))


def test_normalize_request_applies_case_folding() -> None:
    result = normalize_request(["/A"], ["/a", "/B"], case_insensitive=True)
    assert result == (("/a", EXCLUSIVE), ("/b", SHARED))
    result = normalize_request(["/A"], ["/a", "/B"])
    assert result == (("/A", EXCLUSIVE), ("/B", SHARED), ("/a", SHARED))


def test_normalize_request_accepts_any_iterable() -> None:
    result = normalize_request((p for p in ["/x", "/y"]), {"/z": 1})
    assert result == (("/x", EXCLUSIVE), ("/y", EXCLUSIVE), ("/z", SHARED))
    assert normalize_request(frozenset({"/a"}), ()) == (("/a", EXCLUSIVE),)


def test_normalize_request_rejects_an_empty_request() -> None:
    with pytest.raises(InvalidPath, match="no paths"):
        normalize_request([], [])
    with pytest.raises(InvalidPath, match="no paths"):
        normalize_request((), iter(()))


@pytest.mark.parametrize("bare", ["/a", b"/a", "", "/a/b"])
def test_normalize_request_rejects_a_bare_string(bare: object) -> None:
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request([], bare)
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request(bare, [])
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request(bare, ["/b"])


@pytest.mark.parametrize("value", [None, 1, 1.5, object()])
def test_normalize_request_rejects_non_iterables(value: object) -> None:
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request(value, ["/a"])
    with pytest.raises(InvalidPathType, match="iterable"):
        normalize_request(["/a"], value)


@pytest.mark.parametrize("bad", ["relative", "", "/a/..", "/a\x00", None, b"/a", 3])
def test_normalize_request_rejects_bad_members(bad: object) -> None:
    refused = InvalidPath if isinstance(bad, str) else InvalidPathType
    with pytest.raises(refused):
        normalize_request(["/ok", bad], [])
    with pytest.raises(refused):
        normalize_request([], ["/ok", bad])


@PROPERTY
@given(st.lists(normalized_paths, max_size=5), st.lists(normalized_paths, max_size=5))
def test_normalize_request_property(exclusive: list[str], shared: list[str]) -> None:
    if not exclusive and not shared:
        with pytest.raises(InvalidPath):
            normalize_request(exclusive, shared)
        return
    result = normalize_request(exclusive, shared)
    paths = [path for path, _mode in result]
    assert paths == sorted(set(paths))
    assert set(paths) == set(exclusive) | set(shared)
    for path, mode in result:
        assert mode == (EXCLUSIVE if path in exclusive else SHARED)

"""Path normalization and the hierarchy relations, as pure functions.

A lock on a path covers the path and its whole subtree, unless it is at depth
0 (shallow): then the path alone. Two locks overlap when their paths are
equal, or one is an ancestor of the other and covers its subtree; siblings and
paths that merely share a prefix (``/a`` and ``/ab``) never overlap.

Nothing here touches the database: bad input raises :class:`InvalidPath` before
any statement runs.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Set as AbstractSet

from pathlock.errors import InvalidPath, InvalidPathType, RequestTooLarge
from pathlock.types import EXCLUSIVE, SHARED, Mode, PathMode

MAX_PATH_LENGTH = 4000
"""Longest normalized path, in characters (code points); the column's size."""

MAX_REQUEST_PATHS = 1000
"""Most paths one request may lock (after duplicates are merged)."""

MAX_REQUEST_CHARACTERS = 100_000
"""Most characters the normalized paths of one request may have in total.

With :data:`MAX_REQUEST_PATHS`, this bounds what one request sends to the
database: at the limits, the largest statement stays under 4 MiB, the smallest
default ``max_allowed_packet`` of MySQL (5.7) and MariaDB servers, whatever the
characters and the depth of the paths."""

LIKE_ESCAPE = "\\"
"""The escape character of every LIKE pattern built here."""

# C0 and C1 control characters (Unicode category Cc) and lone surrogates (Cs):
# the first are invisible in logs and shells, the second cannot be stored as
# UTF-8 at all.
_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# Bound the work done on absurd input before normalization can shrink it.
_MAX_RAW_LENGTH = 16 * MAX_PATH_LENGTH
_LIKE_SPECIAL = re.compile(r"([\\%_])")


def normalize(path: object, *, case_insensitive: bool = False) -> str:
    """Return the canonical form of ``path`` or raise :class:`InvalidPath`.

    The canonical form is absolute, uses ``/`` separators, has no duplicate or
    trailing slashes (except the root ``/`` itself) and is Unicode NFC, so two
    spellings of ``café`` are one path. ``.`` and ``..`` components are rejected,
    never resolved: a lock manager cannot know what the caller meant by them.
    With ``case_insensitive`` the path is also case-folded.
    """
    if type(path) is not str:  # not isinstance() first: an ABC's check is two Python calls
        if isinstance(path, os.PathLike):
            path = os.fspath(path)  # a PurePosixPath gives its str
        if not isinstance(path, str):
            raise InvalidPathType(
                path, f"expected a str or a path object, got {type(path).__name__}"
            )
    if not path:
        raise InvalidPath(path, "empty")
    if len(path) > _MAX_RAW_LENGTH:
        raise InvalidPath(path, f"longer than {_MAX_RAW_LENGTH} characters before normalization")
    bad = _FORBIDDEN.search(path)
    if bad:
        char = bad.group()
        kind = "surrogate" if "\ud800" <= char <= "\udfff" else "control character"
        raise InvalidPath(path, f"contains {kind} U+{ord(char):04X}")
    if not path.startswith("/"):
        raise InvalidPath(path, "not absolute (must start with '/')")
    text = unicodedata.normalize("NFC", path)
    if case_insensitive:
        # casefold() can produce decomposed sequences; normalize again.
        text = unicodedata.normalize("NFC", text.casefold())
    parts = [part for part in text.split("/") if part]
    for part in parts:
        if part in (".", ".."):
            raise InvalidPath(path, f"contains a {part!r} component")
    result = "/" + "/".join(parts)
    if len(result) > MAX_PATH_LENGTH:
        raise InvalidPath(path, f"longer than {MAX_PATH_LENGTH} characters")
    return result


def ancestors(path: str) -> list[str]:
    """The proper ancestors of a normalized path, root first.

    >>> ancestors("/a/b/c")
    ['/', '/a', '/a/b']
    >>> ancestors("/")
    []
    """
    if path == "/":
        return []
    found = ["/"]
    position = path.find("/", 1)
    while position != -1:
        found.append(path[:position])
        position = path.find("/", position + 1)
    return found


def prefix_lengths(path: str) -> list[int]:
    """The lengths of a normalized path's ancestors and of the path itself,
    root first: the paths a lock on ``path`` meets by equality are exactly
    ``path[:n]`` for these ``n``.

    >>> prefix_lengths("/a/bc/d")
    [1, 2, 5, 7]
    >>> prefix_lengths("/")
    [1]
    """
    # As ancestors(), without building them: an ancestor ends where a slash
    # begins (a path of 2,000 components has 2,000 ancestors, 8 MB of them
    # at most: 8 ms each time a request's statements were shaped).
    if path == "/":
        return [1]
    lengths = [1]
    position = path.find("/", 1)
    while position != -1:
        lengths.append(position)
        position = path.find("/", position + 1)
    lengths.append(len(path))
    return lengths


def escape_like(text: str) -> str:
    """Escape ``%``, ``_`` and the escape character so ``text`` matches itself."""
    return _LIKE_SPECIAL.sub(r"\\\1", text)


def descendants_pattern(path: str) -> str:
    """A LIKE pattern (escape character :data:`LIKE_ESCAPE`) matching exactly
    the proper descendants of a normalized path."""
    if path == "/":
        return "/_%"  # at least one character after the slash: not the root itself
    return escape_like(path + "/") + "%"


def descendants_range(path: str) -> tuple[str, str]:
    """Bounds ``(low, high)``: the normalized paths ``p`` with ``low <= p <
    high``, compared code point by code point, are exactly the proper
    descendants of ``path`` (and, for the root, the root itself). A range, not
    a LIKE pattern: MariaDB's index range for ``LIKE '/a/%'`` under a binary
    collation ends below four-byte characters, so ``/a/😀`` was not found.

    >>> descendants_range("/a/b")
    ('/a/b/', '/a/b0')
    >>> descendants_range("/")
    ('/', '0')
    """
    low = path if path == "/" else path + "/"
    # '0' follows '/' in code point order: every string that starts with
    # `low` sorts below `low` with its last character replaced by '0'.
    return low, low[:-1] + "0"


def overlaps(
    first: str, second: str, first_shallow: bool = False, second_shallow: bool = False
) -> bool:
    """True when locks on two normalized paths meet: the paths are equal, or
    one contains the other and its lock covers its subtree (a lock at depth
    0, ``*_shallow``, covers the path alone)."""
    if first == second:
        return True
    if len(first) > len(second):
        first, second, first_shallow = second, first, second_shallow
    # `first` is the shorter: it meets `second` if it is an ancestor and its
    # lock covers its subtree.
    if first_shallow:
        return False
    return first == "/" or second.startswith(first + "/")


def compatible(first: Mode, second: Mode) -> bool:
    """Only shared + shared is compatible on overlapping paths."""
    return first == SHARED and second == SHARED


def conflicts(
    first: PathMode, second: PathMode, first_shallow: bool = False, second_shallow: bool = False
) -> bool:
    """True when locks on these two (path, mode) pairs cannot be held together
    (``*_shallow``: the lock is at depth 0)."""
    return not compatible(first[1], second[1]) and overlaps(
        first[0], second[0], first_shallow, second_shallow
    )


def normalize_request(
    exclusive: object,
    shared: object,
    *,
    shallow: AbstractSet[str] = frozenset(),
    case_insensitive: bool = False,
) -> tuple[PathMode, ...]:
    """Normalize the paths of one request into sorted, unique (path, mode) pairs.

    A path asked for in both modes is locked exclusive (the stronger mode).
    A path of ``shallow`` (normalized already: see :func:`normalize_shallow`)
    that is in neither is locked exclusive.
    An empty request is an error: there would be nothing to hold. A request
    of more than :data:`MAX_REQUEST_PATHS` paths, or of more than
    :data:`MAX_REQUEST_CHARACTERS` characters of paths in total, raises
    :class:`RequestTooLarge`.
    """
    modes: dict[str, Mode] = {}
    for mode, given in ((SHARED, shared), (EXCLUSIVE, exclusive)):
        if type(given) is not tuple and (  # a tuple (of lock_paths(*paths)) is fine
            isinstance(given, (str, bytes, os.PathLike)) or not _is_iterable(given)
        ):
            raise InvalidPathType(given, "expected an iterable of path strings")
        for raw in given:  # type: ignore[attr-defined]
            modes[normalize(raw, case_insensitive=case_insensitive)] = mode
            # Checked as paths come in: a huge iterable is refused early.
            if len(modes) > MAX_REQUEST_PATHS:
                raise RequestTooLarge("paths", MAX_REQUEST_PATHS)
    if shallow:
        for path in shallow:
            modes.setdefault(path, EXCLUSIVE)
        if len(modes) > MAX_REQUEST_PATHS:
            raise RequestTooLarge("paths", MAX_REQUEST_PATHS)
    if not modes:
        raise InvalidPath((), "no paths requested")
    characters = sum(len(path) for path in modes)
    if characters > MAX_REQUEST_CHARACTERS:
        raise RequestTooLarge("characters", MAX_REQUEST_CHARACTERS, characters)
    return tuple(sorted(modes.items()))


def normalize_shallow(shallow: object, *, case_insensitive: bool = False) -> frozenset[str]:
    """The normalized paths of ``shallow``: those of a request locked at depth
    0, on the path alone, not on its subtree (WebDAV's ``Depth: 0``). Such
    a lock meets locks on the same path and those on its ancestors that
    cover their subtree, never those on its descendants."""
    if isinstance(shallow, (str, bytes, os.PathLike)) or not _is_iterable(shallow):
        raise InvalidPathType(shallow, "expected an iterable of path strings")
    paths: set[str] = set()
    for raw in shallow:  # type: ignore[attr-defined]
        paths.add(normalize(raw, case_insensitive=case_insensitive))
        if len(paths) > MAX_REQUEST_PATHS:
            raise RequestTooLarge("paths", MAX_REQUEST_PATHS)
    return frozenset(paths)


def _is_iterable(value: object) -> bool:
    try:
        iter(value)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True

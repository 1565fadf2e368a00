"""The searches of a request: the live locks and the queued requests that
conflict with its paths, in the form its :class:`Shape` (how many paths of
each mode, how long) calls for, and the parameters that fill them in.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    CompoundSelect,
    Integer,
    Join,
    Select,
    Table,
    and_,
    bindparam,
    exists,
    false,
    func,
    or_,
    select,
    union,
)

from pathlock._statements.common import (
    LOCK_COLUMNS,
    MAX_BLOCKERS,
    ONE,
    PATH_INDEX,
    WAITER_PATH_INDEX,
    alive_conditions,
    any_of,
    items,
    now,
    prefix_rows,
    requested_rows,
)
from pathlock.dialects import (
    PathIn,
    PathIs,
    PathWithin,
    force_index,
)
from pathlock.paths import ancestors, descendants_range, prefix_lengths
from pathlock.schema import path_lock_waiter_paths, path_lock_waiters, path_locks
from pathlock.types import EXCLUSIVE, PathMode


def _met(form: Shape, table: Table = path_locks) -> list[ColumnElement[bool]]:
    """For a request that spells out the paths it meets by equality: rows of
    ``table`` (live locks, or queued requests' paths) on those paths, in a
    conflicting mode."""
    met: list[ColumnElement[bool]] = []
    if form.exclusive:
        met.append(_on_or_above("x", table))
    if form.shared:
        met.append(and_(table.c.mode == EXCLUSIVE, _on_or_above("s", table)))
    return met


def _on_or_above(group: str, table: Table) -> ColumnElement[bool]:
    """Rows of ``table`` on the paths of ``:{group}_on`` (the requested
    paths), or on those of ``:{group}_above`` (their other ancestors) and
    covering their subtree: a lock at depth 0 on an ancestor does not reach
    the requested path."""
    return or_(
        PathIn(table.c.path, bindparam(f"{group}_on", expanding=True)),
        and_(
            PathIn(table.c.path, bindparam(f"{group}_above", expanding=True)),
            table.c.shallow == false(),
        ),
    )


def equal_conflicts(form: Shape, *columns: Any) -> Select[Any]:
    """Live rows of the customer on a requested path or one of its ancestors,
    in a mode that conflicts with the request's: one index lookup of
    ``(customer_id, path)`` per path met by equality.

    A request of the usual size names those paths in two lists (``:x_eq``:
    met by the exclusive paths, any row there conflicts; ``:s_eq``: met by
    the shared ones, only exclusive rows conflict), a plain ``IN`` the server
    parses and plans at the least cost. A larger one sends, instead of every
    ancestor spelled out (the square of a path's depth in characters), the
    lengths the database cuts them at (``SUBSTRING(path, 1, n)``): see
    :func:`shape`."""
    if form.spelled:
        statement = select(*columns).where(*alive_conditions(), or_(*_met(form)))
    else:
        met, conflicting = _met_by_prefixes(form, path_locks)
        statement = (
            select(*columns).select_from(met).where(path_locks.c.expires_at > now(), conflicting)
        )
    # The lookups are by values MySQL/MariaDB cost from the index statistics
    # alone (computed per row, or a list). While those are stale (a
    # customer's rows grew fast after the last ANALYZE), they guessed half
    # the table per lookup and scanned all of the customer's rows instead
    # (EXPLAIN, 100,000 rows), or took the expires_at index: the index is
    # the plan whatever the statistics say.
    return force_index(statement, path_locks, PATH_INDEX)


def _met_by_prefixes(form: Shape, table: Table) -> tuple[Join, ColumnElement[bool]]:
    """For a request that sends the lengths its paths are cut at (see
    :func:`equal_conflicts`): its paths and prefixes joined to the customer's
    rows of ``table`` on them, and the condition that a row's mode conflicts."""
    requested = requested_rows(form.paths, "requested_paths")
    prefix = prefix_rows()
    met = requested.join(prefix, prefix.c.k == requested.c.k).join(
        table,
        and_(
            table.c.customer_id == bindparam("c_id"),
            PathIs(table.c.path, func.substr(requested.c.path, ONE, prefix.c.n)),
        ),
    )
    # A row on an ancestor meets the requested path if it covers its subtree.
    reaches = or_(table.c.shallow == false(), table.c.path == requested.c.path)
    return met, and_(or_(requested.c.mode == EXCLUSIVE, table.c.mode == EXCLUSIVE), reaches)


def _descendants(group: str, count: int, table: Table = path_locks) -> ColumnElement[bool]:
    return any_of(
        [
            PathWithin(table.c.path, bindparam(f"{group}_low_{n}"), bindparam(f"{group}_high_{n}"))
            for n in range(count)
        ]
    )


def _below(exclusive: int, shared: int, table: Table = path_locks) -> list[ColumnElement[bool]]:
    """Rows of ``table`` inside the requested paths that cover their
    subtree (``exclusive`` and ``shared`` of them: the ranges
    ``:x_low_N``..``:x_high_N`` and ``:s_...``), in a conflicting mode."""
    clauses = []
    if exclusive:
        clauses.append(_descendants("x", exclusive, table))
    if shared:
        clauses.append(and_(table.c.mode == EXCLUSIVE, _descendants("s", shared, table)))
    return clauses


def below_conflicts(exclusive: int, shared: int, *columns: Any) -> Select[Any]:
    """Live rows of the customer inside a requested path (from
    ``:x_low_N`` up to ``:x_high_N``, likewise ``s_`` for the shared ones:
    index ranges), in a conflicting mode; none if no requested path covers
    its subtree."""
    return select(*columns).where(*alive_conditions(), or_(*_below(exclusive, shared), false()))


def no_conflict(form: Shape) -> list[ColumnElement[bool]]:
    """The grant's conditions that no live row conflicts with the request.
    A request that spells out the paths it meets by equality asks in one
    subquery: the lists and the ranges of its descendants are ranges of one
    index, which the server reads as one union of ranges, and it parses and
    plans one subquery instead of two."""
    if form.spelled:
        found = select(path_locks.c.id).where(
            *alive_conditions(), or_(*_met(form), *_below(*form.subtrees))
        )
        return [~force_index(found, path_locks, PATH_INDEX).exists()]
    conditions = [~equal_conflicts(form, path_locks.c.id).exists()]
    if any(form.subtrees):
        conditions.append(~below_conflicts(*form.subtrees, path_locks.c.id).exists())
    return conditions


def queued_conflicts(form: Shape, *columns: Any) -> list[Select[Any]]:
    """Live queued requests of the customer, older than ``:w_ticket``, with a
    path that conflicts with the request's (one row per such path): the
    conflict query of :func:`no_conflict` on the queue's paths (revision
    0007), along the same kind of index, joined to their requests for
    whether they are alive. One query for a request that spells out the
    paths it meets by equality, two otherwise."""
    paths, waiters = path_lock_waiter_paths, path_lock_waiters
    alive = [
        paths.c.customer_id == bindparam("c_id"),
        paths.c.ticket < bindparam("w_ticket", type_=BigInteger),
        waiters.c.expires_at > now(),
    ]
    with_request = paths.join(waiters, waiters.c.ticket == paths.c.ticket)
    if form.spelled:
        found = (
            select(*columns)
            .select_from(with_request)
            .where(*alive, or_(*_met(form, paths), *_below(*form.subtrees, paths)))
        )
        return [force_index(found, paths, WAITER_PATH_INDEX)]
    met, conflicting = _met_by_prefixes(form, paths)
    equal = (
        select(*columns)
        .select_from(met.join(waiters, waiters.c.ticket == paths.c.ticket))
        .where(*alive, conflicting)
    )
    if not any(form.subtrees):
        return [force_index(equal, paths, WAITER_PATH_INDEX)]
    below = (
        select(*columns)
        .select_from(with_request)
        .where(*alive, or_(*_below(*form.subtrees, paths)))
    )
    return [force_index(equal, paths, WAITER_PATH_INDEX), below]


def queue_clear(form: Shape) -> ColumnElement[bool]:
    """The grant's condition on the queue. A request of the usual size asks
    whether an older request in its way is queued
    (:func:`_nobody_queued_in_the_way`); a very large or very deep one, whose
    conflict query is large, whether any older request is queued at all, so
    that it is sent once per statement, not twice (the store then judges the
    queue, read whole, as it did before revision 0007)."""
    if form.spelled:
        return _nobody_queued_in_the_way(form)
    return ~exists().where(queue_condition())


def owner_holds() -> ColumnElement[bool]:
    """Whether the requesting owner (``:o_key``) holds a live lock of the
    customer."""
    return exists().where(
        path_locks.c.customer_id == bindparam("c_id"),
        path_locks.c.owner_key == bindparam("o_key"),
        path_locks.c.expires_at > now(),
    )


def _nobody_queued_in_the_way(form: Shape) -> ColumnElement[bool]:
    """The grant's condition that no older live queued request conflicts
    with the request: first whether any older request is queued at all (one
    index probe, the usual answer: none), and only if one is, whether one in
    the way is (:func:`queued_conflicts`)."""
    return or_(
        ~exists().where(queue_condition()),
        and_(*(~found.exists() for found in queued_conflicts(form, path_lock_waiter_paths.c.id))),
    )


# A request names the paths it meets by equality (its paths and their
# ancestors) in lists while they add up to at most this many characters and
# entries: every request of the usual size. A path of 2,000 components alone
# has 2,000 ancestors of up to 4,000 characters each (4 MB spelled out); such
# requests send the lengths to cut them at instead (see equal_conflicts).
SPELLED_CHARACTERS = 16_384


SPELLED_ENTRIES = 512


class Shape(NamedTuple):
    """What the statements of a request are built for: how many exclusive and
    how many shared paths, whether the paths they meet by equality are
    spelled out (see :func:`equal_conflicts`), and how many of each mode are
    locked at depth 0 (shallow)."""

    exclusive: int
    shared: int
    spelled: bool
    shallow_exclusive: int = 0
    shallow_shared: int = 0

    @property
    def paths(self) -> int:
        return self.exclusive + self.shared

    @property
    def shallow(self) -> bool:
        """Whether any path is locked at depth 0."""
        return bool(self.shallow_exclusive or self.shallow_shared)

    @property
    def subtrees(self) -> tuple[int, int]:
        """How many exclusive and how many shared paths cover their subtree:
        the ranges of descendants the conflict query reads."""
        return self.exclusive - self.shallow_exclusive, self.shared - self.shallow_shared


def shape(paths: Sequence[PathMode], shallow: AbstractSet[str] = frozenset()) -> Shape:
    """The :class:`Shape` of a request of ``paths`` (``shallow``: those of
    them locked at depth 0). A request asks for it several times on its way
    (each time some twenty calls for one path): the shapes of the last small
    requests are kept, by their paths."""
    if len(paths) > _SHAPES_PATHS:
        return _shape(paths, shallow)
    key = (paths, shallow)
    try:
        found = _SHAPES.get(key)
    except TypeError:  # paths in a list: not kept
        return _shape(paths, shallow)
    if found is None:
        if len(_SHAPES) >= _SHAPES_KEPT:
            _SHAPES.clear()
        found = _SHAPES[key] = _shape(paths, shallow)
    return found


_SHAPES: dict[tuple[Sequence[PathMode], AbstractSet[str]], Shape] = {}
_SHAPES_KEPT = 128
_SHAPES_PATHS = 4  # a kept request's paths at most (they are kept with it)


def _shape(paths: Sequence[PathMode], shallow: AbstractSet[str]) -> Shape:
    exclusive = sum(1 for _, mode in paths if mode == EXCLUSIVE)
    entries = characters = 0
    for path, _ in paths:
        lengths = prefix_lengths(path)
        entries += len(lengths)
        characters += sum(lengths)
    spelled = entries <= SPELLED_ENTRIES and characters <= SPELLED_CHARACTERS
    if not shallow:
        return Shape(exclusive, len(paths) - exclusive, spelled)
    shallow_exclusive = sum(1 for path, mode in paths if mode == EXCLUSIVE and path in shallow)
    shallow_shared = sum(1 for path, mode in paths if mode != EXCLUSIVE and path in shallow)
    return Shape(exclusive, len(paths) - exclusive, spelled, shallow_exclusive, shallow_shared)


# Stands in an empty list of paths a statement compares with: no path is ''
# (an empty IN list is spelled as a subquery the server plans apart).
NO_PATH = ""


def conflict_parameters(
    paths: Sequence[PathMode], form: Shape | None = None, shallow: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
    """The bind parameters of the conflict queries for ``paths`` (``shallow``:
    those of them locked at depth 0), in their :func:`shape`'s form unless
    ``form`` says which."""
    form = shape(paths, shallow) if form is None else form
    parameters: dict[str, Any] = {}
    if form.spelled:
        on: dict[bool, dict[str, None]] = {True: {}, False: {}}  # ordered sets
        above: dict[bool, dict[str, None]] = {True: {}, False: {}}
        for path, mode in paths:
            on[mode == EXCLUSIVE][path] = None
            listed = above[mode == EXCLUSIVE]
            for ancestor in ancestors(path):
                listed[ancestor] = None
        for group, exclusive in (("x", True), ("s", False)):
            parameters[f"{group}_on"] = list(on[exclusive]) or [NO_PATH]
            parameters[f"{group}_above"] = [
                path for path in above[exclusive] if path not in on[exclusive]
            ] or [NO_PATH]
    else:
        prefixes: list[tuple[int, int]] = []
        for k, (path, mode) in enumerate(paths):
            parameters[f"rq_path_{k}"] = path
            parameters[f"rq_mode_{k}"] = mode
            prefixes.extend((k, n) for n in prefix_lengths(path))
        parameters["prefixes"] = prefixes
    for group, wanted in (("x", True), ("s", False)):
        chosen = [
            path for path, mode in paths if (mode == EXCLUSIVE) == wanted and path not in shallow
        ]
        for n, path in enumerate(chosen):
            low, high = descendants_range(path)
            parameters[f"{group}_low_{n}"] = low
            parameters[f"{group}_high_{n}"] = high
    return parameters


@functools.lru_cache(maxsize=128)
def blockers_query(form: Shape) -> CompoundSelect[Any]:
    """Up to :data:`MAX_BLOCKERS` live rows that conflict with a request of
    this :class:`Shape`, each once."""
    return _blockers(form, *LOCK_COLUMNS)


@functools.lru_cache(maxsize=128)
def blocker_items(form: Shape) -> CompoundSelect[Any]:
    """:func:`blockers_query` with each row as one JSON array, in
    :data:`LOCK_ITEM`'s order (see :func:`items`)."""
    return _blockers(form, items(LOCK_COLUMNS))


def _blockers(form: Shape, *columns: Any) -> CompoundSelect[Any]:
    return union(
        equal_conflicts(form, *columns),
        below_conflicts(*form.subtrees, *columns),
    ).limit(bindparam("blockers_limit", MAX_BLOCKERS, type_=Integer))


def queue_condition() -> ColumnElement[bool]:
    """Live queued requests of the customer with a ticket older than
    ``:ticket`` (any queued request, for a request that has no ticket yet)."""
    return and_(
        path_lock_waiters.c.customer_id == bindparam("c_id"),
        path_lock_waiters.c.ticket < bindparam("w_ticket", type_=BigInteger),
        path_lock_waiters.c.expires_at > now(),
    )

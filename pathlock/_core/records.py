"""What the store takes in and hands back: a grant request, the outcomes of an
attempt, rows turned into :class:`~pathlock.types.LockInfo` and
:class:`~pathlock.types.WaiterInfo`. Plain values, no SQL: the request
driver and the queue rules decide on them (the bind parameters of a
request are :mod:`pathlock._parameters`')."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pathlock._core.fairness import Locked, with_depth
from pathlock.types import EXCLUSIVE, LockInfo, Mode, Owner, PathMode, WaiterInfo

if TYPE_CHECKING:
    from sqlalchemy import Row


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """Everything one attempt needs; the lease id is chosen by the client, so an
    attempt whose commit outcome is unknown can find out whether it landed."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    owner: Owner
    reason: str
    ttl: float
    # Leases of this owner whose release failed: their rows block until they
    # expire, which is a wait, not a request waiting for itself.
    abandoned: frozenset[str] = frozenset()
    # The lease's data as stored (see lease_data()), or None.
    data: bytes | None = None
    # The paths of ``paths`` locked at depth 0 (shallow).
    shallow: frozenset[str] = frozenset()

    def locked(self) -> tuple[Locked, ...]:
        """Its paths with their modes and depths, as the queue rules take them."""
        return with_depth(self.paths, self.shallow)


@dataclass(frozen=True, slots=True)
class Granted:
    fencing_token: int


@dataclass(frozen=True, slots=True)
class Blocked:
    """The attempt was denied by live conflicting rows (``blockers``, at most
    :data:`MAX_BLOCKERS`) and/or older queued requests that must go first
    (``ahead``). ``ticket``
    is the request's place in the queue (``None``: not queued) and
    ``version`` the customer's sentinel version as the attempt left it."""

    blockers: tuple[LockInfo, ...]
    ahead: tuple[WaiterInfo, ...]
    ticket: int | None
    version: int
    ahead_complete: bool = False
    """Whether ``ahead`` names every older request that must go first (not
    only the youngest of them, as a read cut short at its limit does)."""


@dataclass(frozen=True, slots=True)
class Outlook:
    """What plain reads say of a waiting request: whether an attempt would be
    granted now, and whether no older queued request must go first."""

    free: bool
    next_in_line: bool
    ahead: tuple[int, ...] = ()
    """The tickets of the older queued requests that must go first."""
    handed: int | None = None
    """The fencing token of rows a release handed to the request, if any."""
    handed_for: float = 0.0
    """How long those rows have left, by the database's clock (seconds)."""
    held: tuple[str, ...] = ()
    """The leases of the live locks in the way."""
    ahead_leases: tuple[str, ...] = ()
    """The leases of the requests of ``ahead``."""
    ahead_complete: bool = False
    """Whether ``ahead`` names every older request that must go first."""


@dataclass(frozen=True, slots=True)
class Watched:
    """A waiting request's check: the customer's sentinel ``version``; the
    fencing token of the rows a release ``handed`` to the request, if any; how
    many of the requests found ahead of it are still queued (``ahead_left``),
    if asked."""

    version: int
    handed: int | None = None
    ahead_left: int | None = None
    looked: bool = False
    """Whether the check could see paths handed over at all (not on a
    connection whose releases do not hand over, such as a Galera node's)."""
    handed_for: float = 0.0
    """How long the rows handed over have left, by the database's clock
    (seconds)."""
    held_left: int | None = None
    """Whether one of the leases asked about (those in the request's way at
    its last attempt or judgement) still has a live row: 1 or 0, if asked."""


@dataclass(frozen=True, slots=True)
class Deadlocked:
    """Waiting could never succeed: the request is blocked only by locks of its
    own owner (``party`` is ``None``), or by locks (``held_by``) of an owner
    whose queued request (``party``) waits for locks of the requesting owner."""

    party: WaiterInfo | None
    held_by: tuple[LockInfo, ...]


_TIMES = ("created_at", "expires_at")


def item_row(names: Sequence[str], item: str | bytes) -> Any:
    """A row of a read that returns each row as one JSON array of ``names``
    (see :func:`pathlock._statements.common.items`): its columns as attributes, as
    a row has them (times in the server's text form are parsed).

    The waiters of a crowd read the same queued requests again and again
    (the sixteen in the way, the head of the queue): the values of the
    last rows read are kept by their text, and each call gets a row of its
    own."""
    key = (names, item)
    try:
        values = _DECODED.get(key)
    except TypeError:  # not a text: json.loads() says what is wrong
        values = None
    if values is None:
        values = _decoded(names, json.loads(item))
        if len(item) <= _KEPT_LENGTH:
            if len(_DECODED) >= _KEPT:
                _DECODED.clear()
            _DECODED[key] = values
    return SimpleNamespace(**values)


def values_row(names: Sequence[str], values: Sequence[Any]) -> Any:
    """:func:`item_row` of the JSON array already parsed."""
    return SimpleNamespace(**_decoded(names, values))


def _decoded(names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
    """The columns ``names`` of a row of ``values``, its times parsed."""
    row = dict(zip(names, values, strict=True))
    for name in _TIMES:
        text = row.get(name)
        if isinstance(text, str):
            row[name] = datetime.fromisoformat(text)
    return row


# Rows and paths decoded lately, by their text (see item_row()): a bound on
# their number and on the length of a text kept.
_DECODED: dict[tuple[Sequence[str], str | bytes], dict[str, Any]] = {}
_QUEUED: dict[str | bytes, tuple[tuple[PathMode, ...], frozenset[str]]] = {}
_KEPT = 4096
_KEPT_LENGTH = 4096


def as_utc(value: datetime) -> datetime:
    # DATETIME columns come back naive; they hold UTC by construction.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def lock_info(row: Row[*tuple[Any, ...]]) -> LockInfo:
    mode: Mode = row.mode
    return LockInfo(
        customer_id=row.customer_id,
        path=row.path,
        mode=mode,
        lease_id=row.lease_id,
        owner=Owner(row.node_id, row.pid, row.thread, row.owner_key),
        reason=row.reason,
        fencing_token=row.fencing_token,
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at),
        shallow=bool(row.shallow),
    )


def waiter_info(row: Row[*tuple[Any, ...]]) -> WaiterInfo:
    shallow: frozenset[str] = frozenset()
    try:
        paths, shallow = queued_paths(row.paths)
    except (ValueError, TypeError):  # not pathlock's JSON: show it as it is
        paths = ((str(row.paths), EXCLUSIVE),)
    return WaiterInfo(
        customer_id=row.customer_id,
        ticket=row.ticket,
        paths=paths,
        lease_id=row.lease_id,
        owner=Owner(row.node_id, row.pid, row.thread, row.owner_key),
        reason=row.reason,
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at),
        shallow=shallow,
    )


def queued_json(paths: Sequence[PathMode], shallow: frozenset[str]) -> str:
    """A request's paths as its queue row keeps them: a JSON list of
    ``[path, mode]`` pairs, ``[path, mode, 0]`` for a path at depth 0."""
    return json.dumps(
        [[path, mode, 0] if path in shallow else [path, mode] for path, mode in paths]
    )


def queued_paths(text: str | bytes) -> tuple[tuple[PathMode, ...], frozenset[str]]:
    """The paths of a queue row (see :func:`queued_json`) and those of them
    at depth 0. Raises ``ValueError`` or ``TypeError`` for anything else.
    Those of the last rows read are kept (see :func:`item_row`)."""
    try:
        found = _QUEUED.get(text)
    except TypeError:  # not a text: raised below
        found = None
    if found is None:
        found = _queued_paths(text)
        if len(text) <= _KEPT_LENGTH:
            if len(_QUEUED) >= _KEPT:
                _QUEUED.clear()
            _QUEUED[text] = found
    return found


def _queued_paths(text: str | bytes) -> tuple[tuple[PathMode, ...], frozenset[str]]:
    paths: list[PathMode] = []
    shallow: set[str] = set()
    for path, mode, *depth in json.loads(text):
        paths.append((str(path), mode))
        if depth == [0]:
            shallow.add(str(path))
        elif depth:
            raise ValueError(f"not a depth: {depth!r}")
    return tuple(paths), frozenset(shallow)


_BYTES, _TEXT = b"\x00", b"\x01"  # what a lease's stored data was given as


def lease_data(value: bytes | str | None) -> bytes | None:
    """A lease's data as the tables keep it: a byte that says whether it was
    given as bytes or as text, then its bytes (text in UTF-8)."""
    if value is None:
        return None
    if isinstance(value, str):
        return _TEXT + value.encode()
    return _BYTES + bytes(value)


def given_data(stored: bytes | None) -> bytes | str | None:
    """The data of a lease as it was given (see :func:`lease_data`); data
    that pathlock did not write comes back as it is stored."""
    if stored is None:
        return None
    stored = bytes(stored)
    kind, value = stored[:1], stored[1:]
    if kind == _TEXT:
        try:
            return value.decode()
        except UnicodeDecodeError:
            return stored
    return value if kind == _BYTES else stored

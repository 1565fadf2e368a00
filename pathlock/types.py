"""Plain value types shared by the store, the manager and the errors."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple, Protocol

Mode = Literal["exclusive", "shared"]
"""``exclusive`` (move, delete, rename, write) or ``shared`` (read, copy source).
Two locks on overlapping paths are compatible only when both are shared."""

EXCLUSIVE: Mode = "exclusive"
SHARED: Mode = "shared"

PathMode = tuple[str, Mode]
"""A normalized path and the mode it is locked in."""


class Cancel(Protocol):
    """What ``lock_paths(cancel=...)`` takes: a :class:`threading.Event`, or
    anything with its ``is_set()``."""

    def is_set(self) -> bool: ...


_LONG_PATH = 120  # characters: longer paths are shortened in messages
_PATHS_SHOWN = 10  # paths of one request listed in a message


def show(value: object) -> str:
    """``repr(value)`` for a message, even when Python refuses it: the digits
    of an int of more than 4300 of them (``sys.get_int_max_str_digits()``),
    also inside a list, raise a ValueError that must not replace the error
    being reported."""
    try:
        return repr(value)
    except ValueError:
        if isinstance(value, int):
            sign = "a negative" if value < 0 else "an"
            return f"{sign} integer of {value.bit_length()} bits"
        return f"<{type(value).__name__} that cannot be shown>"


def shorten(path: str) -> str:
    """A path for a message: a long one keeps its start and its end."""
    if len(path) <= _LONG_PATH:
        return path
    return f"{path[:60]}...{path[-40:]} ({len(path)} characters)"


def describe_paths(paths: Sequence[PathMode], shallow: AbstractSet[str] = frozenset()) -> str:
    """``/a (exclusive), /b (shared, depth 0)`` for messages, long paths and
    long lists shortened; ``shallow``: the paths locked at depth 0."""
    text = ", ".join(
        f"{shorten(path)} ({mode}{', depth 0' if path in shallow else ''})"
        for path, mode in paths[:_PATHS_SHOWN]
    )
    if len(paths) > _PATHS_SHOWN:
        text += f" and {len(paths) - _PATHS_SHOWN} more"
    return text


class Owner(NamedTuple):
    """Who asked for a lock: node id, process id and thread, for people, and
    ``key``, the identity pathlock goes by.

    ``key`` is a manager instance's random identity (a new one in a process
    forked from it) plus the holder within it: the calling thread, the
    calling asyncio task, or the ``owner=`` name the caller gave. It decides
    :meth:`CustomerLocks.release_locks` and the own-owner deadlock rule; host
    names, process ids and thread ids repeat across containers, thread pools
    and restarts, so they never do. Even the key never authorises a release on
    its own: the lease id does. ``thread`` is the operating system's thread id
    (as shown by ``ps -L`` or ``py-spy``) of the thread that asked. Rows
    written by pathlock before owners had keys have an empty ``key``.
    """

    node_id: str
    pid: int
    thread: str
    key: str = ""

    @classmethod
    def current(cls, node_id: str) -> Owner:
        """The calling thread of this process on ``node_id``, for display
        only: it has no ``key``, so it is nobody's identity."""
        return cls(node_id, os.getpid(), str(threading.get_native_id()))

    @property
    def identity(self) -> str:
        """What makes two owners the same: ``key``, or for rows written
        before owners had keys, node id, process id and thread."""
        return self.key or f"{self.node_id}\0{self.pid}\0{self.thread}"

    def __str__(self) -> str:
        granted_by = f"{self.node_id} pid {self.pid} thread {self.thread}"
        return f"a detached lease from {granted_by}" if self.detached else granted_by

    @property
    def detached(self) -> bool:
        """Whether this is the owner of a detached lease (see
        :meth:`CustomerLocks.lock_detached`): nobody's but the lease's own."""
        return self.key.startswith(DETACHED)


DETACHED = "detached."
"""The start of a detached lease's owner key, which is this and its lease id:
each detached lease is an owner of its own, held by no manager, thread or
task (see :meth:`CustomerLocks.lock_detached`)."""


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One locked path as stored in the database (a row of ``path_locks``).

    Times are the database's clock, in UTC. A row whose ``expires_at`` has
    passed no longer blocks anyone, even before the reaper deletes it.
    """

    customer_id: int
    path: str
    mode: Mode
    lease_id: str
    owner: Owner
    reason: str
    fencing_token: int
    created_at: datetime
    expires_at: datetime
    shallow: bool = False
    """Whether the lock is on the path alone, at depth 0 (``shallow=`` of
    :meth:`CustomerLocks.lock_paths`), not on its subtree."""

    def describe(self) -> str:
        """One line for messages: path, mode, owner and reason."""
        depth = ", depth 0" if self.shallow else ""
        text = f"{shorten(self.path)} ({self.mode}{depth}) held by {self.owner}"
        if self.reason:
            text += f" for {self.reason!r}"
        return text


@dataclass(frozen=True, slots=True)
class DetachedLease:
    """A detached lease, as its grant returns it (see
    :meth:`CustomerLocks.lock_detached`): its paths stay locked until
    ``ttl`` seconds after the grant, by the database's clock, unless it is
    renewed or released by its ``lease_id``, from any manager of any process.
    No manager keeps it, renews it or releases it on its own."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    fencing_token: int
    """Strictly increasing per customer over grants, as for every lease."""
    ttl: float
    """Seconds it lasts from its grant unless renewed."""
    reason: str
    shallow: frozenset[str] = frozenset()
    """The paths among ``paths`` locked at depth 0 (``shallow=``)."""

    def describe_paths(self) -> str:
        """The lease's paths and modes, for messages."""
        return describe_paths(self.paths, self.shallow)


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A lease as the database holds it now (see
    :meth:`CustomerLocks.get_lease`): its rows, read together. Times are the
    database's clock, in UTC."""

    customer_id: int
    lease_id: str
    paths: tuple[PathMode, ...]
    fencing_token: int
    owner: Owner
    reason: str
    created_at: datetime
    expires_at: datetime
    data: bytes | str | None = None
    """The data its request gave (``data=``), bytes or text as given."""
    shallow: frozenset[str] = frozenset()
    """The paths among ``paths`` locked at depth 0 (``shallow=``)."""

    @property
    def detached(self) -> bool:
        """Whether it is a detached lease (:meth:`CustomerLocks.lock_detached`)."""
        return self.owner.detached

    def describe_paths(self) -> str:
        """The lease's paths and modes, for messages."""
        return describe_paths(self.paths, self.shallow)


@dataclass(frozen=True, slots=True)
class WaiterInfo:
    """One queued request that is waiting for its paths (a row of
    ``path_lock_waiters``); ``ticket`` orders the queue, oldest first."""

    customer_id: int
    ticket: int
    paths: tuple[PathMode, ...]
    lease_id: str
    owner: Owner
    reason: str
    created_at: datetime
    expires_at: datetime
    shallow: frozenset[str] = frozenset()
    """The paths among ``paths`` requested at depth 0 (``shallow=``)."""

    def describe(self) -> str:
        """One line for messages: ticket, paths, owner and reason."""
        paths = describe_paths(self.paths, self.shallow)
        text = f"ticket {self.ticket}: {paths} requested by {self.owner}"
        if self.reason:
            text += f" for {self.reason!r}"
        return text

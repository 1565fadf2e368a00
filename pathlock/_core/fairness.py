"""Who a blocked request waits for: the queue rules, pure and without SQL.

The store reads the customer's live waiters and the requesting owner's own
locks inside the attempt's transaction (under the sentinel, so the picture is
the one the grant is judged against) and asks this module two questions:

- :func:`waiters_ahead`: which earlier queued requests must go first. FIFO among
  conflicting requests, except that a waiter which waits (directly, or behind
  another such waiter) for locks of the requesting owner is not waited for:
  otherwise the owner would wait for a waiter that waits for the owner, a
  deadlock made by fairness alone.
- :func:`deadlock_party`: whether the request closes a cycle of two owners, each
  holding what the other waits for. Then waiting can only end in timeouts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from pathlock.paths import conflicts
from pathlock.types import LockInfo, Mode, Owner, PathMode, WaiterInfo

Locked = tuple[str, Mode, bool]
"""A path, its mode and whether it is locked at depth 0 (shallow)."""


def with_depth(paths: Iterable[PathMode], shallow: AbstractSet[str]) -> tuple[Locked, ...]:
    """A request's (path, mode) pairs with whether each is shallow."""
    return tuple((path, mode, path in shallow) for path, mode in paths)


def requests_conflict(first: Iterable[Locked], second: Iterable[Locked]) -> bool:
    """True when some pair of the two requests' paths conflicts."""
    others = tuple(second)
    return any(
        conflicts((path, mode), (other, other_mode), shallow, other_shallow)
        for path, mode, shallow in first
        for other, other_mode, other_shallow in others
    )


def may_conflict(first: Iterable[PathMode], second: Iterable[PathMode]) -> bool:
    """:func:`requests_conflict` with every path taken to cover its subtree:
    never false where the requests conflict, whatever their depths (for the
    guesses that only decide who is asked to look again)."""
    others = tuple(second)
    return any(conflicts(mine, other) for mine in first for other in others)


def waiter_request(waiter: WaiterInfo) -> tuple[Locked, ...]:
    """A queued request's paths with their modes and depths."""
    return with_depth(waiter.paths, waiter.shallow)


def waiters_ahead(
    request: Sequence[Locked],
    earlier: Sequence[WaiterInfo],
    owner_locks: Sequence[Locked],
) -> list[WaiterInfo]:
    """The waiters of ``earlier`` (live, older tickets, oldest first) that
    ``request`` must let go first.

    A waiter is passed over when it waits for the requesting owner: its request
    conflicts with one of ``owner_locks`` (the owner's live locks), or with an
    older waiter that is itself passed over for that reason (it queues behind
    it). Every other earlier waiter whose request conflicts with ``request`` is
    ahead.
    """
    ahead: list[WaiterInfo] = []
    behind_owner: list[tuple[Locked, ...]] = []  # the requests of those passed over
    for waiter in sorted(earlier, key=lambda info: info.ticket):
        paths = waiter_request(waiter)
        if requests_conflict(paths, owner_locks) or any(
            requests_conflict(paths, passed) for passed in behind_owner
        ):
            behind_owner.append(paths)
        elif requests_conflict(paths, request):
            ahead.append(waiter)
    return ahead


def deadlock_party(
    owner: Owner,
    blockers: Sequence[LockInfo],
    waiters: Sequence[WaiterInfo],
    owner_locks: Sequence[Locked],
) -> WaiterInfo | None:
    """The queued request of another owner that closes a cycle, or ``None``.

    ``blockers`` are the live locks that deny the request of ``owner``;
    ``waiters`` the customer's live queued requests. If an owner of a blocker
    is itself queued for something that ``owner_locks`` (the requesting owner's
    live locks) block, each of the two holds what the other waits for: neither
    lock will be released while both wait.
    """
    holders = {info.owner.identity for info in blockers} - {owner.identity}
    for waiter in sorted(waiters, key=lambda info: info.ticket):
        if waiter.owner.identity in holders and requests_conflict(
            waiter_request(waiter), owner_locks
        ):
            return waiter
    return None

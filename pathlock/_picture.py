"""Who is in the way of a request: the live conflicting locks, the older
queued requests that must go first, and whether waiting could ever succeed
(a deadlock between two owners), read in the transaction of an attempt or of
a waiter's check and judged by the queue rules of :mod:`pathlock._core.fairness`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from pathlock import _batch as batch
from pathlock._core.fairness import (
    Locked,
    deadlock_party,
    requests_conflict,
    waiter_request,
    waiters_ahead,
)
from pathlock._core.records import (
    Deadlocked,
    GrantRequest,
    item_row,
    lock_info,
    waiter_info,
)
from pathlock._statements.common import LOCK_ITEM, MAX_BLOCKERS
from pathlock._statements.conflicts import blocker_items, blockers_query, shape
from pathlock._statements.leases import OWN_ROWS, OWN_ROWS_LEFT
from pathlock._statements.lookups import OWNER_LOCK_ITEMS, OWNER_LOCKS
from pathlock._statements.queue import (
    LIVE_WAITER_ITEMS,
    LIVE_WAITER_ITEMS_IF_OWNER_HOLDS,
    LIVE_WAITERS,
    MAX_AHEAD,
    MAX_WAITERS,
    QUEUE_ITEM,
    queued_in_the_way,
)
from pathlock.types import LockInfo, WaiterInfo


@dataclass
class Picture:
    """Who is in the way of a request: live conflicting locks (``blockers``)
    and the older queued requests that must go first (``ahead``); ``queued``
    is the customer's whole live queue; ``handed``, the fencing token of rows
    a release handed to the request, if any (then nothing is in its way)."""

    blockers: tuple[LockInfo, ...]
    queued: list[WaiterInfo]
    ahead: tuple[WaiterInfo, ...]
    owner_locks: OwnerLocks
    handed: int | None = None
    handed_for: float = 0.0
    """How long the rows handed over have left, in seconds (where read)."""
    queued_rows: Sequence[Any] | None = None
    """With ``handed``: the queue's rows as read, with the columns a release
    reads, but for the request's own (``None`` where the reads have not
    those)."""
    ahead_complete: bool = True
    """Whether ``ahead`` names every older request that must go first: the
    reads were not cut short at their limits."""

    @classmethod
    def read(
        cls,
        connection: Connection,
        request: GrantRequest,
        ticket: int | None,
        parameters: dict[str, Any],
        *,
        end: bool = False,
    ) -> Picture:
        """The picture, by reads in the connection's transaction. With
        ``end``, the transaction ends here too (rolled back: plain reads)."""
        if batch.supports_batches(connection):
            # Every read it may need in one round trip (the owner's own locks
            # are needed when an older queued request conflicts, as on a busy
            # path): a denied attempt makes them while it holds the
            # customer's sentinel row. A waiter's check ends with its
            # ROLLBACK in the same round trip, where it can.
            replies = batch.run(
                connection,
                cls.steps(request, parameters),
                rollback=end and batch.rolls_back_in_batches(connection),
            )
            picture = cls.judged(connection, request, ticket, parameters, replies)
        else:
            form = shape(request.paths, request.shallow)
            blocking = connection.execute(blockers_query(form), parameters).all()
            in_the_way = None
            if form.spelled:
                statement = queued_in_the_way(form, as_items=False)
                in_the_way = connection.execute(statement, parameters).all()
            own = connection.execute(OWN_ROWS, parameters).all()
            owner_locks = OwnerLocks(connection, parameters, request.abandoned)
            # The whole queue only where it is needed (see _judge).
            queue: Sequence[Any] = []
            if in_the_way is None or owner_locks.held():
                queue = connection.execute(LIVE_WAITERS, parameters).all()
            picture = cls._judge(
                request,
                ticket,
                blocking,
                in_the_way=in_the_way,
                queue=queue,
                owner_locks=owner_locks,
                own=own,
            )
        if end and connection.in_transaction():
            connection.rollback()
        return picture

    @staticmethod
    def steps(
        request: GrantRequest, parameters: dict[str, Any]
    ) -> list[tuple[Any, dict[str, Any]]]:
        """The reads of a picture, as steps of a batch (:func:`batch.run`)."""
        form = shape(request.paths, request.shallow)
        # The queue, read whole, is judged where the requests in the way are
        # not asked for (see _judge).
        queue: list[tuple[Any, dict[str, Any]]] = [(LIVE_WAITER_ITEMS, parameters)]
        if form.spelled:
            queue = [
                (queued_in_the_way(form), parameters),
                (LIVE_WAITER_ITEMS_IF_OWNER_HOLDS, parameters),
            ]
        return [
            (blocker_items(form), parameters),
            *queue,
            (OWNER_LOCK_ITEMS, parameters),
            (OWN_ROWS_LEFT, parameters),
        ]

    @classmethod
    def judged(
        cls,
        connection: Connection,
        request: GrantRequest,
        ticket: int | None,
        parameters: dict[str, Any],
        replies: Sequence[batch.Reply],
    ) -> Picture:
        """The picture from the replies to :meth:`steps`."""
        found, *queues, owned, own = replies
        owner_locks = OwnerLocks(connection, parameters, request.abandoned)
        owner_locks.known([json.loads(row.item) for row in owned.rows])
        blocking = [item_row(LOCK_ITEM, row.item) for row in found.rows]
        ahead = None
        if len(queues) > 1:  # the requests in the way, asked for
            ahead = [item_row(QUEUE_ITEM, row.item) for row in queues[0].rows]
        queue = [item_row(QUEUE_ITEM, row.item) for row in queues[-1].rows]
        return cls._judge(
            request,
            ticket,
            blocking,
            in_the_way=ahead,
            queue=queue,
            owner_locks=owner_locks,
            own=own.rows,
        )

    @classmethod
    def _judge(
        cls,
        request: GrantRequest,
        ticket: int | None,
        blocking: Sequence[Any],
        *,
        in_the_way: Sequence[Any] | None,
        queue: Sequence[Any],
        owner_locks: OwnerLocks,
        own: Sequence[Any],
    ) -> Picture:
        """``in_the_way``: the youngest older queued requests that conflict
        with the request (:func:`queued_in_the_way`), or ``None`` where a request
        too large to send its conflict query twice did not ask; ``queue``: the
        customer's whole live queue, read where ``in_the_way`` was not, or
        where the owner holds live locks (then the owner may pass requests
        that wait for them, and a cycle is possible); empty otherwise."""
        if own:
            token, *left = own[0]
            handed_for = left[0] / 1_000_000 if left and left[0] is not None else 0.0
            rows = None
            if left:  # the batched reads (see steps())
                # Plain reads, one statement each: a hand-over that landed
                # after the queue's read and before this one shows the request
                # still queued. It is not its own next in line.
                rows = [row for row in queue if row.lease_id != request.lease_id]
            return cls((), [], (), owner_locks, int(token), max(0.0, handed_for), rows)
        blockers = tuple(lock_info(row) for row in blocking)
        if in_the_way is not None and not queue:
            # The owner holds nothing here: every older request in the way
            # goes first (and none can wait for the owner).
            # Read with the ticket of an earlier attempt, so a request queued
            # in the round trip of these reads finds itself: not ahead.
            conflicting = sorted(
                (
                    info
                    for info in map(waiter_info, in_the_way)
                    if info.lease_id != request.lease_id
                    and (ticket is None or info.ticket < ticket)
                ),
                key=lambda info: info.ticket,
            )
            complete = len(in_the_way) < MAX_AHEAD
            return cls(
                blockers, conflicting, tuple(conflicting), owner_locks, ahead_complete=complete
            )
        queued = [waiter_info(row) for row in queue]
        ahead: list[WaiterInfo] = []
        earlier = [info for info in queued if ticket is None or info.ticket < ticket]
        mine = request.locked()
        if any(requests_conflict(waiter_request(info), mine) for info in earlier):
            ahead = waiters_ahead(mine, earlier, owner_locks.get())
        # The youngest, as many as the read of the requests in the way
        # returns (see MAX_AHEAD).
        complete = len(queue) < MAX_WAITERS and len(ahead) <= MAX_AHEAD
        return cls(
            blockers, queued, tuple(ahead[-MAX_AHEAD:]), owner_locks, ahead_complete=complete
        )


class OwnerLocks:
    """The requesting owner's live locks, read once and only if needed; not
    those of its abandoned leases (a grant left in doubt, a failed release),
    whose rows go away without the owner releasing anything: another owner
    queued for them is not in a cycle with this one."""

    def __init__(
        self, connection: Connection, parameters: dict[str, Any], abandoned: frozenset[str]
    ) -> None:
        self._connection = connection
        self._parameters = parameters
        self._abandoned = abandoned
        self._rows: Sequence[Sequence[Any]] | None = None

    def known(self, rows: Sequence[Sequence[Any]]) -> None:
        """The locks, read already: (path, mode, lease id, shallow) each."""
        self._rows = rows

    def held(self) -> bool:
        """Whether the owner holds any live lock of the customer, its
        abandoned leases' included: then its requests are judged against the
        whole queue."""
        return bool(self._read())

    def get(self) -> list[Locked]:
        abandoned = self._abandoned
        return [
            (path, mode, bool(shallow))
            for path, mode, lease_id, shallow in self._read()
            if lease_id not in abandoned
        ]

    def _read(self) -> Sequence[Sequence[Any]]:
        if self._rows is None:
            self._rows = self._connection.execute(OWNER_LOCKS, self._parameters).all()
        return self._rows


def deadlock_of(
    request: GrantRequest,
    blockers: tuple[LockInfo, ...],
    queued: list[WaiterInfo],
    owner_locks: OwnerLocks,
) -> Deadlocked | None:
    """Why waiting could never grant ``request``, blocked by ``blockers``:
    the owner's own locks are all in its way, or another owner it blocks
    waits for it (``queued``: the customer's live queue); ``None`` if
    waiting may succeed."""
    owner = request.owner.identity
    # Fewer rows than the limit means every blocker was seen. Rows of a lease
    # whose release failed expire on their own: waiting for them ends.
    if len(blockers) < MAX_BLOCKERS and all(
        info.owner.identity == owner and info.lease_id not in request.abandoned for info in blockers
    ):
        return Deadlocked(None, blockers)
    holders = {info.owner.identity for info in blockers}
    candidates = [
        info for info in queued if info.owner.identity in holders and info.owner.identity != owner
    ]
    if not candidates:
        return None
    party = deadlock_party(request.owner, blockers, candidates, owner_locks.get())
    if party is None:
        return None
    party_owner = party.owner.identity
    return Deadlocked(party, tuple(info for info in blockers if info.owner.identity == party_owner))

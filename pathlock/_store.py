"""Where pathlock talks to the database: one operation is one short transaction
(the statements themselves are built in :mod:`pathlock._statements`).

The acquire attempt follows the original design:

1. write the customer's sentinel row (``version = LAST_INSERT_ID(version + 1)``):
   every two grants or releases of one customer now conflict, on one server and
   on a multi-master cluster alike; the new version, returned in the UPDATE's
   own reply, is the fencing token;
2. one ``INSERT ... SELECT ... WHERE NOT EXISTS`` inserts a row for every
   requested path only if no live conflicting row exists (one consistent read
   covers all paths, so it inserts all rows or none);
3. all inserted: commit; none: read the blockers (for the caller), roll back
   (the version bump goes with it). Nothing is held between attempts.

Transactions run in READ COMMITTED: under REPEATABLE READ a read before the
sentinel write would fix the snapshot and the conflict query would read the past.
Every time is the database's clock (``UTC_TIMESTAMP(6)``, independent of the
session time zone): app servers' clocks drift, the database is the one clock
they share.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from pathlock import _batch as batch
from pathlock import _deadlines as deadlines
from pathlock._fairness import (
    Locked,
    deadlock_party,
    may_conflict,
    requests_conflict,
    waiter_request,
    waiters_ahead,
)
from pathlock._parameters import grant_parameters, lean_parameters, waiter_parameters
from pathlock._polls import Ask, SharedPolls
from pathlock._records import (
    Blocked,
    Deadlocked,
    Granted,
    GrantRequest,
    Outlook,
    Watched,
    item_row,
    lock_info,
    values_row,
    waiter_info,
)
from pathlock._statements import (
    BUMP,
    BUMP_IF_UNMOVED,
    BUMP_UNLESS_HANDED,
    CLAIM,
    CLAIM_IF_GRANTED,
    CLAIM_SENTINELS,
    COUNTED_DOWN_OR_QUEUED,
    DEQUEUE,
    DEQUEUE_IF_GRANTED,
    ENQUEUE,
    ENQUEUED,
    FORGET_REQUEST,
    HAND_OVER_WAITERS,
    HELD,
    LEAN_CLAIM,
    LEASE_ALIVE,
    LIVE_WAITER_ITEMS,
    LIVE_WAITER_ITEMS_IF_OWNER_HOLDS,
    LIVE_WAITERS,
    LOCK_AND_READ_SENTINEL,
    LOCK_ITEM,
    LOCK_SENTINEL,
    LOCK_SENTINELS,
    LOCKS_ADDED,
    LOCKS_REMOVED,
    MAX_AHEAD,
    MAX_BLOCKERS,
    MAX_WAITERS,
    NO_TICKET,
    OWN_ROWS,
    OWN_ROWS_LEFT,
    OWNER_LOCK_ITEMS,
    OWNER_LOCKS,
    QUEUE_HEAD,
    QUEUE_ITEM,
    REFRESH_WAITERS,
    RELEASE,
    RELEASE_BEFORE_HAND_OVER,
    RELEASE_OWNER,
    RENEW,
    SET_GRANT_UNTIL,
    TAKE_UP,
    UNBUMP,
    VERSION,
    WAITER_QUEUED,
    WAITERS_ALIVE,
    WAITERS_REMOVED,
    WAKE_HEIR,
    WATCHED_HEAD,
    WATCHED_LEASES,
    WATCHED_LEASES_LEFT,
    WATCHED_TICKETS,
    Shape,
    blocker_items,
    blockers_query,
    enqueue_if_blocked,
    enqueue_paths,
    grant_statement,
    lean_grant,
    queued_in_the_way,
    release_said,
    shape,
    watch_statement,
)
from pathlock._transactions import Transactions, delete_counted
from pathlock.dialects._commits import may_commit
from pathlock.dialects.base import CHANGED_ROWS, INSERTED_ID
from pathlock.errors import BackendError, PathLockError
from pathlock.paths import normalize
from pathlock.types import LockInfo, Owner, PathMode, WaiterInfo

log = logging.getLogger("pathlock.store")

QUEUED_FOR = 0.5
"""Seconds for which a customer seen with a queue (a release read one, or an
attempt queued) counts as having one: a new request of it skips the grant in
one round trip, which requires an empty queue, and goes straight to the
attempt that says who is in the way."""
_QUEUED_KEPT = 4096  # customers remembered at most
_PREPARED_KEPT = 32  # request shapes remembered as prepared: their statements
# stay among the compiled ones kept (batch._compiled keeps 512)

BUSY_FOR = 2.0
"""Seconds for which a customer whose grant without searches was refused (it
had rows: see ``LEAN_CLAIM`` in :mod:`pathlock._statements`) is granted the
searching way: a refusal costs a round trip."""


class _Heir(NamedTuple):
    """The queued request a release grants its paths to, and for how long."""

    request: WaiterInfo
    term_us: int


@dataclass(frozen=True)
class _Queue:
    """What a release read, to hand its paths over: the customer's version
    as it left it, and the oldest live queued requests."""

    version: int
    waiters: list[WaiterInfo]
    """Oldest first; empty when the release could not read them (then the
    version moves, and the waiters try for themselves)."""
    term_us: int | None
    """How long paths handed to the oldest last until it takes them up
    (microseconds); ``None``: it does not take them (queued by a pathlock
    older than revision 0006)."""


@dataclass
class _Picture:
    """Who is in the way of a request: live conflicting locks (``blockers``)
    and the older queued requests that must go first (``ahead``); ``queued``
    is the customer's whole live queue; ``handed``, the fencing token of rows
    a release handed to the request, if any (then nothing is in its way)."""

    blockers: tuple[LockInfo, ...]
    queued: list[WaiterInfo]
    ahead: tuple[WaiterInfo, ...]
    owner_locks: _OwnerLocks
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
    ) -> _Picture:
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
            owner_locks = _OwnerLocks(connection, parameters, request.abandoned)
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
    ) -> _Picture:
        """The picture from the replies to :meth:`steps`."""
        found, *queues, owned, own = replies
        owner_locks = _OwnerLocks(connection, parameters, request.abandoned)
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
        owner_locks: _OwnerLocks,
        own: Sequence[Any],
    ) -> _Picture:
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


class _OwnerLocks:
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


def _deadlock(
    request: GrantRequest,
    blockers: tuple[LockInfo, ...],
    queued: list[WaiterInfo],
    owner_locks: _OwnerLocks,
) -> Deadlocked | None:
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


def _well_formed(paths: Sequence[PathMode]) -> bool:
    """Whether a queue row's paths are a request pathlock could have made (a
    row written by hand may hold anything): only those are handed over."""
    try:
        return bool(paths) and all(
            normalize(path) == path and mode in ("exclusive", "shared") for path, mode in paths
        )
    except PathLockError:
        return False


def _queue_row(item: Any) -> Any:
    """A queued request as a release reads it (``QUEUE_ITEM``), from its JSON
    array nested in another read's (parsed, or as text); ``None`` stays."""
    if item is None:
        return None
    try:
        if isinstance(item, str):  # MySQL may return it as text
            item = json.loads(item)
        return values_row(QUEUE_ITEM, item)
    except (ValueError, TypeError):
        return SimpleNamespace()  # unreadable: nobody pathlock knows


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _queue(customer_id: int, version: int, rows: Sequence[Any]) -> _Queue:
    """What a release read: the version its lock of the sentinel row read, and
    the oldest queued requests (see :func:`_queued`)."""
    return _Queue(version, *_queued(customer_id, rows))


def _queued(customer_id: int, rows: Sequence[Any]) -> tuple[list[WaiterInfo], int | None]:
    """The oldest queued requests as a release reads them (``QUEUE_HEAD``'s
    rows, each a JSON array), and how long paths handed to the first would
    last (see :attr:`_Queue.term_us`). A row pathlock cannot read (written by
    hand) hands nothing over: the version moves, and the waiters try for
    themselves."""
    try:
        read = [item_row(QUEUE_ITEM, row.item) for row in rows]
        waiters = [waiter_info(row) for row in read]
    except (ValueError, TypeError):
        log.debug("customer %d: unreadable queued request among %.200r", customer_id, rows)
        return [], None
    term = read[0].hand_over_us if read else None
    return waiters, None if term is None else int(term)


class Store:
    """The SQL operations of grants, the queue, releases and renewals, run
    through ``transactions`` (its nodes, retries and sentinel write).

    Every public method is one transaction (or a bounded series of retries of
    one), retried on transient errors with a WARNING each time, and raises
    :class:`BackendError` for anything else. Each ends by its ``deadline``
    (monotonic time; default: ``settings.call_time`` from now), or raises
    :class:`DatabaseTimeout` (see ``Transactions.run``).
    """

    def __init__(self, transactions: Transactions) -> None:
        self._tx = transactions
        self.settings = transactions.settings
        self.events = transactions.events
        self.router = transactions.router
        self.dialect = transactions.dialect
        self.home = transactions.home
        # Customer id -> monotonic time it was last seen with a queue.
        self._queued: dict[int, float] = {}
        # Customer id -> monotonic time it was last refused a grant without
        # searches.
        self._busy: dict[int, float] = {}
        # Lease id -> the request next in line when a release handed the
        # lease its paths (None: nobody was), the one its own release hands
        # them to.
        self._heirs: dict[str, _Heir | None] = {}
        # Customer id -> (monotonic time, paths) of this manager's last
        # hand-over that granted them.
        self._handed: dict[int, tuple[float, Sequence[PathMode]]] = {}
        # The shapes of the requests prepared lately (see prepare()).
        self._prepared: set[Shape] = set()
        # The checks of this process's waiting requests, read together per
        # customer.
        self._polls = self._new_polls()

    def _new_polls(self) -> SharedPolls:
        return SharedPolls(
            self._watch,
            gather=self.settings.shared_check,
            call_time=self.settings.call_time,
            waits=self._tx.runner.waits,
        )

    def after_fork(self) -> None:
        """In a forked child: the reads of the parent's threads are not the
        child's to wait for, and a lock one of them held at the fork would
        stay held for ever."""
        self.router.after_fork()
        self._polls = self._new_polls()

    def _seen_queued(self, customer_id: int) -> None:
        now = time.monotonic()
        if len(self._queued) >= _QUEUED_KEPT:
            self._queued = {
                customer: seen
                for customer, seen in list(self._queued.items())
                if now - seen < QUEUED_FOR
            }
        self._queued[customer_id] = now

    def _likely_queued(self, customer_id: int) -> bool:
        seen = self._queued.get(customer_id)
        return seen is not None and time.monotonic() - seen < QUEUED_FOR

    def _likely_idle(self, customer_id: int) -> bool:
        """Whether a grant without searches is worth its round trip."""
        seen = self._busy.get(customer_id) if self._busy else None
        return (seen is None or time.monotonic() - seen >= BUSY_FOR) and not self._likely_queued(
            customer_id
        )

    def _seen_busy(self, customer_id: int) -> None:
        if len(self._busy) >= _QUEUED_KEPT:
            self._busy.clear()
        self._busy[customer_id] = time.monotonic()

    def tables_missing(self, error: BackendError) -> bool:
        """Whether ``error`` says pathlock's tables are missing."""
        cause = error.cause
        return isinstance(cause, DBAPIError) and self.dialect.is_missing_table(cause)

    @property
    def hands_over(self) -> bool:
        """Whether releases may grant their paths to the head of the queue
        (see :meth:`release`): where a batch may carry its COMMIT."""
        return self.dialect.batches and may_commit(self.router.nodes[0].engine.dialect)

    # -- operations -----------------------------------------------------------

    def prepare(self, request: GrantRequest) -> None:
        """Compile the statements of ``request``'s shape that travel in one
        batch, before its time starts to run (see :func:`batch.prepare`)."""
        dialect = self.router.nodes[0].engine.dialect
        # Not for an engine whose batches pathlock did not set up (a
        # caller's own, which may send statements one by one): the
        # compilation would be client CPU spent for nothing.
        if self.dialect.batches and may_commit(dialect):
            form = shape(request.paths, request.shallow)
            if form in self._prepared:
                return  # a request of this shape prepared them moments ago
            if len(self._prepared) >= _PREPARED_KEPT:
                self._prepared.clear()
            self._prepared.add(form)
            batch.prepare(CLAIM, dialect)
            batch.prepare(grant_statement(form, queued=True), dialect)
            batch.prepare(LEAN_CLAIM, dialect)
            batch.prepare(lean_grant(len(request.paths), bool(request.shallow)), dialect)
            for fresh in (True, False):
                statement = grant_statement(
                    form, queued=True, sentinel_after=True, fresh=fresh, after_lock=True
                )
                batch.prepare(statement, dialect)

    def try_grant(
        self,
        request: GrantRequest,
        ticket: int | None,
        *,
        queue: bool,
        patience: float,
        deadline: float | None = None,
        first: bool = False,
    ) -> Granted | Blocked | Deadlocked:
        """One attempt to grant every path of ``request`` at once (``first``:
        the request's first, before which no transaction wrote anything for
        its lease).

        ``ticket`` is the request's place in the queue from an earlier attempt
        (``None``: not queued). A denied request with ``queue=True`` and no
        ticket is queued in the same transaction as its denial, so every later
        grant of the customer sees it. A grant removes the request's queue row.
        An attempt that loses a race (1213) is tried again until the monotonic
        time ``patience``, then :class:`ContentionTimeout`. Everything ends by
        the monotonic time ``deadline`` (see ``Transactions.run``), then
        :class:`DatabaseTimeout`; a grant whose COMMIT got no reply by then is
        looked for by its lease id within the grace that follows.
        """

        def attempt(connection: Connection, number: int) -> Granted | Blocked | Deadlocked:
            if number == 1 and self.dialect.can_batch(connection):
                outcome = self._first_batched(connection, request, ticket, queue=queue, first=first)
                if outcome is not None:
                    return outcome
            token = self._tx.bump(connection, request.customer_id, grant=True)
            known = ticket
            if number > 1:
                # The previous attempt may have failed after its COMMIT landed
                # (its reply lost, or an error answered in its place): then its
                # rows exist, or it was queued and must not queue twice. Its
                # rows are never taken up: on a Galera cluster, a COMMIT
                # answered with an error (1213) can land all the same, as a
                # write never checked against the grants committed beside it
                # (see docs/CLUSTER.md), so their conflict check and fencing
                # token are not to be trusted. They go, under the sentinel,
                # and the request is judged afresh: by the live rows only,
                # not behind requests queued since (it held its paths while
                # they queued), with a token of its own.
                parameters = {"c_id": request.customer_id, "l_id": request.lease_id}
                landed = delete_counted(connection, RELEASE, parameters, LOCKS_REMOVED)
                if known is None:
                    known = connection.execute(ENQUEUED, parameters).scalar()
                if landed:
                    return self._grant(connection, request, token, known, queue, queued=False)
            return self._grant(connection, request, token, known, queue)

        return self._tx.run(
            "acquiring locks",
            attempt,
            customer_id=request.customer_id,
            deadline=deadline,
            patience=patience,
        )

    def _first_batched(
        self,
        connection: Connection,
        request: GrantRequest,
        ticket: int | None,
        *,
        queue: bool,
        first: bool,
    ) -> Granted | Blocked | Deadlocked | None:
        """An attempt's first transaction where statements travel in batches:
        the grant without searches, in one round trip, or with them, or the
        request queued with it; ``None`` where none of these could decide
        (nothing was written, and the transaction is over): the caller
        attempts the usual way."""
        denied = False
        if batch.commits_in_batches(connection):
            if (
                queue
                and first
                and (self._handed_on_lately(request) or self._likely_queued(request.customer_id))
            ):
                # Likely blocked by the lease this manager has just
                # handed the paths to, or by a request queued before
                # it: queued in the same round trip.
                outcome = self._queue_in_one(connection, request)
                if outcome is not None:
                    return outcome
            # With a queue (seen moments ago), the grant in one round
            # trip is denied: it requires an empty one.
            elif ticket is not None or not self._likely_queued(request.customer_id):
                if ticket is None and first and self._likely_idle(request.customer_id):
                    granted = self._grant_lean(connection, request)
                    if granted is not None:
                        return granted
                granted = self._grant_in_one(connection, request, ticket, first=first)
                if granted is not None:
                    return granted
            # Denied, or the sentinel row is missing, or the case
            # rules differ: nothing was written, the transaction is
            # over. The attempt below says who is in the way, and
            # queues.
            denied = True
        elif ticket is None and self._likely_queued(request.customer_id):
            # Where COMMITs go alone (a Galera node): with a queue
            # seen moments ago, the first attempt is likely denied;
            # the reads that say who is in the way go in its round
            # trip.
            denied = True
        return self._grant_batched(connection, request, ticket, queue, denied=denied)

    def _grant_lean(self, connection: Connection, request: GrantRequest) -> Granted | None:
        """A request's first attempt, granted without the conflict and queue
        searches where the customer has no lock or queue row at all (its
        counts say so: see ``LEAN_CLAIM`` in :mod:`pathlock._statements`): in
        one round trip, its COMMIT included. ``None`` if the customer has
        rows (or untrusted counts, or no sentinel row yet, or the other case
        rule): nothing was written, and the transaction is over; the caller
        searches, and this manager does not try this way for the customer
        for a while (:data:`BUSY_FOR`)."""
        parameters = lean_parameters(request)
        parameters.update(self._tx.claim_parameters(request.customer_id))
        parameters.update(self._until())
        claimed, granted = batch.run(
            connection,
            [
                (LEAN_CLAIM, parameters),
                (lean_grant(len(request.paths), bool(request.shallow)), parameters),
            ],
            commit=True,
        )
        if not claimed.rowcount:
            self._seen_busy(request.customer_id)
            return None
        return self._granted_in_one(request, granted, claimed)

    def _grant_in_one(
        self, connection: Connection, request: GrantRequest, ticket: int | None, *, first: bool
    ) -> Granted | None:
        """The grant in one round trip, its COMMIT included, where nobody is
        in the way and nobody is queued before it (see ``LOCK_SENTINEL`` in
        :mod:`pathlock._statements`); ``None`` if not granted: then nothing
        was written, and the transaction is over. The ``first`` transaction
        of a lease need not look for rows of its own (see
        :func:`grant_statement`)."""
        customer = request.customer_id
        parameters = self._grant_parameters(request, ticket)
        parameters.update(self._tx.claim_parameters(customer))
        steps: list[tuple[Any, dict[str, Any]]] = [
            (SET_GRANT_UNTIL, self._until()),
            (LOCK_SENTINEL, {"c_id": customer}),
            (
                grant_statement(
                    shape(request.paths, request.shallow),
                    queued=True,
                    sentinel_after=True,
                    fresh=first,
                    after_lock=True,
                ),
                parameters,
            ),
            (CLAIM_IF_GRANTED, parameters),
        ]
        if ticket is not None:
            dequeue = {"c_id": customer, "l_id": request.lease_id, "w_ticket": ticket}
            steps += [(DEQUEUE_IF_GRANTED, dequeue), (WAITERS_REMOVED, dequeue)]
        _until, _locked, granted, claimed, *_ = batch.run(connection, steps, commit=True)
        if granted.rowcount == 0:
            return None
        return self._granted_in_one(request, granted, claimed)

    @staticmethod
    def _granted_in_one(
        request: GrantRequest, granted: batch.Reply, claimed: batch.Reply
    ) -> Granted:
        """The grant of a round trip whose grant statement inserted rows
        (``granted``), and the sentinel write after it (``claimed``)."""
        if granted.rowcount != len(request.paths) or claimed.rowcount != 1:
            # One consistent read decides for every path, so this cannot
            # happen; if it did, the rows are committed: the caller leaves
            # them in doubt, to be deleted by their lease id.
            raise BackendError(
                "acquiring locks",
                RuntimeError(
                    f"{granted.rowcount} of {len(request.paths)} rows inserted and the"
                    f" sentinel written {claimed.rowcount} times; committed"
                ),
            )
        return Granted(int(claimed.lastrowid))

    def _queue_in_one(
        self, connection: Connection, request: GrantRequest
    ) -> Granted | Blocked | Deadlocked | None:
        """A request's first attempt that expects to wait (see
        :meth:`_handed_on_lately`), in one round trip with its COMMIT: the
        grant in one round trip, and if a live row of another lease is in its
        way, the queue row too, under the sentinel row as an attempt queues,
        with the reads that say who is in the way; the sentinel row is held
        for one round trip, not two. ``None`` if neither happened (nothing
        was written: the request waits only for the queue, or the sentinel
        row is missing): the caller attempts the usual way. A request queued
        so that would wait for itself or for a request that waits for it
        leaves the queue at once."""
        customer = request.customer_id
        parameters = self._grant_parameters(request, None)
        parameters.update(self._tx.claim_parameters(customer))
        parameters.update(waiter_parameters(request, self.settings.waiter_ttl))
        form = shape(request.paths, request.shallow)
        steps: list[tuple[Any, dict[str, Any]]] = [
            (SET_GRANT_UNTIL, self._until()),
            (LOCK_AND_READ_SENTINEL, {"c_id": customer}),
            (
                grant_statement(
                    form, queued=True, sentinel_after=True, fresh=True, after_lock=True
                ),
                parameters,
            ),
            (CLAIM_IF_GRANTED, parameters),
            (enqueue_if_blocked(form), parameters),
            (WAITER_QUEUED, parameters),
            (enqueue_paths(form.paths, form.shallow), parameters),
            *_Picture.steps(request, parameters),
        ]
        _until, locked, granted, claimed, enqueued, _, _paths, *reads = batch.run(
            connection, steps, commit=True
        )
        if granted.rowcount:
            return self._granted_in_one(request, granted, claimed)
        if not enqueued.rowcount:
            return None
        ticket = int(enqueued.lastrowid)
        self._seen_queued(customer)
        picture = _Picture.judged(connection, request, ticket, parameters, reads)
        # Queued behind older requests alone (no live lock in the way), a
        # request waits for nobody's locks: no cycle.
        deadlock = None
        if picture.blockers:
            deadlock = _deadlock(request, picture.blockers, picture.queued, picture.owner_locks)
        if deadlock is not None:
            # Waiting could never succeed: out of the queue again, and the
            # version moves for whoever judged its place behind it.
            self._leave(connection, customer, request.lease_id, ticket)
            return deadlock
        return Blocked(
            picture.blockers,
            picture.ahead,
            ticket,
            int(locked.lastrowid),
            ahead_complete=picture.ahead_complete,
        )

    def _until(self) -> dict[str, Any]:
        """The parameters of ``SET_GRANT_UNTIL``: until when this transaction's
        client waits for the reply (its socket timeout, or the current limit)."""
        waits = self.settings.socket_timeout
        limit = deadlines.current()
        if limit is not None:
            waits = min(waits, max(limit.ends - time.monotonic(), 0.0))
        return {"until_us": int(waits * 1_000_000)}

    def _grant_batched(
        self,
        connection: Connection,
        request: GrantRequest,
        ticket: int | None,
        queue: bool,
        *,
        denied: bool = False,
    ) -> Granted | Blocked | Deadlocked | None:
        """The first two statements of :meth:`_grant` (sentinel write, then
        the grant) in one round trip; ``None`` (rolled back) if the sentinel
        row does not exist yet: then nothing was serialized, and the caller
        creates it and attempts the usual way. ``denied``: a grant in one
        round trip was just denied, so this one likely is too: the reads that
        say who is in the way go in the same round trip, which saves one
        while the sentinel row is held; otherwise a queued request's queue
        row is deleted in that round trip if the grant inserted."""
        parameters = self._grant_parameters(request, ticket)
        steps: list[tuple[Any, dict[str, Any]]] = [
            (CLAIM, self._tx.claim_parameters(request.customer_id)),
            (grant_statement(shape(request.paths, request.shallow), queued=True), parameters),
            (LOCKS_ADDED, parameters),
        ]
        dequeued = not denied and ticket is not None
        if denied:
            steps += _Picture.steps(request, parameters)
        elif dequeued:
            # Its queue row goes in the same round trip if the grant inserted
            # (LOCKS_ADDED matched a row: see _counted in _statements).
            dequeue = {"c_id": request.customer_id, "l_id": request.lease_id, "w_ticket": ticket}
            steps += [(DEQUEUE_IF_GRANTED, dequeue), (WAITERS_REMOVED, dequeue)]
        bumped, granted, _, *reads = batch.run(connection, steps)
        if bumped.rowcount == 0:
            connection.rollback()
            return None
        token = bumped.lastrowid
        if self._all_or_none(connection, request, granted.rowcount):
            return self._granted(connection, request, token, None if dequeued else ticket)
        picture = None
        if denied:
            picture = _Picture.judged(connection, request, ticket, parameters, reads)
        return self._denied(
            connection, request, token, ticket, queue=queue, parameters=parameters, picture=picture
        )

    @staticmethod
    def _grant_parameters(request: GrantRequest, ticket: int | None) -> dict[str, Any]:
        parameters = grant_parameters(request)
        parameters["w_ticket"] = NO_TICKET if ticket is None else ticket
        return parameters

    def _grant(
        self,
        connection: Connection,
        request: GrantRequest,
        token: int,
        ticket: int | None,
        queue: bool,
        *,
        queued: bool = True,
    ) -> Granted | Blocked | Deadlocked:
        parameters = self._grant_parameters(request, ticket)
        # Check and insert in one statement: the rows go in only if no live
        # conflicting row exists and (``queued``) nobody is queued before us
        # (the subquery is one consistent read, so it is all rows or none).
        if self._insert(connection, request, parameters, queued=queued):
            return self._granted(connection, request, token, ticket)
        return self._denied(connection, request, token, ticket, queue=queue, parameters=parameters)

    def _denied(
        self,
        connection: Connection,
        request: GrantRequest,
        token: int,
        ticket: int | None,
        *,
        queue: bool,
        parameters: dict[str, Any],
        picture: _Picture | None = None,
    ) -> Granted | Blocked | Deadlocked:
        # Denied: read who is in the way while still holding the sentinel
        # (unless ``picture`` was read so already), so the picture is the one
        # that denied us (the grant's parameters hold the conflict query's,
        # and more).
        if picture is None:
            picture = _Picture.read(connection, request, ticket, parameters)
        if picture.handed is not None:
            # A release granted rows to this request (hand_over()): its queue
            # row is gone, and they are taken up here, under the sentinel row
            # this transaction holds.
            return self._taken_up(connection, request, picture.handed)
        if picture.blockers:
            deadlock = _deadlock(request, picture.blockers, picture.queued, picture.owner_locks)
            if deadlock is not None:
                connection.rollback()
                return deadlock
        elif not picture.ahead and self._insert(connection, request, parameters, queued=False):
            # The queue was not empty, but nobody in it conflicts.
            return self._granted(connection, request, token, ticket)
        blockers, ahead = picture.blockers, picture.ahead
        if picture.queued or (queue and ticket is None):
            self._seen_queued(request.customer_id)
        if queue and ticket is None:
            # Queued under the sentinel, so every later grant sees it. The
            # version stays put: nobody watching has anything new to try.
            enqueued, *_ = self._commit(
                connection,
                [
                    (ENQUEUE, waiter_parameters(request, self.settings.waiter_ttl)),
                    (WAITER_QUEUED, parameters),
                    (enqueue_paths(len(request.paths), bool(request.shallow)), parameters),
                    (UNBUMP, {"c_id": request.customer_id}),
                ],
            )
            ticket = enqueued.lastrowid
        else:
            connection.rollback()  # the version bump goes with it
        return Blocked(blockers, ahead, ticket, token - 1, ahead_complete=picture.ahead_complete)

    def _taken_up(self, connection: Connection, request: GrantRequest, token: int) -> Granted:
        """Take up the rows a release handed to ``request`` (in a transaction
        that holds the customer's sentinel row), and commit."""
        (taken,) = self._commit(connection, [(TAKE_UP, self._take_up_parameters(request))])
        if taken.rowcount != len(request.paths):
            # Part of them deleted by hand (the rest are extended, and
            # committed): the caller leaves them in doubt, to be deleted by
            # their lease id.
            raise BackendError(
                "acquiring locks",
                RuntimeError(
                    f"{taken.rowcount} of the {len(request.paths)} rows handed over found"
                ),
            )
        return Granted(token)

    @staticmethod
    def _take_up_parameters(request: GrantRequest) -> dict[str, Any]:
        return {
            "c_id": request.customer_id,
            "l_id": request.lease_id,
            "ttl_us": round(request.ttl * 1_000_000),
        }

    @classmethod
    def _insert(
        cls,
        connection: Connection,
        request: GrantRequest,
        parameters: dict[str, Any],
        *,
        queued: bool,
    ) -> bool:
        statement = grant_statement(shape(request.paths, request.shallow), queued=queued)
        inserted = connection.execute(statement, parameters).rowcount
        if not cls._all_or_none(connection, request, inserted):
            return False
        connection.execute(LOCKS_ADDED, {"c_id": request.customer_id, CHANGED_ROWS: inserted})
        return True

    @staticmethod
    def _all_or_none(connection: Connection, request: GrantRequest, inserted: int) -> bool:
        """True if every path was inserted, False if none was; anything else
        is rolled back and raised (one consistent read makes it impossible)."""
        if inserted in (0, len(request.paths)):
            return bool(inserted)
        connection.rollback()
        raise BackendError(
            "acquiring locks",
            RuntimeError(f"{inserted} of {len(request.paths)} rows inserted; rolled back"),
        )

    def _granted(
        self, connection: Connection, request: GrantRequest, token: int, ticket: int | None
    ) -> Granted:
        if ticket is None:
            connection.commit()
        else:
            parameters = {"c_id": request.customer_id, "l_id": request.lease_id, "w_ticket": ticket}
            self._commit(connection, [(DEQUEUE, parameters), (WAITERS_REMOVED, parameters)])
        return Granted(token)

    def _commit(
        self, connection: Connection, steps: Sequence[tuple[Any, dict[str, Any]]]
    ) -> list[batch.Reply]:
        """Run ``steps`` and commit: in one round trip where the COMMIT can
        travel in a batch, in two where only the statements can (a Galera
        node), one by one otherwise. These writes come last in a transaction
        that holds the customer's sentinel row, which every grant and release
        of the customer waits for: on a busy customer each round trip saved
        there is one less for everyone behind it."""
        if batch.commits_in_batches(connection):
            return batch.run(connection, steps, commit=True)
        if len(steps) > 1 and self.dialect.can_batch(connection):
            # The COMMIT alone, the statements in one query.
            replies = batch.run(connection, steps)
            connection.commit()
            return replies
        replies = []
        dialect = self.dialect
        for statement, parameters in steps:
            if replies and dialect.counts_from_client:
                before = replies[-1]
                parameters = {  # noqa: PLW2901 - the step's, with the reply before
                    **parameters,
                    CHANGED_ROWS: before.rowcount,
                    INSERTED_ID: before.lastrowid,
                }
            result = connection.execute(statement, parameters)
            replies.append(batch.Reply(result.rowcount, dialect.inserted_id(result)))
        connection.commit()
        return replies

    def could_grant(
        self, request: GrantRequest, ticket: int | None, *, deadline: float | None = None
    ) -> Outlook:
        """Whether an attempt would grant ``request`` now, judged by plain
        reads without the sentinel: a waiter asks this when the version moved
        (or at its recheck) and makes a real attempt only if so. Many waiters
        asking at once therefore do not queue up on the sentinel row."""
        parameters = self._grant_parameters(request, ticket)

        def attempt(connection: Connection, _number: int) -> Outlook:
            picture = _Picture.read(connection, request, ticket, parameters, end=True)
            if picture.handed is not None:
                # Handed over by a release since the request's last check.
                if picture.queued_rows is not None:
                    head = picture.queued_rows[0] if picture.queued_rows else None
                    self._note_heir(request.customer_id, request.lease_id, head)
                return Outlook(
                    free=True,
                    next_in_line=True,
                    handed=picture.handed,
                    handed_for=picture.handed_for,
                )
            return Outlook(
                free=not picture.blockers and not picture.ahead,
                next_in_line=not picture.ahead,
                ahead=tuple(info.ticket for info in picture.ahead),
                held=tuple({info.lease_id: None for info in picture.blockers}),
                ahead_leases=tuple(info.lease_id for info in picture.ahead),
                ahead_complete=picture.ahead_complete,
            )

        return self._tx.run(
            "watching the queue",
            attempt,
            read_only=True,
            customer_id=request.customer_id,
            deadline=deadline,
        )

    def leave_queue(
        self, customer_id: int, lease_id: str, ticket: int, *, deadline: float | None = None
    ) -> None:
        """Remove a request that gives up (timeout, error) from the queue, and
        the rows a release may have just handed to it. The sentinel write
        moves the version, so the requests queued behind it try again at once
        instead of at their next recheck."""

        def attempt(connection: Connection, _number: int) -> None:
            self._leave(connection, customer_id, lease_id, ticket)

        self._tx.run("leaving the queue", attempt, customer_id=customer_id, deadline=deadline)

    def _leave(self, connection: Connection, customer_id: int, lease_id: str, ticket: int) -> None:
        """:meth:`leave_queue`'s transaction, on ``connection``."""
        self._tx.bump(connection, customer_id)
        parameters = {"c_id": customer_id, "l_id": lease_id, "w_ticket": ticket}
        delete_counted(connection, DEQUEUE, parameters, WAITERS_REMOVED)
        delete_counted(connection, RELEASE, parameters, LOCKS_REMOVED)
        connection.commit()

    def refresh_waiters(
        self, customer_id: int, tickets: Sequence[int], *, deadline: float | None = None
    ) -> set[int]:
        """Keep the queued requests ``tickets`` of ``customer_id`` (this
        process's) alive for another ``settings.waiter_ttl``, in one
        transaction; the tickets whose rows are alive afterwards (a row that
        lapsed or was deleted is never revived: its request must queue
        again). Hundreds of waiting threads of one process each kept their
        own row alive, each with a commit of its own: more durable commits
        than the grants they waited for."""
        parameters = {
            "c_id": customer_id,
            "w_tickets": sorted(set(tickets)),
            "w_ttl_us": round(self.settings.waiter_ttl * 1_000_000),
        }

        def attempt(connection: Connection, _number: int) -> set[int]:
            if batch.commits_in_batches(connection):
                _, alive = batch.run(
                    connection,
                    [(REFRESH_WAITERS, parameters), (WAITERS_ALIVE, parameters)],
                    commit=True,
                )
                rows: Sequence[Any] = alive.rows
            else:
                connection.execute(REFRESH_WAITERS, parameters)
                rows = connection.execute(WAITERS_ALIVE, parameters).all()
                connection.commit()
            return {int(row[0]) for row in rows}

        return self._tx.run(
            "keeping queued requests alive", attempt, customer_id=customer_id, deadline=deadline
        )

    def watch(
        self,
        customer_id: int,
        lease_id: str | None = None,
        ahead: Sequence[int] = (),
        *,
        held: Sequence[str] = (),
        deadline: float | None = None,
        shared: bool = False,
        asker: str = "",
    ) -> Watched:
        """The customer's sentinel version, by a plain read: it moves on every
        grant and give-up, and on every release that did not hand its paths
        over, so a waiter that sees the same value as at its last attempt has
        nothing to try again for. With ``ahead``, also how many of those
        tickets are still queued; with a queued request's ``lease_id``, where
        releases hand over (see :meth:`release`), also the fencing token of
        the rows a release handed to it, if any. With ``held`` (the leases
        that blocked its last attempt), also whether one of them still has a
        live row. ``shared``: the read may be one with the checks of other
        requests of this process on the customer, as they wait in threads or
        in tasks of the asyncio API's loop (see :mod:`pathlock._polls`)."""
        ask = Ask(lease_id, tuple(ahead), tuple(held), asker)
        if shared:
            return self._polls.check(customer_id, ask, deadline)
        return self._watch(customer_id, [ask], deadline)[0]

    def _watch(
        self, customer_id: int, asks: Sequence[Ask], deadline: float | None
    ) -> list[Watched]:
        """The answers to the checks ``asks`` of waiting requests of one
        customer, in one transaction (see :meth:`watch`)."""

        def attempt(connection: Connection, _number: int) -> list[Watched]:
            # Where releases hand over, the rows handed to the requests too.
            looked = batch.commits_in_batches(connection)
            if len(asks) == 1:
                return [self._watch_one(connection, customer_id, asks[0], looked)]
            return self._watch_many(connection, customer_id, asks, looked)

        return self._tx.run(
            "watching the queue",
            attempt,
            read_only=True,
            customer_id=customer_id,
            deadline=deadline,
        )

    def _watch_one(
        self, connection: Connection, customer_id: int, ask: Ask, looked: bool
    ) -> Watched:
        """One check, one statement (its ROLLBACK in the same round trip,
        where it can: every waiter polls this)."""
        parameters: dict[str, Any] = {"c_id": customer_id}
        if ask.ahead:
            parameters["ahead"] = list(ask.ahead)
        if ask.held:
            parameters["held"] = list(ask.held)
        own = ask.lease_id if looked else None
        looked = own is not None
        if looked:
            parameters["l_id"] = own
        statement = watch_statement(handed=looked, ahead=bool(ask.ahead), held=bool(ask.held))
        row = self._read_and_roll_back(connection, [(statement, parameters)])[0]
        if row is None:
            return Watched(0, looked=looked)
        if not looked:
            version, left, still = row
            return Watched(int(version), None, _int(left), False, held_left=_int(still))
        # The one column of a check where releases hand over.
        version, handed, handed_us, next_in_line, left, still = json.loads(row.item)
        if handed is not None and own is not None:
            self._note_heir(customer_id, own, _queue_row(next_in_line))
        return Watched(
            int(version),
            _int(handed),
            _int(left),
            True,
            0.0 if handed_us is None else int(handed_us) / 1_000_000,
            held_left=_int(still),
        )

    def _watch_many(
        self, connection: Connection, customer_id: int, asks: Sequence[Ask], looked: bool
    ) -> list[Watched]:
        """Several checks, one round trip where statements travel together:
        the version (and the head of the queue where a release handed rows
        to one of them), the live leases among those they ask about, the
        queued tickets among those they ask about."""
        own = sorted({ask.lease_id for ask in asks if ask.lease_id}) if looked else []
        leases = sorted({*own, *(lease for ask in asks for lease in ask.held)})
        tickets = sorted({ticket for ask in asks for ticket in ask.ahead})
        steps: list[tuple[Any, dict[str, Any]]] = [
            (WATCHED_HEAD, {"c_id": customer_id, "own": own})
            if own
            else (VERSION, {"c_id": customer_id})
        ]
        if leases:
            watched = WATCHED_LEASES_LEFT if looked else WATCHED_LEASES
            steps.append((watched, {"c_id": customer_id, "leases": leases}))
        if tickets:
            steps.append((WATCHED_TICKETS, {"c_id": customer_id, "tickets": tickets}))
        first, *rest = self._read_and_roll_back(connection, steps, every=True)
        live = {row[0]: row for row in rest[0]} if leases else {}
        queued = {row[0] for row in rest[-1]} if tickets else set()
        head = first[0][1] if first and own else None
        answers = []
        for ask in asks:
            mine = ask.lease_id if looked else None
            if not first:
                answers.append(Watched(0, looked=mine is not None))
                continue
            left = len(queued.intersection(ask.ahead)) if ask.ahead else None
            still = int(any(lease in live for lease in ask.held)) if ask.held else None
            handed = live.get(mine) if mine is not None else None
            if handed is not None:
                self._note_heir(customer_id, handed[0], _queue_row(head))
            answers.append(
                Watched(
                    int(first[0][0]),
                    None if handed is None else int(handed[1]),
                    left,
                    mine is not None,
                    0.0 if handed is None or handed[2] is None else int(handed[2]) / 1_000_000,
                    held_left=still,
                )
            )
        return answers

    @staticmethod
    def _read_and_roll_back(
        connection: Connection,
        steps: Sequence[tuple[Any, dict[str, Any]]],
        *,
        every: bool = False,
    ) -> list[Any]:
        """Plain reads, then ROLLBACK: in one round trip where it can. Each
        read's first row (``None``: none), or with ``every`` its rows."""
        replies: list[Sequence[Any]]
        if batch.rolls_back_in_batches(connection):
            replies = [reply.rows for reply in batch.run(connection, steps, rollback=True)]
        else:
            replies = [
                connection.execute(statement, parameters).all() for statement, parameters in steps
            ]
            connection.rollback()
        if every:
            return replies
        return [rows[0] if rows else None for rows in replies]

    def take_up(self, request: GrantRequest, *, deadline: float | None = None) -> bool:
        """Take up the rows a release handed to ``request`` (see
        :meth:`release`): extend them to the request's ttl, under the
        customer's sentinel row, as a renewal does. ``False`` if they
        expired (or were deleted) before that: the request is no longer
        queued, and must queue again."""
        parameters = self._take_up_parameters(request)
        locked = {"c_id": request.customer_id}

        def attempt(connection: Connection, _number: int) -> int:
            if batch.commits_in_batches(connection):
                _, taken = batch.run(
                    connection, [(LOCK_SENTINEL, locked), (TAKE_UP, parameters)], commit=True
                )
                return taken.rowcount
            connection.execute(LOCK_SENTINEL, locked)
            rowcount: int = connection.execute(TAKE_UP, parameters).rowcount
            connection.commit()
            return rowcount

        taken = self._tx.run(
            "taking up locks handed over",
            attempt,
            customer_id=request.customer_id,
            deadline=deadline,
        )
        if taken == len(request.paths):
            return True
        if taken:
            # Part of them deleted by hand: the rest go too.
            self.forget(request.customer_id, request.lease_id)
        return False

    def lease_alive(self, customer_id: int, lease_id: str, rows: int) -> bool:
        """Whether all ``rows`` rows of the lease exist and have not expired,
        by the database's clock (a plain read)."""
        parameters = {"c_id": customer_id, "l_id": lease_id}

        def attempt(connection: Connection, _number: int) -> bool:
            alive = connection.execute(LEASE_ALIVE, parameters).scalar_one()
            connection.rollback()
            return int(alive) == rows

        return self._tx.run(
            "asking whether a lease is held", attempt, read_only=True, customer_id=customer_id
        )

    def release(
        self,
        customer_id: int,
        lease_id: str,
        *,
        paths: Sequence[PathMode] | None = None,
        deadline: float | None = None,
    ) -> int | None:
        """Delete the rows of one lease; return how many there were, or
        ``None`` when a retry found none: then an earlier attempt may have
        deleted them (its COMMIT landed, its reply was lost).

        Where a batch carries its COMMIT (one MySQL or MariaDB server), the
        release also reads the head of the customer's queue and, if that
        request waited for the released ``paths`` (``None``: it may have),
        grants it them: the next in line learns it at its next check, without
        an attempt of its own. A lease that was itself handed its paths knows
        who was next in line then, and hands them on in the release's one
        round trip (:meth:`_release_to`). Other releases of a customer seen
        with a queue moments ago read the head of the queue first, then hand
        over in that one round trip (:meth:`_release_reading_first`); the rest
        are one round trip, and a queue they find is handed the paths in a
        transaction of its own (:meth:`_hand_over`).
        Elsewhere a release moves the customer's version, and the waiters
        try for themselves."""
        parameters = {"c_id": customer_id, "l_id": lease_id}
        known, heir = self._heir_of(lease_id, paths)

        def attempt(connection: Connection, number: int) -> tuple[int | None, _Queue | None]:
            if number == 1 and batch.commits_in_batches(connection):
                if heir is not None:
                    return self._release_to(connection, customer_id, parameters, heir), None
                # No heir known: the lease was not handed its paths, or the
                # request next in line then waits for others (or none was).
                if self._likely_queued(customer_id):
                    return self._release_reading_first(connection, customer_id, parameters, paths)
                if not known:
                    return self._release_lean(connection, customer_id, parameters)
                return self._release_in_one(connection, customer_id, parameters)
            deleted = self._release_moving(connection, customer_id, parameters)
            return (None if deleted == 0 and number > 1 else deleted), None

        deleted, queue = self._tx.run(
            "releasing a lease", attempt, customer_id=customer_id, deadline=deadline
        )
        if queue is not None:
            self._hand_over(customer_id, paths, queue, deadline)
        return deleted

    @staticmethod
    def _heir(
        released: Sequence[PathMode] | None, queued: list[WaiterInfo], term_us: int | None
    ) -> tuple[bool, _Heir | None]:
        """Whom a release of ``released`` (``None``: unknown) that read the
        oldest ``queued`` requests hands its paths to (``term_us``: see
        :attr:`_Queue.term_us`): whether anyone queued may have waited for
        them (if not, there is nothing to do), and the head of the queue if
        it waited for them and can take handed paths (if not, the version
        moves, so that those who waited for them try for themselves). A head
        that waits for other paths is handed nothing: its grant could only be
        refused (something else is in its way), under the customer's row."""
        if not queued:
            return True, None  # unreadable (written by hand): move the version
        head = queued[0]
        if released is not None:
            first = next((info for info in queued if may_conflict(info.paths, released)), None)
            if first is None:
                # Nobody read waited for these paths; those not read may have.
                return len(queued) >= HAND_OVER_WAITERS, None
            if first is not head:
                return True, None
        if term_us is not None and term_us > 0 and _well_formed(head.paths):
            return True, _Heir(head, term_us)
        return True, None

    def _hand_over(
        self,
        customer_id: int,
        released: Sequence[PathMode] | None,
        queue: _Queue,
        deadline: float | None,
    ) -> None:
        """After a release of ``released`` (``None``: unknown) that left the
        customer's version as ``queue.version``: grant the head of the queue if
        it waited for those paths, in one round trip; if that was not
        possible, move the version so that those who waited for them try for
        themselves. The rows granted expire after the term the head's queue
        row records (the shorter of its ttl and its waiter ttl), so a waiter
        that died meanwhile holds them no longer than its queue row would
        have blocked them; the waiter takes them up (:meth:`take_up`, or its
        first renewal). A failure here is logged: the waiters find the paths
        free at their next recheck."""
        concerned, heir = self._heir(released, queue.waiters, queue.term_us)
        if not concerned:
            return

        def attempt(connection: Connection, number: int) -> None:
            if heir and number == 1 and batch.commits_in_batches(connection):
                self._grant_head(connection, customer_id, heir, queue.version)
            else:
                self._tx.bump(connection, customer_id)
                connection.commit()

        try:
            self._tx.run("handing locks over", attempt, customer_id=customer_id, deadline=deadline)
        except PathLockError as error:
            self._not_handed_over(customer_id, error)

    def _not_handed_over(self, customer_id: int, error: Exception) -> None:
        log.warning(
            "could not hand customer %d's released locks to the queue: %s;"
            " its requests find them free within %g s",
            customer_id,
            error,
            self.settings.recheck,
        )

    def _release_reading_first(
        self,
        connection: Connection,
        customer_id: int,
        parameters: dict[str, Any],
        released: Sequence[PathMode] | None,
    ) -> tuple[int, _Queue | None]:
        """A release for a customer seen with a queue moments ago: the head of
        the queue read first, locking nothing (a read and its ROLLBACK, one
        round trip); then, if it waited for the released paths, the release
        hands them to it in its own round trip with its COMMIT
        (:meth:`_release_to`, which checks everything again under the
        sentinel row: a head granted or gone since the read gets nothing,
        and the version moves). Two round trips and one commit, as reading
        the queue in the release's transaction would take, but the sentinel
        row is held for one of them, not both: while requests queue, every
        grant of the customer waits for that row. Where nobody queued waited
        for the paths, the release reads the queue again under the row (a
        request may have queued for them since) and hands over in a
        transaction of its own if it must (:meth:`_release_in_one`); where
        nobody is queued, it is the release of a customer without a queue.
        The rows deleted, and what :meth:`_hand_over` needs, if anything."""
        (rows,) = self._read_and_roll_back(
            connection, [(QUEUE_HEAD, {"c_id": customer_id})], every=True
        )
        if not rows:
            return self._release_lean(connection, customer_id, parameters)
        self._seen_queued(customer_id)
        concerned, heir = self._heir(released, *_queued(customer_id, rows))
        if heir is not None:
            return self._release_to(connection, customer_id, parameters, heir), None
        if concerned:
            return self._release_moving(connection, customer_id, parameters), None
        return self._release_in_one(connection, customer_id, parameters)

    def _not_handed_on(
        self,
        connection: Connection,
        customer_id: int,
        parameters: dict[str, Any],
        error: DBAPIError,
    ) -> int:
        """After a release's hand-over failed in the release's own transaction:
        a failure that a retry may cure is raised (the retry releases without
        handing over); a statement the server refused (it ran nothing after
        it, the COMMIT included) is logged, and the release is made without
        the hand-over. The rows deleted."""
        if error.connection_invalidated or self.dialect.is_transient(error):
            raise error
        connection.rollback()
        self._not_handed_over(customer_id, error)
        return self._release_moving(connection, customer_id, parameters)

    def _grant_head(
        self,
        connection: Connection,
        customer_id: int,
        heir: _Heir,
        seen: int,
    ) -> None:
        """Grant ``heir`` its paths, in one round trip that ends with the
        COMMIT, if nothing is in its way and it is still the oldest live
        request; then move the version from ``seen`` unless the grant did."""
        steps: list[tuple[Any, dict[str, Any]]] = [
            (SET_GRANT_UNTIL, self._until()),
            (LOCK_SENTINEL, {"c_id": customer_id}),
        ]
        grant = len(steps)
        steps += self._handing_to(customer_id, heir)
        steps.append((BUMP_IF_UNMOVED, {"c_id": customer_id, "seen": seen}))
        replies = batch.run(connection, steps, commit=True)
        if replies[grant].rowcount:
            self._handed_to(customer_id, heir)

    def _handed_to(self, customer_id: int, heir: _Heir) -> None:
        """A release of this manager granted ``heir`` its paths."""
        if len(self._handed) >= _QUEUED_KEPT:
            self._handed.clear()
        self._handed[customer_id] = (time.monotonic(), heir.request.paths)

    def _handed_on_lately(self, request: GrantRequest) -> bool:
        """Whether a release of this manager handed paths that conflict with
        ``request``'s to another request moments ago: then that request likely
        holds them still, and ``request`` will wait."""
        handed = self._handed.get(request.customer_id) if self._handed else None
        return (
            handed is not None
            and time.monotonic() - handed[0] < QUEUED_FOR
            and may_conflict(handed[1], request.paths)
        )

    def _handing_to(self, customer_id: int, heir: _Heir) -> list[tuple[Any, dict[str, Any]]]:
        """The statements that grant ``heir`` its paths, under the sentinel row
        (locked before them): the grant, the sentinel written and the queue row
        deleted only if it inserted."""
        head = heir.request
        request = GrantRequest(
            customer_id=customer_id,
            lease_id=head.lease_id,
            paths=head.paths,
            owner=head.owner,
            reason=head.reason,
            ttl=heir.term_us / 1_000_000,
            shallow=head.shallow,
        )
        parameters = self._grant_parameters(request, head.ticket)
        claim = self._tx.claim_parameters(customer_id)
        parameters.update(claim)
        statement = grant_statement(
            shape(request.paths, request.shallow), queued=True, sentinel_after=True, handed=True
        )
        ticket = {"c_id": customer_id, "l_id": head.lease_id, "w_ticket": head.ticket}
        # WAITERS_REMOVED matches a row only where the queue row was deleted:
        # a statement after these may ask ROW_COUNT() whether it was.
        steps: list[tuple[Any, dict[str, Any]]] = [
            (statement, parameters),
            (CLAIM_IF_GRANTED, parameters),
            (DEQUEUE_IF_GRANTED, ticket),
            (WAITERS_REMOVED, ticket),
        ]
        if self.dialect.notices:
            # The request's process hears it granted at once (not at its
            # next check): only here, where a queue is, for a notice costs
            # the commit a lock of the whole database.
            steps.append((WAKE_HEIR, {"notice": f"{customer_id} {head.ticket}"}))
        return steps

    def _note_heir(self, customer_id: int, lease_id: str, row: Any) -> None:
        """Keep the request that is next in line now that ``lease_id`` was
        handed its paths (``row``: the head of the queue, with the columns a
        release reads; ``None``: nobody is queued), for the release of that
        lease (:meth:`_heir_of`)."""
        heir: _Heir | None = None
        if row is not None:
            try:
                heir = _Heir(waiter_info(row), int(row.hand_over_us))
            except (ValueError, TypeError, AttributeError):
                # Not a request pathlock could have queued (written by hand),
                # or queued by an older pathlock: the release reads the queue.
                log.debug("customer %d: unreadable queued request %.200r", customer_id, row)
                return
            if heir.term_us <= 0 or heir.request.customer_id != customer_id:
                return
        if len(self._heirs) >= _QUEUED_KEPT:
            self._heirs.clear()  # leases never released here: forget them all
        self._heirs[lease_id] = heir

    def _heir_of(
        self, lease_id: str, released: Sequence[PathMode] | None
    ) -> tuple[bool, _Heir | None]:
        """Whether ``lease_id`` was handed its paths by a release (then it
        knows who was next in line; see :meth:`watch`), and that request, if
        a release of ``released`` (``None``: unknown) can hand them on to it;
        forgotten either way."""
        if not self._heirs or lease_id not in self._heirs:
            return False, None
        heir = self._heirs.pop(lease_id, None)
        if heir is None or not _well_formed(heir.request.paths):
            return True, None
        if released is not None and not may_conflict(heir.request.paths, released):
            return True, None
        return True, heir

    def _release_to(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any], heir: _Heir
    ) -> int:
        """A release that hands its paths to ``heir``, the request next in line
        when this lease was handed them, in one round trip with its COMMIT:
        the sentinel row locked, the rows deleted, the grant (only if the
        request is still queued and alive, the oldest live one, and nothing
        is in its way: as :meth:`_grant_head`), and the version moved unless
        it was granted, so that whoever waits tries for itself. The rows
        deleted."""
        try:
            _until, locked, deleted, _, granted, *_ = batch.run(
                connection,
                [
                    (SET_GRANT_UNTIL, self._until()),
                    (LOCK_AND_READ_SENTINEL, {"c_id": customer_id}),
                    (
                        RELEASE_BEFORE_HAND_OVER,
                        {"c_id": customer_id, "released_l_id": parameters["l_id"]},
                    ),
                    (LOCKS_REMOVED, {"c_id": customer_id}),
                    *self._handing_to(customer_id, heir),
                    (BUMP_UNLESS_HANDED, {"c_id": customer_id}),
                ],
                commit=True,
            )
        except DBAPIError as error:
            return self._not_handed_on(connection, customer_id, parameters, error)
        self._seen_queued(customer_id)
        if granted.rowcount:
            self._handed_to(customer_id, heir)
        if not locked.rowcount:
            # Rows without a sentinel row (an operator deleted it): the
            # deletion is committed (nothing else was); make the row, so
            # waiters see a new version.
            self._tx.bump(connection, customer_id)
            connection.commit()
        return int(deleted.rowcount)

    def forget(self, customer_id: int, lease_id: str) -> int:
        """Delete every row of ``lease_id``, locks and queue row alike, in one
        transaction: what an interrupted request or release may have left.
        Returns the number of lock rows deleted."""
        parameters = {"c_id": customer_id, "l_id": lease_id}

        def attempt(connection: Connection, _number: int) -> int:
            self._tx.bump(connection, customer_id)
            deleted = delete_counted(connection, RELEASE, parameters, LOCKS_REMOVED)
            delete_counted(connection, FORGET_REQUEST, parameters, WAITERS_REMOVED)
            connection.commit()
            return deleted

        return self._tx.run("releasing a lease left in doubt", attempt, customer_id=customer_id)

    def _release_lean(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any]
    ) -> tuple[int, _Queue | None]:
        """A release for a customer not seen with a queue lately: in one round
        trip, its COMMIT included, the rows deleted and counted down, and the
        version read only where requests may be queued (see
        ``COUNTED_DOWN_OR_QUEUED``); then, only there, the head of the queue
        read, for :meth:`_hand_over`. The rows deleted, and what
        :meth:`_hand_over` needs if anyone waits.

        The rows go before the sentinel row is locked: a grant meanwhile
        sees them live (committed), is denied and queues, and the count then
        says so."""
        deleted, counted = batch.run(
            connection,
            [(RELEASE, parameters), (COUNTED_DOWN_OR_QUEUED, parameters)],
            commit=True,
        )
        version, left = release_said(counted.lastrowid) if counted.rowcount else (None, None)
        if version is None:
            if deleted.rowcount and not counted.rowcount:
                # Rows without a sentinel row (an operator deleted it): as
                # _release_in_one.
                self._tx.bump(connection, customer_id)
                connection.commit()
            elif left == 0:
                # Nothing left, nobody queued: the next grant needs no search.
                self._busy.pop(customer_id, None)
            return int(deleted.rowcount), None
        self._seen_queued(customer_id)
        if not deleted.rowcount:
            return 0, None
        (head,) = batch.run(connection, [(QUEUE_HEAD, {"c_id": customer_id})])
        connection.rollback()
        if not head.rows:
            return int(deleted.rowcount), None
        return int(deleted.rowcount), _queue(customer_id, version, head.rows)

    def _release_in_one(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any]
    ) -> tuple[int, _Queue | None]:
        """A release in one round trip, where a batch carries its COMMIT: the
        rows deleted, and what :meth:`_hand_over` needs if anyone waits."""
        # One round trip: the sentinel row locked (not written) and its
        # version read, the rows deleted, the head of the queue read, COMMIT.
        # The version moves when the released paths are handed over, or
        # when nobody can be (see _hand_over()): a waiter does not
        # attempt at the release, only to find the paths given away.
        locked, deleted, _, queued = batch.run(
            connection,
            [
                (LOCK_AND_READ_SENTINEL, {"c_id": customer_id}),
                (RELEASE, parameters),
                (LOCKS_REMOVED, parameters),
                (QUEUE_HEAD, {"c_id": customer_id}),
            ],
            commit=True,
        )
        if not locked.rowcount:
            # Rows without a sentinel row (an operator deleted it): the
            # deletion is committed; make the row, so waiters see a new
            # version.
            self._tx.bump(connection, customer_id)
            connection.commit()
            return deleted.rowcount, None
        if not queued.rows:
            return deleted.rowcount, None
        self._seen_queued(customer_id)
        if not deleted.rowcount:
            return deleted.rowcount, None
        return deleted.rowcount, _queue(customer_id, locked.lastrowid, queued.rows)

    def _release_moving(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any]
    ) -> int:
        """A release that reads no queue and moves the customer's version, so
        that whoever waits tries for itself: the rows deleted."""
        if self.dialect.can_batch(connection):
            # The COMMIT too, where it can: a release in one round trip.
            commit = batch.commits_in_batches(connection)
            bumped, deleted, _ = batch.run(
                connection,
                [(BUMP, {"c_id": customer_id}), (RELEASE, parameters), (LOCKS_REMOVED, parameters)],
                commit=commit,
            )
            if bumped.rowcount:
                if not commit:
                    connection.commit()
                return deleted.rowcount
            if commit:
                # Rows without a sentinel row (an operator deleted it): the
                # deletion is committed; make the row.
                self._tx.bump(connection, customer_id)
                connection.commit()
                return deleted.rowcount
            connection.rollback()  # no sentinel row yet: the usual way creates it
        self._tx.bump(connection, customer_id)
        deleted_rows = delete_counted(connection, RELEASE, parameters, LOCKS_REMOVED)
        connection.commit()
        return deleted_rows

    def release_owner(self, customer_id: int, owner: Owner) -> int:
        """Delete every row ``owner`` holds for ``customer_id``."""

        def attempt(connection: Connection, _number: int) -> int:
            self._tx.bump(connection, customer_id)
            parameters = {"c_id": customer_id, "o_key": owner.key}
            deleted = delete_counted(connection, RELEASE_OWNER, parameters, LOCKS_REMOVED)
            connection.commit()
            return deleted

        return self._tx.run("releasing an owner's locks", attempt, customer_id=customer_id)

    def renew(
        self,
        leases: Sequence[tuple[int, str, int]],
        ttl: float,
        *,
        wait: bool = True,
        deadline: float | None = None,
    ) -> tuple[set[str], set[int]]:
        """Extend ``leases`` ((customer id, lease id, row count) triples) to
        expire ``ttl`` seconds from now, database time. Returns the ids still
        held, and the customers skipped. A lease whose rows expired or were
        deleted is not renewed and not returned.

        With ``wait=False``, on servers that can skip locked rows (MariaDB
        10.6+, MySQL 8), a customer whose sentinel another transaction holds
        is skipped: its leases are neither renewed nor returned, and the
        others are renewed without waiting for it. Otherwise the renewal
        waits for every sentinel, and nothing is skipped; everything by the
        monotonic time ``deadline`` (see ``Transactions.run``)."""
        customers = sorted({customer_id for customer_id, _, _ in leases})

        def attempt(connection: Connection, _number: int) -> tuple[set[str], set[int]]:
            claimed = customers
            if not wait and self.dialect.skips_locked_rows(connection.dialect):
                claimed = list(connection.execute(CLAIM_SENTINELS, {"c_ids": customers}).scalars())
                if not claimed:
                    connection.rollback()
                    return set(), set(customers)
            connection.execute(LOCK_SENTINELS, {"c_ids": claimed})
            held = self._renew_rows(connection, leases, set(claimed), ttl)
            connection.commit()
            return held, set(customers).difference(claimed)

        # The manager groups leases by home node (routing.py): the first
        # customer's route is every customer's.
        return self._tx.run("renewing leases", attempt, customer_id=customers[0], deadline=deadline)

    @staticmethod
    def _renew_rows(
        connection: Connection,
        leases: Sequence[tuple[int, str, int]],
        customers: set[int],
        ttl: float,
    ) -> set[str]:
        """Extend the leases of ``customers`` (whose sentinels this
        transaction holds); return the ids still held."""
        lease_ids = [lease_id for customer_id, lease_id, _ in leases if customer_id in customers]
        expected = sum(rows for customer_id, _, rows in leases if customer_id in customers)
        renewed = connection.execute(
            RENEW, {"l_ids": lease_ids, "ttl_us": round(ttl * 1_000_000)}
        ).rowcount
        if renewed == expected:
            return set(lease_ids)
        # Some lease is gone: find out which.
        return set(connection.execute(HELD, {"l_ids": lease_ids}).scalars())

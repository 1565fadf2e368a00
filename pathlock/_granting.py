"""An attempt to grant a request every path at once, the way the case at
hand needs least: without searches for a customer with no row at all, in one
round trip with its COMMIT where nobody is queued, queued in that round trip
where a wait is likely, or by the searching attempt that says who is in the
way and queues the request under the customer's sentinel row.

The attempt follows the original design:

1. write the customer's sentinel row (``version = LAST_INSERT_ID(version + 1)``):
   every two grants or releases of one customer now conflict, on one server and
   on a multi-master cluster alike; the new version, returned in the UPDATE's
   own reply, is the fencing token;
2. one ``INSERT ... SELECT ... WHERE NOT EXISTS`` inserts a row for every
   requested path only if no live conflicting row exists (one consistent read
   covers all paths, so it inserts all rows or none);
3. all inserted: commit; none: read the blockers (for the caller), roll back
   (the version bump goes with it). Nothing is held between attempts.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from pathlock import _batch as batch
from pathlock._core.hints import Hints
from pathlock._core.records import Blocked, Deadlocked, Granted, GrantRequest
from pathlock._parameters import (
    grant_parameters,
    lean_parameters,
    take_up_parameters,
    waiter_parameters,
)
from pathlock._picture import Picture, deadlock_of
from pathlock._queue import leave
from pathlock._round_trips import Steps, commit, until
from pathlock._statements.conflicts import Shape, shape
from pathlock._statements.grants import (
    CLAIM,
    CLAIM_IF_GRANTED,
    LOCK_AND_READ_SENTINEL,
    LOCK_SENTINEL,
    LOCKS_ADDED,
    LOCKS_REMOVED,
    SET_GRANT_UNTIL,
    UNBUMP,
    WAITER_QUEUED,
    WAITERS_REMOVED,
    grant_statement,
)
from pathlock._statements.lean import LEAN_CLAIM, lean_grant
from pathlock._statements.leases import RELEASE, TAKE_UP
from pathlock._statements.queue import (
    DEQUEUE,
    DEQUEUE_IF_GRANTED,
    ENQUEUE,
    ENQUEUED,
    enqueue_if_blocked,
    enqueue_paths,
)
from pathlock._transactions import Transactions, delete_counted
from pathlock.dialects._commits import may_commit
from pathlock.dialects.base import CHANGED_ROWS
from pathlock.errors import BackendError

_PREPARED_KEPT = 32  # request shapes remembered as prepared: their statements
# stay among the compiled ones kept (batch._compiled keeps 512)


class Grants:
    """A manager's attempts, run through ``transactions`` (see
    :class:`pathlock._store.Store`)."""

    def __init__(self, transactions: Transactions, hints: Hints) -> None:
        self._tx = transactions
        self._hints = hints
        self.settings = transactions.settings
        self.dialect = transactions.dialect
        self.router = transactions.router
        # The shapes of the requests prepared lately (see prepare()).
        self._prepared: set[Shape] = set()

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
                and (
                    self._hints.handed_on_lately(request)
                    or self._hints.likely_queued(request.customer_id)
                )
            ):
                # Likely blocked by the lease this manager has just
                # handed the paths to, or by a request queued before
                # it: queued in the same round trip.
                outcome = self._queue_in_one(connection, request)
                if outcome is not None:
                    return outcome
            # With a queue (seen moments ago), the grant in one round
            # trip is denied: it requires an empty one.
            elif ticket is not None or not self._hints.likely_queued(request.customer_id):
                if ticket is None and first and self._hints.likely_idle(request.customer_id):
                    lean = self._grant_lean(connection, request)
                    if lean is not None:
                        return lean
                granted = self._grant_in_one(connection, request, ticket, first=first)
                if isinstance(granted, Granted):
                    return granted
                if (
                    granted
                    and queue
                    and first
                    and ticket is None
                    and shape(request.paths, request.shallow).spelled
                ):
                    # Denied with nothing queued lately: something live is
                    # in the way (a parent folder among busy children). The
                    # next try queues in its one round trip, as above, so
                    # the sentinel row is not held while the client judges
                    # who is in the way and then writes the queue row. Not
                    # a large request: its statements for that round trip
                    # are not compiled before its time starts, and on
                    # PostgreSQL compiling and running them for 1,000 paths
                    # took the 5 s a test gives it to say who is in the way.
                    outcome = self._queue_in_one(connection, request)
                    if outcome is not None:
                        return outcome
            # Denied, or the sentinel row is missing, or the case
            # rules differ: nothing was written, the transaction is
            # over. The attempt below says who is in the way, and
            # queues.
            denied = True
        elif ticket is None and self._hints.likely_queued(request.customer_id):
            # Where COMMITs go alone (a Galera node): with a queue
            # seen moments ago, the first attempt is likely denied;
            # the reads that say who is in the way go in its round
            # trip.
            denied = True
        return self._grant_batched(connection, request, ticket, queue, denied=denied)

    def _grant_lean(self, connection: Connection, request: GrantRequest) -> Granted | None:
        """A request's first attempt, granted without the conflict and queue
        searches where the customer has no lock or queue row at all (its
        counts say so: see ``LEAN_CLAIM`` in :mod:`pathlock._statements.lean`): in
        one round trip, its COMMIT included. ``None`` if the customer has
        rows (or untrusted counts, or no sentinel row yet, or the other case
        rule): nothing was written, and the transaction is over; the caller
        searches, and this manager does not try this way for the customer
        for a while (:data:`BUSY_FOR`)."""
        parameters = lean_parameters(request)
        parameters.update(self._tx.claim_parameters(request.customer_id))
        parameters.update(until(self.settings))
        claimed, granted = batch.run(
            connection,
            [
                (LEAN_CLAIM, parameters),
                (lean_grant(len(request.paths), bool(request.shallow)), parameters),
            ],
            commit=True,
        )
        if not claimed.rowcount:
            self._hints.seen_busy(request.customer_id)
            return None
        return self._granted_in_one(request, granted, claimed)

    def _grant_in_one(
        self, connection: Connection, request: GrantRequest, ticket: int | None, *, first: bool
    ) -> Granted | bool:
        """The grant in one round trip, its COMMIT included, where nobody is
        in the way and nobody is queued before it (see ``LOCK_SENTINEL`` in
        :mod:`pathlock._statements`); if not granted, whether the customer's
        sentinel row exists (then the grant was denied): nothing was
        written, and the transaction is over. The ``first`` transaction
        of a lease need not look for rows of its own (see
        :func:`grant_statement`)."""
        customer = request.customer_id
        parameters = grant_parameters(request, ticket)
        parameters.update(self._tx.claim_parameters(customer))
        steps: Steps = [
            (SET_GRANT_UNTIL, until(self.settings)),
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
        _until, locked, granted, claimed, *_ = batch.run(connection, steps, commit=True)
        if granted.rowcount == 0:
            return bool(locked.rowcount)
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
        ``Hints.handed_on_lately``), in one round trip with its COMMIT: the
        grant in one round trip, and if a live row of another lease is in its
        way, the queue row too, under the sentinel row as an attempt queues,
        with the reads that say who is in the way; the sentinel row is held
        for one round trip, not two. ``None`` if neither happened (nothing
        was written: the request waits only for the queue, or the sentinel
        row is missing): the caller attempts the usual way. A request queued
        so that would wait for itself or for a request that waits for it
        leaves the queue at once."""
        customer = request.customer_id
        parameters = grant_parameters(request, None)
        parameters.update(self._tx.claim_parameters(customer))
        parameters.update(waiter_parameters(request, self.settings.waiter_ttl))
        form = shape(request.paths, request.shallow)
        steps: Steps = [
            (SET_GRANT_UNTIL, until(self.settings)),
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
            *Picture.steps(request, parameters),
        ]
        _until, locked, granted, claimed, enqueued, _, _paths, *reads = batch.run(
            connection, steps, commit=True
        )
        if granted.rowcount:
            return self._granted_in_one(request, granted, claimed)
        if not enqueued.rowcount:
            return None
        ticket = int(enqueued.lastrowid)
        self._hints.seen_queued(customer)
        picture = Picture.judged(connection, request, ticket, parameters, reads)
        # Queued behind older requests alone (no live lock in the way), a
        # request waits for nobody's locks: no cycle.
        deadlock = None
        if picture.blockers:
            deadlock = deadlock_of(request, picture.blockers, picture.queued, picture.owner_locks)
        if deadlock is not None:
            # Waiting could never succeed: out of the queue again, and the
            # version moves for whoever judged its place behind it.
            leave(self._tx, connection, customer, request.lease_id, ticket)
            return deadlock
        return Blocked(
            picture.blockers,
            picture.ahead,
            ticket,
            int(locked.lastrowid),
            ahead_complete=picture.ahead_complete,
        )

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
        parameters = grant_parameters(request, ticket)
        steps: Steps = [
            (CLAIM, self._tx.claim_parameters(request.customer_id)),
            (grant_statement(shape(request.paths, request.shallow), queued=True), parameters),
            (LOCKS_ADDED, parameters),
        ]
        dequeued = not denied and ticket is not None
        if denied:
            steps += Picture.steps(request, parameters)
        elif dequeued:
            # Its queue row goes in the same round trip if the grant inserted
            # (LOCKS_ADDED matched a row: see _counted in pathlock._statements.grants).
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
            picture = Picture.judged(connection, request, ticket, parameters, reads)
        return self._denied(
            connection, request, token, ticket, queue=queue, parameters=parameters, picture=picture
        )

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
        parameters = grant_parameters(request, ticket)
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
        picture: Picture | None = None,
    ) -> Granted | Blocked | Deadlocked:
        # Denied: read who is in the way while still holding the sentinel
        # (unless ``picture`` was read so already), so the picture is the one
        # that denied us (the grant's parameters hold the conflict query's,
        # and more).
        if picture is None:
            picture = Picture.read(connection, request, ticket, parameters)
        if picture.handed is not None:
            # A release granted rows to this request (hand_over()): its queue
            # row is gone, and they are taken up here, under the sentinel row
            # this transaction holds.
            return self._taken_up(connection, request, picture.handed)
        if picture.blockers:
            deadlock = deadlock_of(request, picture.blockers, picture.queued, picture.owner_locks)
            if deadlock is not None:
                connection.rollback()
                return deadlock
        elif not picture.ahead and self._insert(connection, request, parameters, queued=False):
            # The queue was not empty, but nobody in it conflicts.
            return self._granted(connection, request, token, ticket)
        blockers, ahead = picture.blockers, picture.ahead
        if picture.queued or (queue and ticket is None):
            self._hints.seen_queued(request.customer_id)
        if queue and ticket is None:
            # Queued under the sentinel, so every later grant sees it. The
            # version stays put: nobody watching has anything new to try.
            enqueued, *_ = commit(
                connection,
                self.dialect,
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
        (taken,) = commit(connection, self.dialect, [(TAKE_UP, take_up_parameters(request))])
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
            commit(connection, self.dialect, [(DEQUEUE, parameters), (WAITERS_REMOVED, parameters)])
        return Granted(token)

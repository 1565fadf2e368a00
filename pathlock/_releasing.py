"""Releases: a lease's rows deleted in one round trip with the COMMIT, the
way the customer's queue needs (nobody queued: the counts kept down; a
request next in line: the paths handed to it, see
:mod:`pathlock._handing_over`; otherwise the version moved, so that waiters
try for themselves); and an owner's rows released all at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from pathlock import _batch as batch
from pathlock import _handing_over as handing_over
from pathlock._core.hints import Heir, Hints
from pathlock._handing_over import HandOver, QueueHead
from pathlock._round_trips import read_and_roll_back
from pathlock._statements.grants import BUMP, LOCK_AND_READ_SENTINEL, LOCKS_REMOVED
from pathlock._statements.lean import COUNTED_DOWN_OR_QUEUED, release_said
from pathlock._statements.leases import RELEASE, RELEASE_OWNER
from pathlock._statements.queue import QUEUE_HEAD
from pathlock._transactions import Transactions, delete_counted
from pathlock.types import Owner, PathMode


class Releases:
    """A manager's releases, run through ``transactions`` (see
    :class:`pathlock._store.Store`); ``hand_over`` hands released paths to
    the queue."""

    def __init__(self, transactions: Transactions, hints: Hints, hand_over: HandOver) -> None:
        self._tx = transactions
        self._hints = hints
        self._hand_over = hand_over
        self.dialect = transactions.dialect

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
        transaction of its own (``HandOver.hand_over``).
        Elsewhere a release moves the customer's version, and the waiters
        try for themselves."""
        parameters = {"c_id": customer_id, "l_id": lease_id}
        known, heir = self._hints.heir_of(lease_id, paths)

        def attempt(connection: Connection, number: int) -> tuple[int | None, QueueHead | None]:
            if number == 1 and batch.commits_in_batches(connection):
                if heir is not None:
                    return self._release_to(connection, customer_id, parameters, heir), None
                # No heir known: the lease was not handed its paths, or the
                # request next in line then waits for others (or none was).
                if self._hints.likely_queued(customer_id):
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
            self._hand_over.hand_over(customer_id, paths, queue, deadline)
        return deleted

    def _release_reading_first(
        self,
        connection: Connection,
        customer_id: int,
        parameters: dict[str, Any],
        released: Sequence[PathMode] | None,
    ) -> tuple[int, QueueHead | None]:
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
        The rows deleted, and what ``HandOver.hand_over`` needs, if anything."""
        (rows,) = read_and_roll_back(connection, [(QUEUE_HEAD, {"c_id": customer_id})], every=True)
        if not rows:
            return self._release_lean(connection, customer_id, parameters)
        self._hints.seen_queued(customer_id)
        concerned, heir = handing_over.heir(released, *handing_over.queued(customer_id, rows))
        if heir is not None:
            return self._release_to(connection, customer_id, parameters, heir), None
        if concerned:
            return self._release_moving(connection, customer_id, parameters), None
        return self._release_in_one(connection, customer_id, parameters)

    def _release_to(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any], heir: Heir
    ) -> int:
        """A release that hands its paths to ``heir`` in its one round trip
        (see ``HandOver.release_to``), or, where the server
        refused the hand-over, without it. The rows deleted."""
        deleted = self._hand_over.release_to(connection, customer_id, parameters, heir)
        if deleted is None:
            return self._release_moving(connection, customer_id, parameters)
        return deleted

    def _release_lean(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any]
    ) -> tuple[int, QueueHead | None]:
        """A release for a customer not seen with a queue lately: in one round
        trip, its COMMIT included, the rows deleted and counted down, and the
        version read only where requests may be queued (see
        ``COUNTED_DOWN_OR_QUEUED``); then, only there, the head of the queue
        read, for ``HandOver.hand_over``. The rows deleted, and what
        ``HandOver.hand_over`` needs if anyone waits.

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
                self._hints.seen_idle(customer_id)
            return int(deleted.rowcount), None
        self._hints.seen_queued(customer_id)
        if not deleted.rowcount:
            return 0, None
        # The read and its ROLLBACK in one round trip.
        (rows,) = read_and_roll_back(connection, [(QUEUE_HEAD, {"c_id": customer_id})], every=True)
        if not rows:
            return int(deleted.rowcount), None
        return int(deleted.rowcount), handing_over.queue_head(customer_id, version, rows)

    def _release_in_one(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any]
    ) -> tuple[int, QueueHead | None]:
        """A release in one round trip, where a batch carries its COMMIT: the
        rows deleted, and what ``HandOver.hand_over`` needs if anyone waits."""
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
        self._hints.seen_queued(customer_id)
        if not deleted.rowcount:
            return deleted.rowcount, None
        return deleted.rowcount, handing_over.queue_head(customer_id, locked.lastrowid, queued.rows)

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

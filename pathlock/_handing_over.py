"""A release that hands its paths to the request next in line: whom it
hands them to, the statements of the grant (under the customer's sentinel
row, only if that request is still queued, alive, the oldest, and nothing is
in its way), and the version moved where nobody could be granted them, so
that those who waited try for themselves."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from pathlock import _batch as batch
from pathlock._core.fairness import may_conflict
from pathlock._core.hints import Heir, Hints, well_formed
from pathlock._core.records import GrantRequest, item_row, waiter_info
from pathlock._parameters import grant_parameters
from pathlock._round_trips import Steps, until
from pathlock._statements.conflicts import shape
from pathlock._statements.grants import (
    BUMP_IF_UNMOVED,
    BUMP_UNLESS_HANDED,
    CLAIM_IF_GRANTED,
    LOCK_AND_READ_SENTINEL,
    LOCK_SENTINEL,
    LOCKS_REMOVED,
    SET_GRANT_UNTIL,
    WAITERS_REMOVED,
    WAKE_HEIR,
    grant_statement,
)
from pathlock._statements.leases import RELEASE_BEFORE_HAND_OVER
from pathlock._statements.queue import DEQUEUE_IF_GRANTED, HAND_OVER_WAITERS, QUEUE_ITEM
from pathlock._transactions import Transactions
from pathlock.errors import PathLockError
from pathlock.types import PathMode, WaiterInfo

log = logging.getLogger("pathlock.store")


@dataclass(frozen=True)
class QueueHead:
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


def queue_head(customer_id: int, version: int, rows: Sequence[Any]) -> QueueHead:
    """What a release read: the version its lock of the sentinel row read, and
    the oldest queued requests (see :func:`queued`)."""
    return QueueHead(version, *queued(customer_id, rows))


def queued(customer_id: int, rows: Sequence[Any]) -> tuple[list[WaiterInfo], int | None]:
    """The oldest queued requests as a release reads them (``QUEUE_HEAD``'s
    rows, each a JSON array), and how long paths handed to the first would
    last (see :attr:`QueueHead.term_us`). A row pathlock cannot read (written by
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


def heir(
    released: Sequence[PathMode] | None, queued: list[WaiterInfo], term_us: int | None
) -> tuple[bool, Heir | None]:
    """Whom a release of ``released`` (``None``: unknown) that read the
    oldest ``queued`` requests hands its paths to (``term_us``: see
    :attr:`QueueHead.term_us`): whether anyone queued may have waited for
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
    if term_us is not None and term_us > 0 and well_formed(head.paths):
        return True, Heir(head, term_us)
    return True, None


class HandOver:
    """A manager's hand-overs, run through ``transactions`` (see
    :class:`pathlock._store.Store`)."""

    def __init__(self, transactions: Transactions, hints: Hints) -> None:
        self._tx = transactions
        self._hints = hints
        self.settings = transactions.settings
        self.dialect = transactions.dialect

    def hand_over(
        self,
        customer_id: int,
        released: Sequence[PathMode] | None,
        queue: QueueHead,
        deadline: float | None,
    ) -> None:
        """After a release of ``released`` (``None``: unknown) that left the
        customer's version as ``queue.version``: grant the head of the queue if
        it waited for those paths, in one round trip; if that was not
        possible, move the version so that those who waited for them try for
        themselves. The rows granted expire after the term the head's queue
        row records (the shorter of its ttl and its waiter ttl), so a waiter
        that died meanwhile holds them no longer than its queue row would
        have blocked them; the waiter takes them up (``Queue.take_up``, or its
        first renewal). A failure here is logged: the waiters find the paths
        free at their next recheck."""
        concerned, head = heir(released, queue.waiters, queue.term_us)
        if not concerned:
            return

        def attempt(connection: Connection, number: int) -> None:
            if head and number == 1 and batch.commits_in_batches(connection):
                self._grant_head(connection, customer_id, head, queue.version)
            else:
                self._tx.bump(connection, customer_id)
                connection.commit()

        try:
            self._tx.run("handing locks over", attempt, customer_id=customer_id, deadline=deadline)
        except PathLockError as error:
            self.not_handed_over(customer_id, error)

    def not_handed_over(self, customer_id: int, error: Exception) -> None:
        """Say that a release's paths were not handed over (``error``)."""
        log.warning(
            "could not hand customer %d's released locks to the queue: %s;"
            " its requests find them free within %g s",
            customer_id,
            error,
            self.settings.recheck,
        )

    def _grant_head(
        self,
        connection: Connection,
        customer_id: int,
        heir: Heir,
        seen: int,
    ) -> None:
        """Grant ``heir`` its paths, in one round trip that ends with the
        COMMIT, if nothing is in its way and it is still the oldest live
        request; then move the version from ``seen`` unless the grant did."""
        steps: Steps = [
            (SET_GRANT_UNTIL, until(self.settings)),
            (LOCK_SENTINEL, {"c_id": customer_id}),
        ]
        grant = len(steps)
        steps += self.handing_to(customer_id, heir)
        steps.append((BUMP_IF_UNMOVED, {"c_id": customer_id, "seen": seen}))
        replies = batch.run(connection, steps, commit=True)
        if replies[grant].rowcount:
            self._hints.handed_to(customer_id, heir)

    def handing_to(self, customer_id: int, heir: Heir) -> Steps:
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
        parameters = grant_parameters(request, head.ticket)
        claim = self._tx.claim_parameters(customer_id)
        parameters.update(claim)
        statement = grant_statement(
            shape(request.paths, request.shallow), queued=True, sentinel_after=True, handed=True
        )
        ticket = {"c_id": customer_id, "l_id": head.lease_id, "w_ticket": head.ticket}
        # WAITERS_REMOVED matches a row only where the queue row was deleted:
        # a statement after these may ask ROW_COUNT() whether it was.
        steps: Steps = [
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

    def release_to(
        self, connection: Connection, customer_id: int, parameters: dict[str, Any], heir: Heir
    ) -> int | None:
        """A release that hands its paths to ``heir``, the request next in line
        when this lease was handed them, in one round trip with its COMMIT:
        the sentinel row locked, the rows deleted, the grant (only if the
        request is still queued and alive, the oldest live one, and nothing
        is in its way: as :meth:`_grant_head`), and the version moved unless
        it was granted, so that whoever waits tries for itself. The rows
        deleted; ``None`` if the server refused a statement of the hand-over
        (logged): nothing was written, and the caller releases without
        handing over. A failure a retry may cure is raised."""
        try:
            _until, locked, deleted, _, granted, *_ = batch.run(
                connection,
                [
                    (SET_GRANT_UNTIL, until(self.settings)),
                    (LOCK_AND_READ_SENTINEL, {"c_id": customer_id}),
                    (
                        RELEASE_BEFORE_HAND_OVER,
                        {"c_id": customer_id, "released_l_id": parameters["l_id"]},
                    ),
                    (LOCKS_REMOVED, {"c_id": customer_id}),
                    *self.handing_to(customer_id, heir),
                    (BUMP_UNLESS_HANDED, {"c_id": customer_id}),
                ],
                commit=True,
            )
        except DBAPIError as error:
            if error.connection_invalidated or self.dialect.is_transient(error):
                raise  # a retry releases without handing over
            # A statement the server refused: it ran nothing after it, the
            # COMMIT included.
            connection.rollback()
            self.not_handed_over(customer_id, error)
            return None
        self._hints.seen_queued(customer_id)
        if granted.rowcount:
            self._hints.handed_to(customer_id, heir)
        if not locked.rowcount:
            # Rows without a sentinel row (an operator deleted it): the
            # deletion is committed (nothing else was); make the row, so
            # waiters see a new version.
            self._tx.bump(connection, customer_id)
            connection.commit()
        return int(deleted.rowcount)

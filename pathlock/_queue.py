"""A queued request's side of the queue: its checks while it waits (the
customer's version, the rows a release handed to it, whether an attempt would
grant it now), its queue row kept alive, the paths handed to it taken up, and
its rows deleted when it leaves the queue or ends in doubt."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection

from pathlock import _batch as batch
from pathlock._core.hints import Hints
from pathlock._core.records import GrantRequest, Outlook, Watched, values_row
from pathlock._parameters import grant_parameters, take_up_parameters
from pathlock._picture import Picture
from pathlock._polls import Ask, SharedPolls
from pathlock._round_trips import read_and_roll_back
from pathlock._statements.grants import LOCK_SENTINEL, LOCKS_REMOVED, VERSION, WAITERS_REMOVED
from pathlock._statements.leases import RELEASE, TAKE_UP
from pathlock._statements.queue import (
    DEQUEUE,
    FORGET_REQUEST,
    QUEUE_ITEM,
    REFRESH_WAITERS,
    WAITERS_ALIVE,
    WATCHED_HEAD,
    WATCHED_LEASES,
    WATCHED_LEASES_LEFT,
    WATCHED_TICKETS,
    watch_statement,
)
from pathlock._transactions import Transactions, delete_counted


class Queue:
    """The queue's operations for waiting requests, run through
    ``transactions`` (see :class:`pathlock._store.Store`)."""

    def __init__(self, transactions: Transactions, hints: Hints) -> None:
        self._tx = transactions
        self._hints = hints
        self.settings = transactions.settings
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
        self._polls = self._new_polls()

    def could_grant(
        self, request: GrantRequest, ticket: int | None, *, deadline: float | None = None
    ) -> Outlook:
        """Whether an attempt would grant ``request`` now, judged by plain
        reads without the sentinel: a waiter asks this when the version moved
        (or at its recheck) and makes a real attempt only if so. Many waiters
        asking at once therefore do not queue up on the sentinel row."""
        parameters = grant_parameters(request, ticket)

        def attempt(connection: Connection, _number: int) -> Outlook:
            picture = Picture.read(connection, request, ticket, parameters, end=True)
            if picture.handed is not None:
                # Handed over by a release since the request's last check.
                if picture.queued_rows is not None:
                    head = picture.queued_rows[0] if picture.queued_rows else None
                    self._hints.note_heir(request.customer_id, request.lease_id, head)
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
            leave(self._tx, connection, customer_id, lease_id, ticket)

        self._tx.run("leaving the queue", attempt, customer_id=customer_id, deadline=deadline)

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
        releases hand over (see ``Releases.release``), also the fencing token of
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
        row = read_and_roll_back(connection, [(statement, parameters)])[0]
        if row is None:
            return Watched(0, looked=looked)
        if not looked:
            version, left, still = row
            return Watched(int(version), None, _int(left), False, held_left=_int(still))
        # The one column of a check where releases hand over.
        version, handed, handed_us, next_in_line, left, still = json.loads(row.item)
        if handed is not None and own is not None:
            self._hints.note_heir(customer_id, own, _queue_row(next_in_line))
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
        first, *rest = read_and_roll_back(connection, steps, every=True)
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
                self._hints.note_heir(customer_id, handed[0], _queue_row(head))
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

    def take_up(self, request: GrantRequest, *, deadline: float | None = None) -> bool:
        """Take up the rows a release handed to ``request`` (see
        ``Releases.release``): extend them to the request's ttl, under the
        customer's sentinel row, as a renewal does. ``False`` if they
        expired (or were deleted) before that: the request is no longer
        queued, and must queue again."""
        parameters = take_up_parameters(request)
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


def leave(
    transactions: Transactions, connection: Connection, customer_id: int, lease_id: str, ticket: int
) -> None:
    """The transaction of a request that leaves the queue (see
    :meth:`Queue.leave_queue`), on ``connection``."""
    transactions.bump(connection, customer_id)
    parameters = {"c_id": customer_id, "l_id": lease_id, "w_ticket": ticket}
    delete_counted(connection, DEQUEUE, parameters, WAITERS_REMOVED)
    delete_counted(connection, RELEASE, parameters, LOCKS_REMOVED)
    connection.commit()


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

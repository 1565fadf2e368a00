"""The psycopg (version 3) connection that keeps to a call's time limit.

Imported only when pathlock creates a PostgreSQL engine (psycopg is an
extra: ``pip install 'pathlock[postgresql]'``).

psycopg runs every exchange with the server through
:meth:`psycopg.Connection.wait`, which takes a timeout (psycopg 3.3.6 and
later: importing this module refuses an older one). :class:`BoundedConnection`
passes it the time left under the limit in force (:mod:`pathlock._deadlines`):
a server that hangs or was stopped, a host that never answers, or a row lock
held by a client that froze costs an attempt no more than its limit, at no
cost in round trips. A wait that runs out leaves the protocol in an unknown
state: the connection is closed (the server ends the session's transaction
when it notices) and the call fails with an :class:`psycopg.OperationalError`
that says "timed out", which SQLAlchemy takes for a lost connection (it
invalidates it, so it never goes back to the pool).
"""

from __future__ import annotations

import inspect
import math
import os
import re
from typing import Any

import psycopg
from psycopg import errors
from sqlalchemy.util import await_only

if "timeout" not in inspect.signature(psycopg.Connection.wait).parameters:
    raise ImportError(
        "pathlock needs psycopg 3.3.6 or later (its waits take a timeout),"
        f" not {psycopg.__version__}"
    )

from pathlock import _deadlines as deadlines
from pathlock.dialects._pg_batches import BATCH_REPLY, PREPARED

_IDLE = psycopg.pq.TransactionStatus.IDLE
_TEXT = psycopg.pq.Format.TEXT
_CHANGED, _ID = (name.encode() for name in BATCH_REPLY)
_EXECUTED = re.compile(r"EXECUTE (pathlock_[0-9a-f]+)")
_PREPARED_NOW = "SELECT name FROM pg_prepared_statements WHERE name LIKE 'pathlock!_%' ESCAPE '!'"

TIMED_OUT = "timed out: the call's time limit passed while waiting for the server"
"""The message of the error a wait that ran out raises (``is_timeout``)."""


class _Batching:
    """What both connections keep of their batches (one query of several
    statements): the statements the session has prepared, and whether the
    query being sent begins its own transaction."""

    pgconn: Any
    _pathlock_cursor: Any = None  # the ClientCursor batches are sent through
    _pathlock_prepared: set[str] | None = None  # None: to be asked
    _pathlock_asked = False  # whether a batch was sent on this connection
    _pathlock_begins = False  # the query being sent begins its transaction
    _pathlock_unread = False  # the current result of the batch not read yet
    _pathlock_pid = 0  # the process that opened it

    def _pathlock_query(self, sql: str, prepared: set[str]) -> tuple[str, list[str], bool]:
        """The query that sends ``sql``: the statements this session has not
        prepared yet (of ``prepared``) prepared first, and a BEGIN of its own
        outside a transaction (psycopg would send its BEGIN alone, a round
        trip more). With the names prepared, and whether it begins."""
        new = [name for name in dict.fromkeys(_EXECUTED.findall(sql)) if name not in prepared]
        begins = self.pgconn.transaction_status == _IDLE
        head = "BEGIN;\n" if begins else ""
        if new:
            head += "".join([PREPARED[name] + ";\n" for name in new])
        self._pathlock_begins = begins
        return head + sql, new, begins

    def _pathlock_sent(self, cursor: Any, prepared: set[str], new: list[str], begins: bool) -> None:
        """The query went through: its replies to the BEGIN and the PREPAREs
        skipped; the first statement's is next."""
        prepared.update(new)
        for _ in range(begins + len(new)):
            cursor.nextset()
        self._pathlock_unread = True

    def _pathlock_next(self) -> Any:
        """The cursor, on the next statement's reply."""
        cursor = self._pathlock_cursor
        assert cursor is not None  # noqa: S101 - send_batch() made it
        if not self._pathlock_unread and not cursor.nextset():
            raise psycopg.InterfaceError("no reply left in the batch")
        self._pathlock_unread = False
        return cursor

    @staticmethod
    def _pathlock_reply(
        names: tuple[str, ...], rows: list[Any]
    ) -> tuple[int, int | None, tuple[str, ...] | None, list[Any]]:
        if names[:2] == BATCH_REPLY:
            changed, generated = rows[0][:2]
            return changed, generated, None, []
        return len(rows), None, names, rows

    @staticmethod
    def _pathlock_counts(cursor: Any) -> tuple[int, int | None, None, list[Any]] | None:
        """The reply of a data-modifying statement (its row of
        :data:`BATCH_REPLY`), read from libpq's result itself; ``None`` for
        any other. psycopg's ``description`` and ``fetchall()`` build a column
        object per column and load the row through its adapters: some twenty
        Python calls per reply, four or five replies per acquire + release."""
        result = cursor.pgresult
        if (
            result is None
            or result.nfields < 2  # noqa: PLR2004 - the two columns of BATCH_REPLY
            or result.ntuples < 1
            or result.fname(0) != _CHANGED
            or result.fname(1) != _ID
            or result.fformat(0) != _TEXT
            or result.fformat(1) != _TEXT
        ):
            return None
        changed = result.get_value(0, 0)
        generated = result.get_value(0, 1)
        return (
            int(changed),  # a whole number in decimal digits, never NULL
            None if generated is None else int(generated),
            None,
            [],
        )

    def drain(self) -> None:
        """Forget the rest of the batch's replies (all read already)."""
        self._pathlock_unread = False

    def _start_query(self) -> Any:
        # psycopg begins a transaction with a BEGIN of its own before a
        # query, unless the query is a batch that begins it itself.
        if not self._pathlock_begins:
            yield from super()._start_query()  # type: ignore[misc]

    def __del__(self, *_: Any) -> None:
        # A connection dropped without close(): by an interrupt between its
        # connect and the pool taking it, or with the pool of an engine
        # nobody disposed. The collector closes its socket either way (the
        # server then ends the session), as PyMySQL's connections are; psycopg
        # would also warn (ResourceWarning), which pathlock's own tests turn
        # into failures at whatever test the collector happens to run in.
        # Not in a forked child, which drops the parent's pool unclosed: a
        # finish() sends the server a Terminate on the socket the child
        # shares with its parent, and ended the parent's session.
        if (
            getattr(self, "pgconn", None) is not None
            and not self.closed  # type: ignore[attr-defined]
            and self._pathlock_pid == os.getpid()
        ):
            self.pgconn.finish()


class BoundedConnection(_Batching, psycopg.Connection[Any]):
    """A psycopg connection whose waits for the server end with the time left
    under the limit in force, which says when a COMMIT got no reply
    (:attr:`pathlock._deadlines.Limit.commit_unanswered`), and which sends a
    batch of statements in one query (:meth:`send_batch`)."""

    def send_batch(self, sql: str, parameters: dict[str, Any] | tuple[Any, ...]) -> None:
        """Send the statements ``sql`` (separated by semicolons) with
        ``parameters`` in one query, their values escaped by psycopg (as its
        ``ClientCursor`` does), and read every reply: the server runs them in
        order, each with a snapshot of its own (READ COMMITTED), and runs
        nothing after one that fails, whose error this raises."""
        cursor = self._pathlock_cursor
        if cursor is None:
            cursor = self._pathlock_cursor = psycopg.ClientCursor(self)
        prepared = self._pathlock_prepared
        if prepared is None:
            prepared = self._pathlock_prepared = self._pathlock_prepared_now(cursor)
        query, new, begins = self._pathlock_query(sql, prepared)
        try:
            cursor.execute(query, parameters)
        except BaseException:
            if new:
                # Those before the statement that failed were prepared (a
                # PREPARE outlives its transaction): asked anew next time.
                self._pathlock_prepared = None
            raise
        finally:
            self._pathlock_begins = False
        self._pathlock_sent(cursor, prepared, new, begins)

    def _pathlock_prepared_now(self, cursor: psycopg.ClientCursor[Any]) -> set[str]:
        """The statements of batches this session has prepared: none on a
        new connection; else (after a batch that prepared some failed) as
        the server lists them, read outside any transaction."""
        if not self._pathlock_asked:
            self._pathlock_asked = True
            return set()
        self._pathlock_begins = True
        try:
            cursor.execute(_PREPARED_NOW)
        finally:
            self._pathlock_begins = False
        return {str(row[0]) for row in cursor.fetchall()}

    def reply(self) -> tuple[int, int | None, tuple[str, ...] | None, list[Any]]:
        """The next statement's reply, as :mod:`pathlock.dialects._pymysql`
        gives MySQL's: the rows it changed (for a SELECT: read), the id it
        generated or :class:`~pathlock.dialects.base.Fenced` was given
        (``None`` for a SELECT), and for a SELECT its columns' names and
        rows. A data-modifying statement replies with one row of the first
        two (see :func:`pathlock.dialects.postgresql._in_batch`)."""
        cursor = self._pathlock_next()
        counts = self._pathlock_counts(cursor)
        if counts is not None:
            return counts
        description = cursor.description
        if description is None:  # COMMIT, ROLLBACK
            return max(cursor.rowcount, 0), 0, None, []
        return self._pathlock_reply(tuple([c.name for c in description]), cursor.fetchall())

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        bounded = deadlines.time_left(timeout)
        if bounded == timeout:  # no limit in force, or none sooner
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, bounded)
        except errors._WaitTimeout:
            # Part of a message may have been sent or read: nothing more can
            # be said on this connection.
            self.pgconn.finish()
            raise psycopg.OperationalError(TIMED_OUT) from None

    def commit(self) -> None:
        deadlines.noting_unanswered(super().commit)


class BoundedAsyncConnection(_Batching, psycopg.AsyncConnection[Any]):
    """The asyncio API's psycopg connection, which sends a batch in one query
    as :class:`BoundedConnection` does. pathlock's code runs in greenlets
    of SQLAlchemy's (see :mod:`pathlock._aio`): :meth:`send_batch` and
    :meth:`reply` are called as functions, and await the server on the
    loop. Its waits end with the asyncio timeout of each attempt."""

    def send_batch(self, sql: str, parameters: dict[str, Any] | tuple[Any, ...]) -> None:
        """As :meth:`BoundedConnection.send_batch`."""
        await_only(self._pathlock_send(sql, parameters))

    async def _pathlock_send(self, sql: str, parameters: dict[str, Any] | tuple[Any, ...]) -> None:
        cursor = self._pathlock_cursor
        if cursor is None:
            cursor = self._pathlock_cursor = psycopg.AsyncClientCursor(self)
        prepared = self._pathlock_prepared
        if prepared is None:
            prepared = self._pathlock_prepared = await self._pathlock_prepared_now(cursor)
        query, new, begins = self._pathlock_query(sql, prepared)
        try:
            await cursor.execute(query, parameters)
        except BaseException:
            if new:
                self._pathlock_prepared = None  # as BoundedConnection.send_batch()
            raise
        finally:
            self._pathlock_begins = False
        self._pathlock_sent(cursor, prepared, new, begins)

    async def _pathlock_prepared_now(self, cursor: psycopg.AsyncClientCursor[Any]) -> set[str]:
        """As :meth:`BoundedConnection._pathlock_prepared_now`."""
        if not self._pathlock_asked:
            self._pathlock_asked = True
            return set()
        self._pathlock_begins = True
        try:
            await cursor.execute(_PREPARED_NOW)
        finally:
            self._pathlock_begins = False
        return {str(row[0]) for row in await cursor.fetchall()}

    def reply(self) -> tuple[int, int | None, tuple[str, ...] | None, list[Any]]:
        """As :meth:`BoundedConnection.reply`."""
        cursor = self._pathlock_next()
        counts = self._pathlock_counts(cursor)
        if counts is not None:
            return counts
        description = cursor.description
        if description is None:  # COMMIT, ROLLBACK
            return max(cursor.rowcount, 0), 0, None, []
        rows = await_only(cursor.fetchall())
        return self._pathlock_reply(tuple([c.name for c in description]), rows)


async def connect_async(*cargs: Any, **cparams: Any) -> BoundedAsyncConnection:
    """A new :class:`BoundedAsyncConnection` (the psycopg asyncio dialect's
    ``async_creator_fn``), without psycopg's own prepared statements (see
    :func:`connect`)."""
    cparams["prepare_threshold"] = None
    connection = await BoundedAsyncConnection.connect(*cargs, **cparams)
    connection._pathlock_pid = os.getpid()
    return connection


def connect(*cargs: Any, **cparams: Any) -> BoundedConnection:
    """A new :class:`BoundedConnection` (SQLAlchemy's ``do_connect``): its
    connect timeout shortened to the time left, in whole seconds (libpq's
    unit; at least 2, libpq's least), and none of psycopg's own prepared
    statements: psycopg drops every prepared statement of the session
    (``DEALLOCATE ALL``, in a round trip of its own) after a ROLLBACK on a
    connection where it prepared any, the batches' among them, and a
    waiter's check ends with one. The statements that travel in batches
    are prepared by the connection itself (:meth:`BoundedConnection.send_batch`)."""
    left = deadlines.time_left(None)
    if left is not None:
        seconds = max(2, math.ceil(left))
        configured = cparams.get("connect_timeout")
        if configured is None or int(configured) > seconds:
            cparams["connect_timeout"] = seconds
    cparams["prepare_threshold"] = None
    connection = BoundedConnection.connect(*cargs, **cparams)
    connection._pathlock_pid = os.getpid()
    return connection

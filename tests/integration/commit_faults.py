"""Faults at the next COMMIT this process sends over PyMySQL, wherever it is
sent: on its own (``Connection.commit()``, a grant's), or as the last
statement of a batch (a release's, see ``pathlock/_batch.py``), whose replies
are read by a cursor or without one (``pathlock/dialects/_pymysql.py``).

- :meth:`CommitFaults.lose_reply`: the COMMIT lands, and its reply is lost
  (the connection fails as if cut during the COMMIT).
- :meth:`CommitFaults.refuse`: the server refuses the COMMIT (a Galera node
  that left the primary component: 1047) and the transaction stays open.
- :meth:`CommitFaults.land_unchecked`: the COMMIT lands, but as a Galera node
  sometimes lands one after a change of the cluster's members: beside a
  conflicting write it was never checked against, and answered with 1213.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pymysql.connections
import pymysql.cursors
import pymysql.err
import pytest

from pathlock.dialects import _pymysql

Connection = pymysql.connections.Connection

_COMMIT = "COMMIT"


class CommitFaults:
    """Installed on ``monkeypatch`` when made; each ``arm`` call makes the
    next COMMIT of any connection of the process fail once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._lock = threading.Lock()
        self._armed: list[Callable[[Connection, bool], None]] = []
        commit = Connection.commit
        send = Connection._execute_command
        nextset = pymysql.cursors.Cursor.nextset
        faults = self

        def faulty_commit(self: Connection) -> None:
            fault = faults._take()
            if fault is None:
                commit(self)
                return
            fault(self, True)
            commit(self)
            fault(self, False)

        def faulty_send(self: Connection, command: int, sql: str | bytes) -> None:
            text = sql.decode() if isinstance(sql, bytes) else sql
            batched = ";" in text and text.rstrip().upper().endswith(_COMMIT)
            fault = faults._take() if batched else None
            if fault is None:
                send(self, command, sql)
                return
            # A batch that ends with COMMIT: the fault strikes at its last reply.
            if getattr(fault, "refuses", False):  # the statements run; no COMMIT
                text = text.rstrip()[: -len(_COMMIT)].rstrip().rstrip(";")
                sql = text.encode() if isinstance(sql, bytes) else text
            self._pathlock_fault = fault
            send(self, command, sql)

        def faulty_nextset(self: pymysql.cursors.Cursor) -> Any:
            connection = self.connection
            fault = getattr(connection, "_pathlock_fault", None)
            result = connection._result
            if fault is not None and getattr(fault, "refuses", False) and not result.has_next:
                connection._pathlock_fault = None
                fault(connection, True)  # the COMMIT's reply: refused
            more = nextset(self)
            result = connection._result
            last = result is None or not result.has_next
            if fault is not None and not getattr(fault, "refuses", False) and last:
                connection._pathlock_fault = None
                fault(connection, False)  # the COMMIT landed: its reply is lost
            return more

        monkeypatch.setattr(Connection, "commit", faulty_commit)
        monkeypatch.setattr(Connection, "_execute_command", faulty_send)
        monkeypatch.setattr(pymysql.cursors.Cursor, "nextset", faulty_nextset)
        _without_cursor(monkeypatch)

    def lose_reply(self, code: int = 2013, *, stall: float = 0.0) -> None:
        """The next COMMIT lands; then, after ``stall`` seconds, the
        connection fails with ``code`` as if its reply never came."""

        def lost(connection: Connection, before: bool) -> None:
            if before:
                return
            time.sleep(stall)
            connection._force_close()
            raise pymysql.err.OperationalError(code, "reply lost after the COMMIT landed (test)")

        self._arm(lost)

    def land_unchecked(self, beside: Callable[[], None]) -> None:
        """The next COMMIT lands; ``beside()`` then writes what a transaction
        committed beside it on another node would have (unseen by its
        checks); and the COMMIT is answered with 1213, the connection intact.
        Measured on a Galera cluster (MariaDB 10.11, Galera 26.4), with the
        COMMIT at the end of a batch, around a node's return."""

        def unchecked(_connection: Connection, before: bool) -> None:
            if before:
                return
            beside()
            raise pymysql.err.OperationalError(
                1213, "Deadlock found when trying to get lock; try restarting transaction"
            )

        self._arm(unchecked)

    def refuse(self, code: int = 1047) -> None:
        """The server refuses the next COMMIT, and the transaction stays open."""

        def refused(_connection: Connection, before: bool) -> None:
            if before:
                raise pymysql.err.OperationalError(
                    code, "WSREP has not yet prepared node for application use"
                )

        refused.refuses = True  # type: ignore[attr-defined]
        self._arm(refused)

    def _arm(self, fault: Callable[[Connection, bool], None]) -> None:
        with self._lock:
            self._armed.append(fault)

    def _take(self) -> Callable[[Connection, bool], None] | None:
        with self._lock:
            return self._armed.pop(0) if self._armed else None


def _without_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The faults of :class:`CommitFaults`, for a batch whose replies are read
    without a cursor: armed on the connection when the batch is sent."""
    read = _pymysql.Connection.reply

    def faulty_reply(self: _pymysql.Connection) -> _pymysql.Reply:
        fault = getattr(self, "_pathlock_fault", None)
        refuses = getattr(fault, "refuses", False)
        if fault is not None and refuses and not self._pathlock_pending:
            self._pathlock_fault = None
            fault(self, True)  # the COMMIT's reply: refused
        reply = read(self)
        if fault is not None and not refuses and not self._pathlock_pending:
            self._pathlock_fault = None
            fault(self, False)  # the COMMIT landed: its reply is lost
        return reply

    monkeypatch.setattr(_pymysql.Connection, "reply", faulty_reply)

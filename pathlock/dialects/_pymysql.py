"""The PyMySQL connections of the engines pathlock creates: deadlines kept
(:class:`pathlock._deadlines.BoundedConnection`), and the replies of a batch
whose statements return no rows read without a cursor.

An acquire + release is two batches of such statements (their COMMITs
included: six replies, each an OK packet). Read through a cursor, each reply
costs some forty Python calls of PyMySQL's result machinery (a result object,
its packet wrapper, the cursor's bookkeeping) to learn two numbers; here it
costs PyMySQL's own packet read and a few calls to decode them. Values are
escaped by PyMySQL's own functions, without its per-value dispatch for the two
types a batch mostly carries (text and integers). It relies on three private
methods of PyMySQL's connection (``_execute_command``, ``_read_packet``,
``_escape_string``, there since PyMySQL 0.7); where one is missing, batches go
through a cursor as on any other connection (:data:`DIRECT`).
"""

from __future__ import annotations

from typing import Any

import pymysql.connections
from pymysql import converters
from pymysql.constants import COMMAND, SERVER_STATUS

from pathlock import _deadlines as deadlines

DIRECT = all(
    callable(getattr(pymysql.connections.Connection, name, None))
    for name in ("_execute_command", "_read_packet", "_escape_string")
)
"""Whether this PyMySQL has what :class:`Connection` needs to read replies
without a cursor."""

_MORE_RESULTS = SERVER_STATUS.SERVER_MORE_RESULTS_EXISTS
_OK = 0x00  # the first byte of an OK packet
_OK_SIZE = 7  # its least size: the byte, two integers of one byte, status, warnings
_ONE_BYTE = 0xFB  # a length-encoded integer's first byte below this: its value
_LONGER = {0xFC: 2, 0xFD: 3, 0xFE: 8}  # else: the size of the value that follows


class Connection(deadlines.BoundedConnection):
    """A PyMySQL connection that sends a batch and reads the reply of each
    of its statements, where none returns rows (see the module's
    docstring)."""

    _pathlock_pending = False  # replies of the last batch not read yet

    def send_batch(self, sql: str, parameters: dict[str, Any] | tuple[Any, ...]) -> None:
        """Send ``sql`` with ``parameters`` (by name or in order) escaped, as
        ``cursor.execute()`` would."""
        escape = self.escape
        escape_string = (
            self._escape_string
            if self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
            else converters.escape_string  # what _escape_string() calls then
        )
        escaped: dict[str, str] | tuple[str, ...]
        if isinstance(parameters, dict):
            escaped = {
                name: "'" + escape_string(value) + "'"
                if type(value) is str
                else str(value)
                if type(value) is int
                else escape(value)
                for name, value in parameters.items()
            }
        else:
            escaped = tuple(map(escape, parameters))
        try:
            query = sql % escaped
        except TypeError as error:
            raise pymysql.err.ProgrammingError(str(error)) from error
        self._execute_command(COMMAND.COM_QUERY, query)
        self._pathlock_pending = True

    def changes(self) -> tuple[int, int]:
        """The next reply of the batch sent: its rows changed (matched, for
        an UPDATE) and the id it generated or ``LAST_INSERT_ID(expr)`` was
        given. Raises the server's error as PyMySQL does; the server runs
        nothing of the batch after it."""
        try:
            data = self._read_packet()._data
        except pymysql.err.MySQLError:
            # The server's error (it runs nothing after it), or the
            # connection lost (PyMySQL closed it).
            self._pathlock_pending = False
            raise
        except BaseException:
            # An interrupt, say, maybe in the middle of a packet: what
            # follows on the socket cannot be read as a reply.
            self._pathlock_pending = False
            self._force_close()
            raise
        if data[0] != _OK or len(data) < _OK_SIZE:
            # Rows, where none were expected: nothing to read them with here.
            self._pathlock_pending = False
            self._force_close()
            raise pymysql.err.InternalError("a statement of a batch returned rows")
        # Mostly numbers below 251, of one byte each.
        changed = data[1]
        if changed < _ONE_BYTE:
            position = 2
        else:
            changed, position = _length_encoded(data, 1)
        inserted = data[position]
        if inserted < _ONE_BYTE:
            position += 1
        else:
            inserted, position = _length_encoded(data, position)
        status = data[position] | data[position + 1] << 8
        self.server_status = status
        self._pathlock_pending = bool(status & _MORE_RESULTS)
        return changed, inserted

    def drain(self) -> None:
        """Read what is left of the batch's replies (after an interrupt, say),
        so that the connection can take the next query."""
        while self._pathlock_pending and self._sock is not None:
            self.changes()


def _length_encoded(data: bytes, position: int) -> tuple[int, int]:
    """The length-encoded integer at ``position`` of ``data``, and the
    position after it."""
    first = data[position]
    if first < _ONE_BYTE:
        return first, position + 1
    size = _LONGER[first]
    start = position + 1
    return int.from_bytes(data[start : start + size], "little"), start + size

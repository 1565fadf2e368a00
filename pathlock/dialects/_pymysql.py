"""The PyMySQL connections of the engines pathlock creates: deadlines kept
(:class:`BoundedConnection`), and the replies of a batch read without a
cursor (:class:`Connection`).

PyMySQL reads its socket timeouts from attributes of the connection object
before every packet it sends or reads, and its connect timeout before it
connects. :class:`BoundedConnection` answers those reads with the time left
under the call's limit (never more than the configured timeout: see
:mod:`pathlock._deadlines`), at no cost in round trips. A socket timeout
drops the connection (PyMySQL closes it; SQLAlchemy invalidates it), so it
never goes back to the pool.

An acquire + release is two batches of writes (their COMMITs included: six
replies, each an OK packet); a waiter's check is a batch of reads. Read
through a cursor, each reply costs some forty Python calls of PyMySQL's result
machinery (a result object, its packet wrappers, the cursor's bookkeeping),
and each column of a result set as many again to parse its description, the
same bytes for every run of the same statement. Here a reply costs a read of
its packets and a few calls to decode them, and a column's description
is parsed (by PyMySQL) the first time the connection sees those bytes. Values
are escaped as PyMySQL's cursor escapes them (a string by PyMySQL's own table,
NULL and truth values inline) and decoded by PyMySQL's own functions. It
relies on private members of PyMySQL's connection (the methods
``_execute_command``, ``_force_close`` and ``_escape_string``, the socket
``_sock`` and the packets' ``_next_seq_id``, all there since PyMySQL 0.7), and
on the table its ``escape_string()`` translates by: a batch is sent by
``_execute_command()`` (its bytes as PyMySQL's ``_write_bytes()`` sends them,
the time left looked up once instead of three times), and every reply packet
read as PyMySQL's own ``_read_packet()`` reads it, with its errors, but from
the bytes the socket received (not through PyMySQL's reader ``_rfile``, which
reads its other replies): a few calls per reply, and one call of the socket
per wait. Where one of these is missing, batches go through a cursor as on
any other connection (:data:`DIRECT`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import pymysql.connections
from pymysql import converters
from pymysql.constants import COMMAND, CR, FIELD_TYPE, SERVER_STATUS
from pymysql.protocol import FieldDescriptorPacket, MysqlPacket

from pathlock import _deadlines as deadlines
from pathlock._deadlines import LIMIT, SHORTEST_WAIT

DIRECT = (
    all(
        callable(getattr(pymysql.connections.Connection, name, None))
        for name in ("_execute_command", "_force_close", "_escape_string")
    )
    and hasattr(pymysql.connections, "TEXT_TYPES")
    and hasattr(converters, "_escape_table")
    and hasattr(pymysql.connections, "MAX_PACKET_LEN")
)
"""Whether this PyMySQL has what :class:`Connection` needs to read replies
without a cursor."""

_MORE_RESULTS = SERVER_STATUS.SERVER_MORE_RESULTS_EXISTS
_OK = 0x00  # the first byte of an OK packet
_OK_SIZE = 7  # its least size: the byte, two integers of one byte, status, warnings
_ONE_BYTE = 0xFB  # a length-encoded integer's first byte below this: its value
_LONGER = {0xFC: 2, 0xFD: 3, 0xFE: 8}  # else: the size of the value that follows
_NULL = 0xFB  # a column's value that is NULL
_EOF = 0xFE  # the first byte of an EOF packet (shorter than 9 bytes)
_EOF_SIZE = 9
_BINARY = 63  # the character set of a binary column
_COLUMNS_KEPT = 1024  # column descriptions a connection keeps parsed
_ERROR = 0xFF  # the first byte of an error packet
_LONGEST = pymysql.connections.MAX_PACKET_LEN if DIRECT else 0  # a packet this long goes on
_ESCAPES: Any = getattr(converters, "_escape_table", None)  # what escape_string() translates by
_RECEIVE = 16384  # bytes asked of the socket at least (a batch's replies)
_RECEIVE_MOST = 1 << 20  # and at most
_UNTRACKED = object()  # a socket timeout PyMySQL does not keep track of

Reply = tuple[int, int | None, tuple[str, ...] | None, list[tuple[Any, ...]]]
"""A statement's reply: the rows it changed (matched, for an UPDATE; read, for
a SELECT), the id it generated or ``LAST_INSERT_ID(expr)`` was given (``None``
for a SELECT), and for a SELECT its columns' names and its rows."""
_Column = tuple[str, str | None, Any]  # name, encoding, converter


_monotonic = time.monotonic


class _TimeLeft:
    """A timeout attribute of :class:`BoundedConnection`: set, the configured
    timeout; read, :func:`~pathlock._deadlines.time_left` of it, computed here (PyMySQL reads it
    before every packet, up to three times: a property calling time_left()
    was two Python calls each time, a dozen reads per grant and release)."""

    __slots__ = ("_configured",)

    def __set_name__(self, owner: type, name: str) -> None:
        self._configured = f"_configured{name}"

    def __get__(self, connection: object, owner: type | None = None) -> Any:
        if connection is None:
            return self  # the class's attribute
        try:  # not .get(): a call, a dozen per cycle
            configured: float | None = connection.__dict__[self._configured]
        except KeyError:  # before PyMySQL's __init__ set it
            configured = None
        current = LIMIT.get()
        if current is None:
            return configured
        ends = current.ends
        if ends == math.inf:
            return configured
        left = -((_monotonic() - ends) * 100 // 1) / 100  # see time_left()
        if left < SHORTEST_WAIT:  # noqa: PLR1730 - not max(): a call, a dozen per cycle
            left = SHORTEST_WAIT
        return left if configured is None or left < configured else configured

    def __set__(self, connection: object, value: float | None) -> None:
        connection.__dict__[self._configured] = value


class BoundedConnection(pymysql.connections.Connection):  # type: ignore[misc]
    """A PyMySQL connection whose connect, read and write timeouts are the
    configured ones, shortened to the time left under the current limit
    (:mod:`pathlock._deadlines`), and which says when a COMMIT got no reply
    (see :attr:`pathlock._deadlines.Limit.commit_unanswered`).

    The engines pathlock creates open their connections as this class. It
    relies on PyMySQL's private attributes ``_read_timeout`` and
    ``_write_timeout`` (read before every packet since PyMySQL 0.7) and its
    public ``connect_timeout``; and shares one TLS context among the
    connections given no TLS option (see :meth:`_create_ssl_ctx`)."""

    _read_timeout = _TimeLeft()
    _write_timeout = _TimeLeft()
    connect_timeout = _TimeLeft()
    _shared_tls: tuple[int, Any] | None = None
    """The process that built it, and the context of connections given no
    TLS option (see :meth:`_create_ssl_ctx`)."""

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        # Given no TLS option, PyMySQL (1.2.4 does) uses TLS if the server
        # offers it, without verifying the server's certificate, and builds
        # that connection's context anew: loading the system's certificates,
        # which that context never uses, costs some 16 ms of CPU, a hundred
        # times the rest of connecting. The context is the same every time;
        # here it is built once per process and shared (a context serves any
        # number of connections, in any thread). Contexts of TLS options
        # given (certificate files that may change) are built as before.
        if type(sslp) is not dict or sslp:
            return super()._create_ssl_ctx(sslp)
        pid = os.getpid()
        built = BoundedConnection._shared_tls
        if built is None or built[0] != pid:  # none yet, or built before a fork
            built = BoundedConnection._shared_tls = (pid, super()._create_ssl_ctx({}))
        return built[1]

    def commit(self) -> None:
        deadlines.noting_unanswered(super().commit)


class Connection(BoundedConnection):
    """A PyMySQL connection that sends a batch and reads the reply of each
    of its statements (see the module's docstring)."""

    _pathlock_pending = False  # replies of the last batch not read yet
    _pathlock_buffer = b""  # bytes received, not read yet from _pathlock_at to _pathlock_end
    _pathlock_at = 0
    _pathlock_end = 0
    _next_seq_id: int  # PyMySQL's: the sequence number of the next packet
    _current_timeout: Any = _UNTRACKED
    """The socket's timeout, as PyMySQL 1.2 and newer track it (set when it
    connects); older versions set it before every read and write, and so
    does this class's reading and writing then."""

    def send_batch(self, sql: str, parameters: dict[str, Any] | tuple[Any, ...]) -> None:
        """Send ``sql`` with ``parameters`` (by name or in order) escaped, as
        ``cursor.execute()`` would."""
        escape = self.escape
        # As PyMySQL escapes, in one call for a string (a C method: here
        # _escape_string() and escape_string() are two Python calls more)
        # and none for NULL or a truth value (pathlock's statements take
        # TRUE as 1).
        quotes_only = self.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
        escaped: dict[str, str] | tuple[str, ...]
        if isinstance(parameters, dict):
            escaped = {
                name: "'"
                + (value.replace("'", "''") if quotes_only else value.translate(_ESCAPES))
                + "'"
                if type(value) is str
                else str(value)
                if type(value) is int
                else "NULL"
                if value is None
                else ("1" if value else "0")
                if type(value) is bool
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

    def reply(self) -> Reply:
        """The next reply of the batch sent (see :data:`Reply`). Raises the
        server's error as PyMySQL does; the server runs nothing of the batch
        after it."""
        data = self._payload()
        if data[0] == _OK:
            # Mostly numbers below 251, of one byte each.
            try:
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
            except (IndexError, KeyError):  # shorter than an OK packet can be
                self._pathlock_pending = False
                self._force_close()
                raise pymysql.err.InternalError("a malformed OK packet") from None
            self._ended(status)
            return changed, inserted, None, []
        if data[0] == _NULL:  # LOAD DATA LOCAL INFILE: never asked for
            self._pathlock_pending = False
            self._force_close()
            raise pymysql.err.InternalError("a batch asked for a local file")
        # A result set: its number of columns, their descriptions, an EOF
        # packet, the rows, an EOF packet.
        count = _length_encoded(data, 0)[0]
        columns = [self._column(self._payload()) for _ in range(count)]
        self._payload()
        rows: list[tuple[Any, ...]] = []
        while True:
            data = self._payload()
            if data[0] == _EOF and len(data) < _EOF_SIZE:
                self._ended(data[3] | data[4] << 8)
                return len(rows), None, tuple([column[0] for column in columns]), rows
            rows.append(_row(data, columns))

    def _payload(self) -> bytes:
        """The next packet's payload, read as PyMySQL's ``_read_packet()``
        reads it, with its errors (a server's error raised, a lost or timed
        out connection closed), in a few calls: from the bytes received
        (:meth:`_received`), the header decoded inline, no packet object but
        for an error."""
        try:
            buffer = self._pathlock_buffer
            at = self._pathlock_at
            end = self._pathlock_end
            parts: list[bytes] = []
            while True:
                start = at + 4
                if start > end:
                    buffer, end = self._received(buffer, at, end, 4)
                    at, start = 0, 4
                length = buffer[at] | buffer[at + 1] << 8 | buffer[at + 2] << 16
                sequence = buffer[at + 3]
                if sequence != self._next_seq_id:
                    self._out_of_step(sequence)
                self._next_seq_id = (sequence + 1) % 256
                at = start + length
                if at > end:
                    buffer, end = self._received(buffer, start, end, length)
                    start, at = 0, length
                data = buffer[start:at]
                if length < _LONGEST:
                    break
                parts.append(data)  # a payload of 16 MiB or more goes on
            self._pathlock_buffer = buffer
            self._pathlock_at = at
            self._pathlock_end = end
            if parts:
                parts.append(data)
                data = b"".join(parts)
            if data and data[0] == _ERROR:
                MysqlPacket(data, self.encoding).raise_for_error()
        except pymysql.err.MySQLError:
            # The server's error (it runs nothing after it), or the
            # connection lost (closed already, as PyMySQL closes it).
            self._pathlock_pending = False
            raise
        except BaseException:
            # An interrupt, say, maybe in the middle of a packet: what
            # follows on the socket cannot be read as a reply.
            self._pathlock_pending = False
            self._force_close()
            raise
        return data

    def _received(self, buffer: bytes, at: int, end: int, needed: int) -> tuple[bytes, int]:
        """``buffer`` from ``at`` to ``end``, and after it what the socket
        received until there are ``needed`` bytes; and how many there are.
        Received as they come, not as PyMySQL's reader (``_rfile``) takes
        them: one call of the socket where the reader made five, and the
        replies of a batch that arrive together taken at once; the time
        left looked up once for each wait, not for every packet. A lost
        connection, or one that timed out, is closed and raised as PyMySQL
        raises it."""
        timeout = self._read_timeout
        current = self._current_timeout
        sock = self._sock
        if current != timeout:
            sock.settimeout(timeout)
            if current is not _UNTRACKED:
                self._current_timeout = timeout
        parts = [buffer[at:end]] if at < end else []
        have = end - at
        while True:
            wanted = needed - have
            try:
                # Never less than a batch's replies, never a buffer of 16 MiB.
                received = sock.recv(_RECEIVE if wanted <= _RECEIVE else min(wanted, _RECEIVE_MOST))
            except OSError as error:
                self._force_close()
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, f"Lost connection to MySQL server during query ({error})"
                ) from None
            size = len(received)
            if not size:
                self._force_close()
                raise pymysql.err.OperationalError(
                    CR.CR_SERVER_LOST, "Lost connection to MySQL server during query"
                )
            have += size
            if not parts and have >= needed:
                return received, size  # all in one: the common case
            parts.append(received)
            if have >= needed:
                return b"".join(parts), have

    def _force_close(self) -> None:
        # What was received is no reply to anything sent after this.
        self._pathlock_buffer = b""
        self._pathlock_at = self._pathlock_end = 0
        super()._force_close()

    def _write_bytes(self, data: bytes) -> None:
        """Send ``data`` as PyMySQL's ``_write_bytes()`` does, with the time
        left looked up once (PyMySQL reads its timeout up to three times)."""
        timeout = self._write_timeout
        current = self._current_timeout
        if current != timeout:
            self._sock.settimeout(timeout)
            if current is not _UNTRACKED:
                self._current_timeout = timeout
        try:
            self._sock.sendall(data)
        except OSError as error:
            self._force_close()
            raise pymysql.err.OperationalError(
                CR.CR_SERVER_GONE_ERROR, f"MySQL server has gone away ({error!r})"
            ) from error

    def _out_of_step(self, sequence: int) -> None:
        """Raise PyMySQL's error for a packet of the wrong sequence number."""
        self._force_close()
        if sequence == 0:  # MariaDB's error packet when it shuts down
            raise pymysql.err.OperationalError(
                CR.CR_SERVER_LOST, "Lost connection to MySQL server during query"
            )
        raise pymysql.err.InternalError(
            f"Packet sequence number wrong - got {sequence} expected {self._next_seq_id}"
        )

    def _ended(self, status: int) -> None:
        """A reply ended with the server's ``status``."""
        self.server_status = status
        if status & _MORE_RESULTS:
            self._pathlock_pending = True
            return
        self._pathlock_pending = False
        if self._pathlock_at != self._pathlock_end:
            # Bytes after the batch's last reply: the server sends nothing
            # unasked but when it goes away (MariaDB's error packet of a
            # shutdown). They would answer the next query: closed, as
            # PyMySQL closes a connection whose packets come out of step.
            self._force_close()

    def _column(self, data: bytes) -> _Column:
        """The name of the column ``data`` describes, and the encoding and
        converter of its values, as PyMySQL's result would take them."""
        known: dict[bytes, _Column] | None = self.__dict__.get("_pathlock_columns")
        if known is None or len(known) >= _COLUMNS_KEPT:
            known = self.__dict__["_pathlock_columns"] = {}
        column = known.get(data)
        if column is None:
            column = known[data] = self._described(FieldDescriptorPacket(data, self.encoding))
        return column

    def _described(self, field: FieldDescriptorPacket) -> _Column:
        # As pymysql.connections.MySQLResult._get_descriptions().
        field_type = field.type_code
        encoding: str | None = None
        if self.use_unicode:
            if field_type == FIELD_TYPE.JSON:
                encoding = self.encoding
            elif field_type in pymysql.connections.TEXT_TYPES:
                encoding = None if field.charsetnr == _BINARY else self.encoding
            else:
                encoding = "ascii"
        converter = self.decoders.get(field_type)
        if converter is converters.through:
            converter = None
        return field.name, encoding, converter

    def drain(self) -> None:
        """Read what is left of the batch's replies (after an interrupt, say),
        so that the connection can take the next query."""
        while self._pathlock_pending and self._sock is not None:
            self.reply()


def _length_encoded(data: bytes, position: int) -> tuple[int, int]:
    """The length-encoded integer at ``position`` of ``data``, and the
    position after it."""
    first = data[position]
    if first < _ONE_BYTE:
        return first, position + 1
    size = _LONGER[first]
    start = position + 1
    return int.from_bytes(data[start : start + size], "little"), start + size


def _row(data: bytes, columns: list[_Column]) -> tuple[Any, ...]:
    """The values of the row packet ``data``, as PyMySQL's result reads
    them (``_read_row_from_packet``)."""
    row: list[Any] = []
    position, end = 0, len(data)
    for _name, encoding, converter in columns:
        if position >= end:
            break  # fewer values than columns: as PyMySQL
        length = data[position]
        if length == _NULL:
            row.append(None)
            position += 1
            continue
        if length < _ONE_BYTE:
            start = position + 1
        else:
            length, start = _length_encoded(data, position)
        position = start + length
        value: Any = data[start:position]
        if encoding is not None:
            value = value.decode(encoding)
        if converter is not None:
            value = converter(value)
        row.append(value)
    return tuple(row)

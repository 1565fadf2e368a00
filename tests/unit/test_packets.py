"""The reply packets of a batch, read by pathlock's PyMySQL connections
themselves (``pathlock/dialects/_pymysql.py``), beside PyMySQL's own
``_read_packet()`` on the same bytes: the same payloads, the same errors, the
same state left behind (a connection closed where PyMySQL closes it). Over a
socket pair, so that every framing the protocol allows can be sent: a packet
of 16 MiB and more, a packet out of sequence, a peer that hangs up or never
answers, a server's error."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from pathlock import _deadlines as deadlines
from pathlock.dialects import _pymysql

_LONGEST = 2**24 - 1


def _packet(sequence: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "little") + bytes([sequence]) + payload


def _long(sequence: int, payload: bytes) -> bytes:
    """``payload`` (16 MiB or more) as the protocol splits it."""
    out = b""
    while True:
        part, payload = payload[:_LONGEST], payload[_LONGEST:]
        out += _packet(sequence, part)
        sequence += 1
        if len(part) < _LONGEST:
            return out


_OK = b"\x00\x01\x00\x02\x00\x00\x00"
_ERROR = b"\xff" + struct.pack("<H", 1062) + b"#23000Duplicate entry '1' for key 'PRIMARY'"

_STREAMS = {
    "one OK packet": _packet(1, _OK),
    "two packets": _packet(1, _OK) + _packet(2, _OK),
    "a server's error": _packet(1, _ERROR),
    "16 MiB less one byte": _packet(1, b"\x07" * (_LONGEST - 1)),
    "16 MiB exactly: an empty packet follows": _long(1, b"\x07" * _LONGEST),
    "over 16 MiB": _long(1, b"\x07" * (_LONGEST + 1000)),
    "out of sequence": _packet(5, _OK),
    "sequence 0: the server shutting down": _packet(0, _ERROR),
    "cut inside a header": _packet(1, _OK)[:3],
    "cut inside a payload": _packet(1, _OK)[:6],
    "nothing, then the peer hangs up": b"",
}


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def _connection(
    cls: type[pymysql.connections.Connection], sock: socket.socket, *, read_timeout: float = 5.0
) -> Any:
    """An instance of ``cls`` on ``sock``, as PyMySQL leaves one after
    connecting (its handshake skipped)."""
    connection = cls(host="127.0.0.1", defer_connect=True, read_timeout=read_timeout)
    connection._sock = sock
    sock.settimeout(connection._read_timeout)
    if "_current_timeout" in pymysql.connections.Connection.connect.__code__.co_names:
        connection._current_timeout = connection._read_timeout  # PyMySQL 1.2 and newer
    connection._rfile = sock.makefile("rb")
    connection._next_seq_id = 1
    connection.server_status = 0  # as the handshake leaves it on a default server
    return connection


def _outcome(read: Any, connection: Any, count: int) -> list[Any]:
    """What ``count`` calls of ``read`` gave or raised, and the state the
    connection was left in."""
    results: list[Any] = []
    for _ in range(count):
        try:
            results.append(bytes(read(connection)))
        except pymysql.err.MySQLError as error:
            results.append((type(error), error.args))
            break
    results.append(("closed", connection._sock is None, "next", connection._next_seq_id))
    return results


def _theirs(connection: Any) -> bytes:
    return connection._read_packet()._data  # type: ignore[no-any-return]


def _ours(connection: _pymysql.Connection) -> bytes:
    return connection._payload()


def _feed(theirs: socket.socket, data: bytes, *, piece: int | None = None) -> threading.Thread:
    """Send ``data`` at once, or ``piece`` bytes at a time, a moment apart
    (so that a reader gets headers and payloads cut anywhere); then hang up.
    A reader that closed its end (a packet out of sequence) ends the
    sending."""

    def send() -> None:
        if piece is None:
            theirs.sendall(data)
        else:
            for start in range(0, len(data), piece):
                try:
                    theirs.sendall(data[start : start + piece])
                except (BrokenPipeError, ConnectionResetError):
                    return
                time.sleep(0.001)
        theirs.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


_SHORT = [name for name, stream in _STREAMS.items() if len(stream) < 1000]


@pytest.mark.skipif(not _pymysql.DIRECT, reason="this PyMySQL lacks what the reader needs")
@pytest.mark.parametrize(
    ("stream", "piece"),
    [(name, None) for name in _STREAMS] + [(name, 3) for name in _SHORT],
    ids=list(_STREAMS) + [f"{name}, 3 bytes at a time" for name in _SHORT],
)
def test_packets_are_read_as_pymysql_reads_them(stream: str, piece: int | None) -> None:
    outcomes = []
    for cls, read in ((pymysql.connections.Connection, _theirs), (_pymysql.Connection, _ours)):
        ours, theirs = socket.socketpair()
        try:
            feeding = _feed(theirs, _STREAMS[stream], piece=piece)
            outcomes.append(_outcome(read, _connection(cls, ours), 3))
            feeding.join()
        finally:
            ours.close()
            theirs.close()
    assert outcomes[1] == outcomes[0]


@pytest.mark.skipif(not _pymysql.DIRECT, reason="this PyMySQL lacks what the reader needs")
def test_a_peer_that_never_answers_times_out_and_closes_the_connection(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, _theirs = pair
    connection = _connection(_pymysql.Connection, ours, read_timeout=0.05)
    with pytest.raises(pymysql.err.OperationalError) as lost:
        connection._payload()
    assert lost.value.args[0] == 2013
    assert "timed out" in lost.value.args[1]
    assert connection._sock is None


@pytest.mark.skipif(not _pymysql.DIRECT, reason="this PyMySQL lacks what the reader needs")
def test_the_socket_timeout_follows_the_time_left(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    connection = _connection(_pymysql.Connection, ours, read_timeout=30.0)
    theirs.sendall(_packet(1, _OK))

    def read(_limit: deadlines.Limit) -> float | None:
        connection._payload()
        return ours.gettimeout()

    timeout = deadlines.within(deadlines._monotonic() + 0.5, read)
    assert timeout is not None
    assert 0.0 < timeout <= 0.5
    # With no limit in force, the configured timeout again, for the next
    # wait (the second packet sent after the first was read).
    theirs.sendall(_packet(2, _OK))
    connection._payload()
    assert ours.gettimeout() == 30.0


_MORE = b"\x00\x01\x00\x0a\x00\x00\x00"  # an OK packet: more results follow (status 0x0008)


@pytest.mark.skipif(not _pymysql.DIRECT, reason="this PyMySQL lacks what the reader needs")
def test_the_replies_of_a_batch_received_together_are_read_one_by_one(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    connection = _connection(_pymysql.Connection, ours)
    connection._pathlock_pending = True
    theirs.sendall(_packet(1, _MORE) + _packet(2, _MORE) + _packet(3, _OK))
    assert [connection.reply() for _ in range(3)] == [(1, 0, None, [])] * 3
    assert not connection._pathlock_pending
    assert connection._sock is not None
    # The next command's reply, sent after the batch's were read.
    connection._next_seq_id = 1
    theirs.sendall(_packet(1, _OK))
    assert connection.reply() == (1, 0, None, [])
    assert connection._sock is not None


@pytest.mark.skipif(not _pymysql.DIRECT, reason="this PyMySQL lacks what the reader needs")
def test_bytes_after_the_last_reply_close_the_connection(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    connection = _connection(_pymysql.Connection, ours)
    # The reply, then what MariaDB sends unasked when it shuts down.
    theirs.sendall(_packet(1, _OK) + _packet(0, _ERROR))
    assert connection.reply() == (1, 0, None, [])
    # Not left to answer the next query.
    assert connection._sock is None
    assert not connection._pathlock_pending

"""The replies of a batch, read without a cursor on the PyMySQL connections
pathlock creates (``pathlock/dialects/_pymysql.py``): every size of count and
id the protocol encodes, rows of every type as PyMySQL's cursor reads them, a
statement refused in the middle, and interrupts between and inside replies,
against the server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pymysql.cursors
import pymysql.err
import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError

from pathlock import PathLockManager
from pathlock import _batch as batch
from pathlock.dialects import _pymysql

_metadata = MetaData()
_rows = Table(
    "direct_replies",
    _metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("n", BigInteger, nullable=False),
    Column("word", String(200), nullable=False, server_default=""),
)
_SIZES = [0, 250, 251, 2**16 - 1, 2**16, 2**24 - 1, 2**24, 2**40, 2**62]


@pytest.fixture
def connection(mariadb_url: str) -> Iterator[Connection]:
    """A connection of an engine pathlock created, beside a scratch table
    of 300 rows."""
    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        with manager.engine.begin() as setup:
            _metadata.drop_all(setup)
            _metadata.create_all(setup)
            setup.execute(insert(_rows), [{"n": number} for number in range(300)])
        with manager.engine.connect() as connection:
            assert isinstance(connection.connection.dbapi_connection, _pymysql.Connection)
            yield connection
            connection.rollback()
        with manager.engine.begin() as cleanup:
            _metadata.drop_all(cleanup)


def _given(number: int) -> Any:
    """A statement that matches one row and gives LAST_INSERT_ID() the
    value ``:v<number>``."""
    return (
        update(_rows)
        .where(_rows.c.id == 1)
        .values(n=func.last_insert_id(bindparam(f"v{number}", type_=BigInteger)))
    )


def _count(connection: Connection) -> int:
    return int(connection.execute(select(func.count()).select_from(_rows)).scalar_one())


def test_counts_and_ids_of_every_size_are_read(connection: Connection) -> None:
    steps = [(_given(number), {f"v{number}": value}) for number, value in enumerate(_SIZES)]
    steps.append((delete(_rows).where(_rows.c.n >= 0), {}))  # 300 rows
    replies = batch.run(connection, steps, rollback=True)
    assert [reply.lastrowid for reply in replies[:-1]] == _SIZES
    assert [reply.rowcount for reply in replies[:-1]] == [1] * len(_SIZES)
    assert replies[-1].rowcount == 300
    assert _count(connection) == 300  # rolled back
    connection.rollback()


@pytest.mark.parametrize("backslashes", ["escapes", "NO_BACKSLASH_ESCAPES"])
def test_text_arrives_as_given(connection: Connection, backslashes: str) -> None:
    """Escaped as PyMySQL escapes it, in either mode of the server's."""
    if backslashes == "NO_BACKSLASH_ESCAPES":
        mode = "CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')"
        connection.execute(text(f"SET SESSION sql_mode = {mode}"))
    word = "it's a \\ path\n\x00\x1a\"' OR 1=1 -- ü/€"
    written = update(_rows).where(_rows.c.id == 1).values(word=bindparam("w", type_=String))
    replies = batch.run(connection, [(written, {"w": word})], commit=True)
    assert replies[0].rowcount == 1
    read = select(_rows.c.word).where(_rows.c.id == 1)
    assert connection.execute(read).scalar_one() == word
    connection.rollback()


def test_null_and_truth_values_arrive_as_given(connection: Connection) -> None:
    """``None``, ``True`` and ``False`` escaped without PyMySQL's encoders
    read back as its cursor would have written them."""
    given = {"yes": True, "no": False, "none": None, "number": -7}
    read = select(
        *(bindparam(name, type_=None).label(name) for name in given),
        (bindparam("none", type_=None).is_(None)).label("is_null"),
    )
    replies = batch.run(connection, [(read, given)], commit=False)
    assert [tuple(row) for row in replies[0].rows] == [(1, 0, None, -7, 1)]
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    cursor.execute("SELECT %s, %s, %s, %s, %s IS NULL", (True, False, None, -7, None))
    assert [tuple(row) for row in replies[0].rows] == [tuple(cursor.fetchone())]


_TYPES = """
CREATE TABLE direct_types (
    id INT PRIMARY KEY, big BIGINT, small SMALLINT, flag TINYINT(1), price DECIMAL(12, 3),
    ratio DOUBLE, word VARCHAR(100) CHARACTER SET utf8mb4, raw VARBINARY(50),
    long_text MEDIUMTEXT, long_blob MEDIUMBLOB, at DATETIME(6), day DATE, took TIME(3),
    doc JSON, bits BIT(8), choice ENUM('a', 'b')
)"""


def test_rows_are_read_as_pymysqls_cursor_reads_them(connection: Connection) -> None:
    connection.execute(text("DROP TABLE IF EXISTS direct_types"))
    connection.execute(text(_TYPES))
    try:
        connection.execute(
            text(
                "INSERT INTO direct_types VALUES "
                "(1, -9223372036854775808, -3, 1, 12345.678, 0.25, 'ü€ it''s', X'00FF',"
                " REPEAT('x', 70000), REPEAT(X'01', 300), '2026-11-27 22:21:03.123456',"
                " '2026-11-27', '-12:34:56.789', '{\"a\": [1, 2]}', b'10100101', 'b'),"
                "(2, 9223372036854775807, NULL, NULL, NULL, NULL, '', '', '', '', NULL,"
                " NULL, NULL, NULL, NULL, NULL),"
                "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
                " NULL, NULL, NULL, NULL, NULL)"
            )
        )
        connection.commit()
        every = text("SELECT * FROM direct_types ORDER BY id")
        computed = text(
            "SELECT COUNT(*) AS n, MAX(big) AS top, NOW(6) > at AS past,"
            " CONCAT(word, '!') AS said FROM direct_types WHERE id = 1"
        )
        written = update(_rows).where(_rows.c.id == 1).values(n=5)
        replies = batch.run(connection, [(every, {}), (written, {}), (computed, {})])
        connection.rollback()
        dbapi_connection = connection.connection.dbapi_connection
        for statement, reply in ((every, replies[0]), (computed, replies[2])):
            cursor = pymysql.cursors.Cursor(dbapi_connection)
            cursor.execute(str(statement))
            names = [column[0] for column in cursor.description]
            expected = cursor.fetchall()
            cursor.close()
            assert [row._fields for row in reply.rows] == [tuple(names)] * len(expected)
            assert [tuple(row) for row in reply.rows] == list(expected)
            assert reply.rowcount == len(expected)
            assert reply.lastrowid is None
        assert replies[1].rowcount == 1
        assert len(replies[0].rows[0].long_text) == 70000
        connection.rollback()
    finally:
        connection.execute(text("DROP TABLE IF EXISTS direct_types"))


def test_no_cursor_reads_an_uncontended_acquire_and_release(
    mariadb_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[object] = []
    nextset = pymysql.cursors.Cursor.nextset

    def counted(self: pymysql.cursors.Cursor) -> Any:
        read.append(self)
        return nextset(self)

    with PathLockManager(mariadb_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        locks.lock_paths("/warm").release()
        monkeypatch.setattr(pymysql.cursors.Cursor, "nextset", counted)
        lease = locks.lock_paths("/a")
        lease.release()
        assert read == []
        assert lease.released


def test_a_statement_refused_in_the_middle_leaves_the_connection_in_step(
    connection: Connection,
) -> None:
    duplicate = insert(_rows).values(id=bindparam("row", type_=Integer), n=0)
    steps = [(delete(_rows).where(_rows.c.id > 1), {}), (duplicate, {"row": 1})]
    with pytest.raises(DBAPIError) as refused:
        batch.run(connection, steps, commit=True)
    assert isinstance(refused.value.orig, pymysql.err.IntegrityError)
    assert refused.value.orig.args[0] == 1062
    assert not refused.value.connection_invalidated
    # The statement before it ran, the COMMIT did not: nothing is left to
    # read, and the next query gets its own reply.
    assert _count(connection) == 1
    connection.rollback()
    assert _count(connection) == 300


def _interrupted(
    connection: Connection, monkeypatch: pytest.MonkeyPatch, method: str, replacement: Any
) -> _pymysql.Connection:
    """Run a batch of three statements with ``method`` of the connection
    replaced by ``replacement`` (which raises KeyboardInterrupt), then put it
    back; the DB-API connection the batch ran on."""
    monkeypatch.setattr(_pymysql.Connection, method, replacement)
    steps = [(_given(number), {f"v{number}": 7}) for number in range(3)]
    with pytest.raises(KeyboardInterrupt):
        batch.run(connection, steps, rollback=True)
    monkeypatch.undo()
    dbapi_connection = connection.connection.dbapi_connection
    assert isinstance(dbapi_connection, _pymysql.Connection)
    return dbapi_connection


def test_an_interrupt_between_replies_leaves_the_rest_read(
    connection: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = _pymysql.Connection.reply
    calls: list[int] = []

    def interrupted(self: _pymysql.Connection) -> _pymysql.Reply:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return read(self)

    dbapi_connection = _interrupted(connection, monkeypatch, "reply", interrupted)
    assert not dbapi_connection._pathlock_pending
    # The rest of the replies were read: the next query gets its own.
    assert connection.execute(text("SELECT 12345")).scalar_one() == 12345


def test_an_interrupt_inside_a_reply_closes_the_connection(
    connection: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    dbapi_connection = connection.connection.dbapi_connection
    assert isinstance(dbapi_connection, _pymysql.Connection)
    reads: list[int] = []

    class Interrupted:
        """The connection's socket, receiving a few bytes at a time (the
        replies cut anywhere), interrupted at its third receive: inside the
        first reply or the second, never at the end of one."""

        def __init__(self, sock: Any) -> None:
            self.sock = sock

        def recv(self, count: int) -> bytes:
            reads.append(count)
            if len(reads) == 3:
                raise KeyboardInterrupt
            return bytes(self.sock.recv(5))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    monkeypatch.setattr(dbapi_connection, "_sock", Interrupted(dbapi_connection._sock))
    steps = [(_given(number), {f"v{number}": 7}) for number in range(3)]
    with pytest.raises(KeyboardInterrupt):
        batch.run(connection, steps, rollback=True)
    assert len(reads) == 3
    # What follows on the socket is not a reply to anything sent next.
    assert dbapi_connection._sock is None
    assert dbapi_connection._rfile is None
    with pytest.raises(DBAPIError) as closed:
        connection.execute(text("SELECT 1"))
    assert closed.value.connection_invalidated

"""Statements that travel several to a query on PostgreSQL, on a real server:
each replies as MySQL's do (its row count, the id it generated or the value
``Fenced`` handed back), tells the next one what it changed and generated,
and a batch that fails in the middle leaves nothing behind. The locking
suites run over these batches through the ``database_url`` fixture; here is
what they rest on."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    event,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError

from pathlock import AsyncPathLockManager, PathLockManager
from pathlock import _batch as batch
from pathlock.dialects import Changed, Fenced, InsertedId

_IDLE = psycopg.pq.TransactionStatus.IDLE
_metadata = MetaData()
_items = Table(
    "pl_batch_items",
    _metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("v", Integer, nullable=False),
)


@pytest.fixture
def engine(postgresql_url: str) -> Iterator[Engine]:
    """An engine pathlock made (its connections send batches), and a table
    of its own."""
    with PathLockManager(postgresql_url, heartbeat=False) as manager:
        engine = manager.engine
        _metadata.drop_all(engine)
        _metadata.create_all(engine)
        try:
            yield engine
        finally:
            _metadata.drop_all(engine)


def test_each_statement_replies_and_tells_the_next_what_it_changed(engine: Engine) -> None:
    # Values written into the SQL: parameters of one name must have one value
    # across a batch.
    one = insert(_items).values(v=literal_column("1"))  # one row: its key returned
    two = insert(_items).from_select(
        ["v"], select(literal_column("2")).union_all(select(literal_column("3")))
    )
    told = select(Changed().label("changed"), InsertedId().label("inserted"))
    fenced = (
        update(_items)
        .where(_items.c.v == literal_column("1"))
        .values(v=Fenced(_items.c.v + literal_column("10")))
    )
    nothing = update(_items).where(_items.c.v < literal_column("0")).values(v=literal_column("0"))
    counted = select(Changed().label("changed"))
    with engine.connect() as connection:
        assert engine.dialect.name == "postgresql"
        assert batch.commits_in_batches(connection)
        replies = batch.run(
            connection,
            [
                (one, {}),
                (two, {}),
                (told, {}),
                (fenced, {}),
                (select(InsertedId().label("inserted")), {}),
                (nothing, {}),
                (counted, {}),
            ],
            commit=True,
        )
        assert not connection.in_transaction()
        ids = connection.execute(select(_items.c.id).order_by(_items.c.id)).scalars().all()
        connection.rollback()
    first, second, _third = ids
    inserted_one, inserted_two, read, wrote, read_fenced, wrote_none, read_none = replies
    assert (inserted_one.rowcount, inserted_one.lastrowid) == (1, first)
    # Several rows: the first id generated, as MySQL's LAST_INSERT_ID().
    assert (inserted_two.rowcount, inserted_two.lastrowid) == (2, second)
    assert [tuple(row) for row in read.rows] == [(2, second)]
    assert (wrote.rowcount, wrote.lastrowid) == (1, 11)
    assert [tuple(row) for row in read_fenced.rows] == [(11,)]
    assert (wrote_none.rowcount, wrote_none.lastrowid) == (0, 0)
    assert [tuple(row) for row in read_none.rows] == [(0,)]


def test_a_batch_that_fails_in_the_middle_leaves_nothing(engine: Engine) -> None:
    fails = select(literal_column("1") / literal_column("0"))
    with engine.connect() as connection:
        with pytest.raises(DBAPIError, match="division by zero"):
            batch.run(connection, [(insert(_items).values(v=1), {}), (fails, {})], commit=True)
        connection.rollback()
        # The connection goes on: nothing of the batch was kept...
        assert connection.execute(select(_items.c.v)).all() == []
        connection.rollback()
        # ... but the statements it prepared before the one that failed: they
        # are executed, not prepared twice (which the server refuses).
        (reply,) = batch.run(connection, [(insert(_items).values(v=2), {})], commit=True)
        assert reply.rowcount == 1
        assert connection.execute(select(_items.c.v)).scalars().all() == [2]
        connection.rollback()


def test_a_batch_inside_a_transaction_keeps_it_open(engine: Engine) -> None:
    with engine.connect() as connection:
        (reply,) = batch.run(connection, [(insert(_items).values(v=5), {})])
        assert reply.rowcount == 1
        assert connection.in_transaction()
        connection.rollback()
        assert connection.execute(select(_items.c.v)).all() == []
        connection.rollback()


def test_an_acquire_and_its_release_are_two_queries(postgresql_url: str, customer_id: int) -> None:
    """Each with its COMMIT, and no BEGIN of their own (psycopg would send
    one in a round trip of its own)."""
    sent: list[str] = []
    with PathLockManager(postgresql_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        with locks.lock_paths("/warm"):
            pass
        from pathlock.dialects import _psycopg  # noqa: PLC0415 - an extra

        connection_class = _psycopg.BoundedConnection
        send = connection_class.send_batch

        def send_batch(self: _psycopg.BoundedConnection, sql: str, parameters: object) -> None:
            sent.append(sql)
            send(self, sql, parameters)  # type: ignore[arg-type]

        def one_by_one(*args: object) -> None:
            sent.append(str(args[2]))

        # psycopg's own BEGIN, sent before a query outside a transaction.
        start_query = psycopg.Connection._start_query

        def begin(self: psycopg.Connection[Any]) -> Any:
            if not self.autocommit and self.pgconn.transaction_status == _IDLE:
                sent.append("psycopg's BEGIN")
            return (yield from start_query(self))

        event.listen(manager.engine, "before_cursor_execute", one_by_one)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(connection_class, "send_batch", send_batch)
            patch.setattr(psycopg.Connection, "_start_query", begin)
            with locks.lock_paths("/a/b"):
                pass
        event.remove(manager.engine, "before_cursor_execute", one_by_one)
    assert len(sent) == 2, sent
    assert all(re.search(r";\nCOMMIT$", sql) for sql in sent), sent


def test_the_asyncio_apis_acquire_and_release_are_two_queries_too(
    postgresql_url: str, customer_id: int
) -> None:
    """Its connections send batches as the synchronous API's do."""
    from pathlock.dialects import _psycopg  # noqa: PLC0415 - an extra

    sent: list[str] = []
    connection_class = _psycopg.BoundedAsyncConnection
    send = connection_class.send_batch
    start_query = psycopg.AsyncConnection._start_query

    def send_batch(self: _psycopg.BoundedAsyncConnection, sql: str, parameters: object) -> None:
        sent.append(sql)
        send(self, sql, parameters)  # type: ignore[arg-type]

    def begin(self: psycopg.AsyncConnection[Any]) -> Any:
        if not self.autocommit and self.pgconn.transaction_status == _IDLE:
            sent.append("psycopg's BEGIN")
        return (yield from start_query(self))

    def one_by_one(*args: object) -> None:
        sent.append(str(args[2]))

    async def run() -> None:
        async with AsyncPathLockManager(postgresql_url, heartbeat=False) as manager:
            locks = manager.for_customer(customer_id)
            async with locks.lock_paths("/warm"):
                pass
            engine = manager._core.engine  # its synchronous face
            event.listen(engine, "before_cursor_execute", one_by_one)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(connection_class, "send_batch", send_batch)
                patch.setattr(psycopg.AsyncConnection, "_start_query", begin)
                async with locks.lock_paths("/a/b"):
                    pass
            event.remove(engine, "before_cursor_execute", one_by_one)

    asyncio.run(run())
    assert len(sent) == 2, sent
    assert all(re.search(r";\nCOMMIT$", sql) for sql in sent), sent


def test_the_batches_prepared_statements_outlive_rollbacks(engine: Engine) -> None:
    """psycopg's own prepared statements (a statement run five times) would
    drop every prepared statement of the session at the next ROLLBACK, the
    batches' too: pathlock's connections make none."""
    with engine.connect() as connection:
        (first,) = batch.run(connection, [(insert(_items).values(v=1), {})], commit=True)
        for _ in range(8):
            assert connection.execute(select(_items.c.v)).scalars().all() == [1]
        connection.rollback()
        (second,) = batch.run(connection, [(insert(_items).values(v=2), {})], commit=True)
        assert (first.rowcount, second.rowcount) == (1, 1)

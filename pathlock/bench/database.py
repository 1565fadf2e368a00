"""What the benchmarks do to the database besides locking: the floor and
its scratch table, bulk rows, clean-up, round trips and the server's CPU, and
the server's description."""

from __future__ import annotations

import inspect
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, bindparam, create_engine, delete, insert, select, text
from sqlalchemy.engine.default import DefaultDialect

from pathlock._statements.common import now
from pathlock.bench import BenchError
from pathlock.schema import customer_locks, path_lock_waiters, path_locks
from pathlock.types import EXCLUSIVE

FLOOR_TABLE = "pathlock_bench_floor"
BULK_NODE = "pathlock-bench-bulk"

# One INSERT ... SELECT (or executemany) per chunk: transactions stay moderate.
_INSERT_CHUNK = 100_000
_EXECUTEMANY_CHUNK = 10_000
# Rows per DELETE when cleaning up, so a big clean-up never stalls the server.
_DELETE_CHUNK = 10_000
# Random customer ids leave room for a block of consecutive ids above them.
_CUSTOMER_ID_SPACE = 2**62

_FLOOR_ROWS = {
    "postgresql": text(f"INSERT INTO {FLOOR_TABLE} (id) VALUES (:k) ON CONFLICT DO NOTHING"),
    "mysql": text(f"INSERT IGNORE INTO {FLOOR_TABLE} (id) VALUES (:k)"),
}
_FLOOR_BUMP = text(f"UPDATE {FLOOR_TABLE} SET n = n + 1 WHERE id = :k")
# SQLAlchemy 2.0.43 and later can leave out the ROLLBACK a Connection sends
# when it closes, which an autocommit connection has no use for.
_SKIPS_AUTOCOMMIT_ROLLBACK = (
    "skip_autocommit_rollback" in inspect.signature(DefaultDialect.__init__).parameters
)


def floor_engine(url: str | URL) -> Engine:
    """An engine for :class:`Floor` over ``url`` (the same server and driver
    as the others): every statement is its own durable commit (autocommit),
    and nothing else is sent, neither when a connection goes back to the pool
    nor when a :class:`~sqlalchemy.Connection` closes its (empty) transaction,
    where SQLAlchemy supports skipping that ROLLBACK (2.0.43 and later; before,
    the floor's round trips, which the benchmark counts, say so)."""
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None}
    if _SKIPS_AUTOCOMMIT_ROLLBACK:
        options["skip_autocommit_rollback"] = True
    return create_engine(url, **options)


class Floor:
    """The floor of an acquire + release: two single-row durable commits,
    each one round trip. ``acquire`` and ``release`` are each one autocommit
    ``UPDATE ... SET n = n + 1 WHERE id = :k`` of the floor's own row of the
    scratch table (:func:`create_floor_table`; the row is inserted here if it
    is missing), on an engine of :func:`floor_engine`. They mirror a lock's
    so the same loops time both.

    ``key`` is the row's id: a random one by default; floors that run at once
    (one per worker process) each take a key of their own, so none waits for
    another's row lock."""

    def __init__(self, engine: Engine, key: int | None = None) -> None:
        self.engine = engine
        self.key = secrets.randbelow(_CUSTOMER_ID_SPACE) + 1 if key is None else key
        with engine.connect() as connection:
            if not engine.dialect.detect_autocommit_setting(
                connection.connection.dbapi_connection  # type: ignore[arg-type]
            ):
                raise BenchError("the floor needs an autocommit engine: see floor_engine()")
            row = _FLOOR_ROWS["postgresql" if _postgresql(engine) else "mysql"]
            connection.execute(row, {"k": self.key})

    def acquire(self, _path: str, _timeout: float) -> int:
        with self.engine.connect() as connection:
            connection.execute(_FLOOR_BUMP, {"k": self.key})
        return self.key

    def release(self, key: int) -> None:
        with self.engine.connect() as connection:
            connection.execute(_FLOOR_BUMP, {"k": key})


def create_floor_table(engine: Engine) -> None:
    """The floor's scratch table, afresh (a table of that name is the
    benchmark's own, left by a run that was killed)."""
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {FLOOR_TABLE}"))
        connection.execute(
            text(
                f"CREATE TABLE {FLOOR_TABLE} "
                "(id BIGINT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)"
                + ("" if _postgresql(engine) else " ENGINE=InnoDB")
            )
        )


def drop_floor_table(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(text(f"DROP TABLE IF EXISTS {FLOOR_TABLE}"))


def round_trips(operation: Callable[[], None], cycles: int, driver: str = "pymysql") -> float:
    """Round trips per call of ``operation``, over ``cycles`` calls: the
    exchanges with the server the ``driver`` (``pymysql`` or ``psycopg``)
    makes from this thread meanwhile (a query of several statements is one).
    Other threads' exchanges, a heartbeat's say, are not counted. The count
    is taken by wrapping the driver's one method that makes an exchange (a
    PyMySQL command; a psycopg connection's wait for the server), for the
    duration of the calls only."""
    thread = threading.get_ident()
    owner, name = _EXCHANGES[driver]()
    exchange = getattr(owner, name)
    made = 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal made
        if threading.get_ident() == thread:
            made += 1
        return exchange(*args, **kwargs)

    setattr(owner, name, counted)
    try:
        for _ in range(cycles):
            operation()
    finally:
        setattr(owner, name, exchange)
    return made / cycles


def _pymysql_exchange() -> tuple[type, str]:
    import pymysql.connections  # noqa: PLC0415 - the driver measured

    return pymysql.connections.Connection, "_execute_command"


def _psycopg_exchange() -> tuple[type, str]:
    import psycopg  # noqa: PLC0415 - the driver measured

    # Every exchange of a synchronous connection (a query, BEGIN, COMMIT,
    # ROLLBACK) is one call of wait(); connecting is not.
    return psycopg.Connection, "wait"


_EXCHANGES: dict[str, Callable[[], tuple[type, str]]] = {
    "pymysql": _pymysql_exchange,
    "psycopg": _psycopg_exchange,
}
COUNTED_DRIVERS = frozenset(_EXCHANGES)
"""The drivers whose round trips :func:`round_trips` counts."""


def _postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


@dataclass(frozen=True, slots=True)
class Server:
    """The server the benchmarks measure."""

    name: str
    """``MariaDB``, ``MySQL`` or ``PostgreSQL``."""
    version: str
    durability: tuple[str, str]
    """The setting that says when a commit is durable, and its value
    (``innodb_flush_log_at_trx_commit``; ``synchronous_commit``)."""
    processes: tuple[str, ...]
    """The names of its processes (``/proc/*/comm``), whose CPU is its."""
    port: int

    @property
    def mariadb(self) -> bool:
        return self.name == "MariaDB"


def server_cpu_seconds(server: Server) -> float | None:
    """CPU seconds the database server's processes have used, if it runs on
    this machine and /proc shows them (Linux); ``None`` otherwise. With
    several server processes, their sum, with what their children that ended
    used (PostgreSQL's backends of closed connections, counted by the
    postmaster once it has reaped them)."""
    proc = Path("/proc")
    total, found = 0.0, False
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() not in server.processes:
                    continue
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone, or not ours to read
            # utime + stime + cutime + cstime
            total += sum(int(field) for field in fields[11:15]) / ticks
            found = True
    except (OSError, ValueError):
        return None
    return total if found else None


def describe_server(engine: Engine) -> Server:
    with engine.connect() as connection:
        version = str(connection.execute(text("SELECT VERSION()")).scalar_one())
        if _postgresql(engine):
            setting = "synchronous_commit"
            value = connection.execute(text("SHOW synchronous_commit")).scalar_one()
            name, port = "PostgreSQL", 5432
            processes: tuple[str, ...] = ("postgres",)
            # Its version string goes on with the platform, after " on ".
            version = version.split(" on ", maxsplit=1)[0].removeprefix("PostgreSQL ")
        else:
            setting = "innodb_flush_log_at_trx_commit"
            value = connection.execute(text(f"SELECT @@{setting}")).scalar_one()
            mariadb = bool(getattr(engine.dialect, "is_mariadb", False))
            name = "MariaDB" if mariadb else "MySQL"
            processes, port = ("mariadbd", "mysqld"), 3306
    return Server(name, version, (setting, str(value)), processes, engine.url.port or port)


def fresh_customers(count: int) -> range:
    """``count`` consecutive customer ids no test or earlier run has used
    (random, in a space of 2**62)."""
    first = secrets.randbelow(_CUSTOMER_ID_SPACE) + 1
    return range(first, first + count)


def delete_customers(engine: Engine, customers: range) -> None:
    """Delete every row of ``customers``: locks (in chunks), waiters and
    sentinels. The benchmarks' ids are random and never reused, so deleting
    the sentinels cannot make a fencing token go back for anyone."""
    in_range = path_locks.c.customer_id.between(customers.start, customers.stop - 1)
    chunk = select(path_locks.c.id).where(in_range).limit(_DELETE_CHUNK)
    while True:
        with engine.begin() as connection:
            ids = list(connection.execute(chunk).scalars())
            if ids:
                connection.execute(delete(path_locks).where(path_locks.c.id.in_(ids)))
        if len(ids) < _DELETE_CHUNK:
            break
    with engine.begin() as connection:
        connection.execute(
            delete(path_lock_waiters).where(
                path_lock_waiters.c.customer_id.between(customers.start, customers.stop - 1)
            )
        )
        connection.execute(
            delete(customer_locks).where(
                customer_locks.c.customer_id.between(customers.start, customers.stop - 1)
            )
        )


@contextmanager
def customers_of(engine: Engine, count: int) -> Iterator[range]:
    """Fresh customer ids for one experiment; their rows are deleted afterwards."""
    customers = fresh_customers(count)
    try:
        yield customers
    finally:
        delete_customers(engine, customers)


def insert_bulk_rows(
    engine: Engine, customers: range, rows: int, *, expires_in: timedelta, prefix: str
) -> None:
    """Insert ``rows`` exclusive locks spread over ``customers``, at paths
    ``{prefix}{n % 1000}/{n}``, expiring ``expires_in`` from now (negative:
    already expired), a microsecond apart. MariaDB generates them on the
    server (its SEQUENCE engine's ``seq_1_to_N`` tables); other servers get
    them by executemany in chunks. The customers must have no sentinel row
    yet: its first grant makes it and counts the rows it finds (these rows
    are not counted here)."""
    if getattr(engine.dialect, "is_mariadb", False):
        _insert_from_sequence(engine, customers, rows, expires_in=expires_in, prefix=prefix)
    else:
        _insert_many(engine, customers, rows, expires_in=expires_in, prefix=prefix)


def _insert_from_sequence(
    engine: Engine, customers: range, rows: int, *, expires_in: timedelta, prefix: str
) -> None:
    for start in range(1, rows + 1, _INSERT_CHUNK):
        stop = min(rows, start + _INSERT_CHUNK - 1)
        # The table name holds two integers we computed: nothing to escape.
        statement = text(
            "INSERT INTO path_locks (customer_id, lease_id, path, mode, node_id, pid, thread, "
            "reason, fencing_token, created_at, expires_at) "
            "SELECT :first + seq MOD :count, CONCAT('bulk', LPAD(seq, 28, '0')), "
            "CONCAT(:prefix, seq MOD 1000, '/', seq), :mode, :node, 0, 'bulk', '', 1, "
            "UTC_TIMESTAMP(6) - INTERVAL 1 DAY, "
            # seq is unsigned: a negative shift needs it signed.
            "TIMESTAMPADD(MICROSECOND, :shift + CAST(seq AS SIGNED), UTC_TIMESTAMP(6)) "
            f"FROM seq_{start}_to_{stop}"
        )
        with engine.begin() as connection:
            connection.execute(
                statement,
                {
                    "first": customers.start,
                    "count": len(customers),
                    "prefix": prefix,
                    "mode": EXCLUSIVE,
                    "node": BULK_NODE,
                    "shift": round(expires_in / timedelta(microseconds=1)),
                },
            )


def _insert_many(
    engine: Engine, customers: range, rows: int, *, expires_in: timedelta, prefix: str
) -> None:
    with engine.connect() as connection:
        base = connection.execute(select(now())).scalar_one()
        connection.rollback()
    statement = insert(path_locks).values(
        customer_id=bindparam("c_id"),
        lease_id=bindparam("l_id"),
        path=bindparam("path"),
        mode=EXCLUSIVE,
        node_id=BULK_NODE,
        pid=0,
        thread="bulk",
        reason="",
        fencing_token=1,
        created_at=base - timedelta(days=1),
        expires_at=bindparam("expires"),
    )
    for start in range(1, rows + 1, _EXECUTEMANY_CHUNK):
        batch = [
            {
                "c_id": customers.start + n % len(customers),
                "l_id": f"bulk{n:028d}",
                "path": f"{prefix}{n % 1000}/{n}",
                "expires": base + expires_in + timedelta(microseconds=n),
            }
            for n in range(start, min(rows, start + _EXECUTEMANY_CHUNK - 1) + 1)
        ]
        with engine.begin() as connection:
            connection.execute(statement, batch)

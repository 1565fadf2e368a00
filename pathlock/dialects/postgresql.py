"""PostgreSQL, over psycopg (version 3): ``pip install 'pathlock[postgresql]'``."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import operator
import os
import re
import socket
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    URL,
    BigInteger,
    Boolean,
    Connection,
    DateTime,
    Engine,
    Integer,
    LargeBinary,
    String,
    and_,
    bindparam,
    event,
    func,
    literal_column,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.exc import DBAPIError, InvalidRequestError, OperationalError, SQLAlchemyError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql.compiler import DDLCompiler, SQLCompiler
from sqlalchemy.types import TypeDecorator, TypeEngine

from pathlock import _interrupts as interrupts
from pathlock.dialects._commits import commit_in_batches
from pathlock.dialects._pg_batches import BATCH_REPLY, PREPARED
from pathlock.dialects._pg_notices import CHANNEL, listening
from pathlock.dialects.base import (
    BATCHED,
    CHANGED_ROWS,
    INSERTED_ID,
    ISOLATION_LEVEL,
    SERVER_SESSION,
    Bytes,
    Changed,
    Dialect,
    Fenced,
    InGrantTime,
    InsertedId,
    JsonArray,
    MicrosecondsLeft,
    Notice,
    Now,
    NowPlus,
    PathIn,
    PathIs,
    PathWithin,
    ServerSession,
    SetGrantUntil,
    WaitedInTime,
    is_async,
    new_engine,
    path_within,
)
from pathlock.errors import BackendError
from pathlock.paths import MAX_PATH_LENGTH
from pathlock.waiting import Hearing

if TYPE_CHECKING:
    from sqlalchemy.engine import CursorResult

    from pathlock.settings import Settings

log = logging.getLogger("pathlock.store")

# SQLSTATE codes (psycopg's errors carry them as .sqlstate).
_SERIALIZATION_FAILURE = "40001"
_DEADLOCK = "40P01"
_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out
_QUERY_CANCELED = "57014"  # statement_timeout ran out
_UNDEFINED_TABLE = "42P01"
_DUPLICATE_TABLE = "42P07"
_UNIQUE_VIOLATION = "23505"
# A session without the statements its connection prepared, or with one it
# did not: behind a pooler in transaction mode.
_DUPLICATE_PREPARED = "42P05"
_NO_SUCH_PREPARED = "26000"
# Class 08 (connection exceptions) and 57P01-57P03 (the server shutting down,
# crashed, or not yet accepting connections).
_NODE_GONE = frozenset({"57P01", "57P02", "57P03"})
_TRANSIENT = frozenset(
    {_SERIALIZATION_FAILURE, _DEADLOCK, _LOCK_NOT_AVAILABLE, _QUERY_CANCELED} | _NODE_GONE
)

# The time at which the statement started, in UTC, as a TIMESTAMP WITHOUT
# TIME ZONE (the columns' type): one value per statement, as MySQL's
# UTC_TIMESTAMP(6) is, whatever the session's time zone.
_NOW = "(statement_timestamp() AT TIME ZONE 'UTC')"

# Paths compare code point by code point, trailing spaces included: the "C"
# collation (byte order of UTF-8, which is code point order).
PATH_COLLATION = "C"

# A B-tree entry holds at most 2,704 bytes, and a path 4,000 characters (up
# to 16,000 bytes in UTF-8): the path index holds the first 600 characters of
# each path (2,400 bytes at most), ``left(path, 600)``, as MySQL's holds a
# prefix of 700. Every lookup names that expression (PathIn, PathIs and
# PathWithin below), so the planner finds the index; the full comparison
# follows on the rows it narrows to. Cutting two paths at the same length
# keeps their order (in code point order, a <= b gives left(a, n) <=
# left(b, n)): a range of paths lies inside the range of their prefixes.
PATH_KEY_LENGTH = 600

# The first lines of the SQL printed for PostgreSQL (--sql). It works there
# alone: given to MySQL or MariaDB, its first CREATE TABLEs went through and
# left two tables of the wrong server's kind before BIGSERIAL failed. The SET
# of a setting of pathlock's own is a session's, so it changes nothing on
# PostgreSQL; MySQL and MariaDB know no such variable, and their client stops
# there (MariaDB's shows the statement, and so its value, with the error).
_SQL_HEADER = """\
-- pathlock's tables, for PostgreSQL. For MySQL 8.0 or MariaDB 10.5, print them with
-- --dialect mysql or --dialect mariadb.
-- The first statement stops this script on MySQL and MariaDB, before it creates anything.
SET pathlock.this_sql_is_for =
    'PostgreSQL: print the SQL for MySQL or MariaDB with --dialect mysql or --dialect mariadb';"""


NOT_IN_FORCE = "pathlock's session settings are not in force"
"""How the error of a connection whose startup options never reached the
server begins."""
POOLED_HINT = (
    "pathlock needs each of its connections to keep one server session, with the settings "
    "and prepared statements it gave it: connect it to PostgreSQL itself, or through a "
    "pooler in session mode that passes the `options` startup parameter on, not through a "
    "pooler in transaction or statement mode (PgBouncer's); see docs/DEPLOYING.md"
)

# What the server answers a connection it refuses for good (libpq passes its
# FATAL on as text, without a SQLSTATE): no retry can cure these.
_REFUSED = re.compile(
    r"FATAL:\s+(?:role \S+ does not exist|database \S+ does not exist"
    r"|password authentication failed|permission denied|no pg_hba\.conf entry"
    r"|\w+ authentication failed|unsupported startup parameter)"  # the last: PgBouncer's
    r"|" + re.escape(NOT_IN_FORCE)
)


def _connection_failed(error: DBAPIError) -> bool:
    """The connection could not be made, or was lost, or timed out: psycopg
    raises these as OperationalError without a SQLSTATE (the server said
    nothing), as PyMySQL raises 2003, 2006 and 2013. Not a connection the
    server refused for good (an unknown role or database, a password or
    privilege it does not accept), which was retried to no end."""
    return (
        isinstance(error, OperationalError)
        and _sqlstate(error) is None
        and _REFUSED.search(str(error.orig)) is None
    )


def _sqlstate(error: DBAPIError) -> str | None:
    state = getattr(error.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


class PostgreSQL(Dialect):
    names = ("postgresql",)
    # The sentinel write returns its new version (UPDATE ... RETURNING).
    token_from_reply = False
    insert_if_absent = ""
    insert_if_absent_clause = "ON CONFLICT ({key}) DO NOTHING"
    drivers = ("psycopg",)
    async_driver = "psycopg_async"
    async_drivers = frozenset({"psycopg_async"})
    counts_from_client = True
    # A role without USAGE on the tables' schema is told they do not exist.
    unseen_tables = (
        "; if they exist, this role may not use their schema"
        " (GRANT USAGE ON SCHEMA ..., docs/MIGRATIONS.md)"
    )
    column_types: ClassVar[dict[str, TypeEngine[Any]]] = {
        "path": String(MAX_PATH_LENGTH, collation=PATH_COLLATION),
        "timestamp": postgresql.TIMESTAMP(precision=6),
        "long_binary": postgresql.BYTEA(),
    }

    def integer_rows(self, rows: Sequence[tuple[int, int]]) -> str:
        # Two arrays unnested side by side: planned at once, where thousands
        # of UNION ALL branches took the planner seconds (80 s for the
        # largest request). Integers only (%d).
        ks = ",".join(f"{operator.index(k):d}" for k, _ in rows)
        ns = ",".join(f"{operator.index(n):d}" for _, n in rows)
        return f"SELECT k, n FROM unnest('{{{ks}}}'::integer[], '{{{ns}}}'::integer[]) AS t(k, n)"

    def offline_url(self, name: str) -> str:
        return f"{name}+psycopg://"

    def sql_header(self, name: str) -> str:  # noqa: ARG002 - one name
        return _SQL_HEADER

    def skips_locked_rows(self, dialect: SQLAlchemyDialect) -> bool:  # noqa: ARG002
        return True  # FOR UPDATE SKIP LOCKED since PostgreSQL 9.5

    def server_version(self, connection: Connection) -> str:
        version = str(connection.exec_driver_sql("SHOW server_version").scalar())
        return f"PostgreSQL {version}"

    def open_engine(self, url: URL, engine_options: dict[str, Any], settings: Settings) -> Engine:
        # As on MySQL: no rollback when a connection goes back to the pool
        # (every operation ends its transaction itself).
        options: dict[str, Any] = {
            "pool_recycle": 3600,
            "pool_reset_on_return": None,
            # No hstore columns: no look-up of its type on the first connect.
            "use_native_hstore": False,
            **engine_options,
        }
        options["isolation_level"] = ISOLATION_LEVEL
        # Row counts of INSERT ... SELECT (a grant's rows) as the server
        # reports them: SQLAlchemy keeps them for UPDATE and DELETE only.
        options["execution_options"] = {
            **options.get("execution_options", {}),
            "preserve_rowcount": True,
        }
        options["connect_args"] = {**_session_options(settings), **options.get("connect_args", {})}
        try:
            if url.get_driver_name() in ("psycopg", "psycopg_async"):
                from pathlock.dialects import _psycopg  # noqa: PLC0415 - an extra

                if url.get_driver_name() == "psycopg_async":
                    # Connections that send batches (the asyncio dialect's hook).
                    connect = options["connect_args"]
                    connect.setdefault("async_creator_fn", _psycopg.connect_async)
            engine = new_engine(url, **options)
        except ImportError as error:
            raise BackendError(
                "creating the database engine", error, "pip install 'pathlock[postgresql]'"
            ) from error
        except (SQLAlchemyError, ValueError) as error:
            raise BackendError("creating the database engine", error) from error
        if not is_async(engine):
            # (asyncio engines: every attempt runs under an asyncio timeout.)
            event.listen(engine, "do_connect", _bounded_connect)
        self.enable_batches(engine)
        event.listen(engine, "connect", _session_reader(settings))
        return engine

    def adopt(self, engine: Engine, settings: Settings) -> tuple[Engine, bool]:
        adopted, owned = super().adopt(engine, settings)
        # Row counts of INSERT ... SELECT, as for the engines pathlock opens.
        return adopted.execution_options(preserve_rowcount=True), owned

    def is_transient(self, error: DBAPIError) -> bool:
        return (
            super().is_transient(error)
            or _sqlstate(error) in _TRANSIENT
            or _connection_failed(error)
        )

    def is_lost_race(self, error: DBAPIError) -> bool:
        return _sqlstate(error) in (_DEADLOCK, _SERIALIZATION_FAILURE)

    def is_node_failure(self, error: DBAPIError) -> bool:
        state = _sqlstate(error)
        return state in _NODE_GONE or (state or "").startswith("08") or _connection_failed(error)

    def is_missing_table(self, error: DBAPIError) -> bool:
        return _sqlstate(error) == _UNDEFINED_TABLE

    def hint(self, error: DBAPIError) -> str:
        message = str(error.orig)
        if (
            _sqlstate(error) in (_DUPLICATE_PREPARED, _NO_SUCH_PREPARED)
            or NOT_IN_FORCE in message
            or "unsupported startup parameter" in message
        ):
            return POOLED_HINT
        return ""

    def is_timeout(self, error: DBAPIError) -> bool:
        # A wait that ran out of the call's time (_psycopg.py), or a connect
        # that did (psycopg's ConnectionTimeout: "connection timeout expired").
        message = str(error.orig)
        return "timed out" in message or "timeout expired" in message

    def is_duplicate(self, error: DBAPIError) -> bool:
        return _sqlstate(error) in (_DUPLICATE_TABLE, _UNIQUE_VIOLATION)

    def inserted_id(self, result: CursorResult[Any]) -> int:
        # No lastrowid: SQLAlchemy adds RETURNING of the key to an INSERT of
        # one row of values into a table whose key the database generates.
        if not result.context.isinsert:
            return 0
        try:
            key = result.inserted_primary_key
        except InvalidRequestError:  # INSERT ... SELECT
            return 0
        return 0 if key is None or key[0] is None else int(key[0])

    def in_batch(self, sql: str, compiled: SQLCompiler) -> str:
        return _in_batch(sql, compiled)

    def enable_batches(self, engine: Engine) -> None:
        commit_in_batches(engine)

    def can_batch(self, connection: Connection) -> bool:
        # Connections of the engines pathlock creates (_psycopg.py).
        return hasattr(connection.connection.driver_connection, "send_batch")

    @property
    def batches(self) -> bool:
        return True

    notices = True

    def listen(self, engine: Engine, heard: Callable[[int, int], None]) -> Hearing | None:
        return listening(engine.url, _listener_connection(engine), heard)

    def end_sessions(
        self, connection: Connection, sessions: Collection[ServerSession], ends: float
    ) -> set[ServerSession]:
        # A server runs what a client sent, COMMIT and all, even after the
        # client hung up (it notices only when it answers): the session of a
        # dropped connection is ended, and waited for, before anything else
        # is written for its request (see Dialect.end_sessions).
        # A session is known by its process id, client address and start:
        # the process id of one that ended may be a new session's already.
        left = set(sessions)
        while left:
            rows = connection.exec_driver_sql(
                _TERMINATE,
                (
                    [session.id for session in left],
                    [session.host for session in left],
                    [session.since for session in left],
                ),
            )
            left = {ServerSession(int(row[0]), str(row[1]), int(row[2])) for row in rows} & left
            connection.rollback()  # the next look sees the server's sessions anew
            if not left or time.monotonic() >= ends:
                break
            time.sleep(0.005)
        return left


def _session_options(settings: Settings) -> dict[str, Any]:
    """libpq's connection parameters of pathlock's sessions: the server
    gives up a row-lock wait after ``lock_wait_timeout`` seconds (transient:
    retried), ends a session that sits idle in a transaction for
    ``idle_transaction_timeout`` (a frozen client must not hold its
    customer's sentinel row), and the kernel gives up on a peer that stopped
    answering (keepalives, unacknowledged data)."""
    server = (
        f"-c lock_timeout={settings.lock_wait_timeout * 1000:d}"
        f" -c idle_in_transaction_session_timeout={settings.idle_transaction_timeout * 1000:d}"
    )
    socket_ms = max(1000, round(settings.socket_timeout * 1000))
    return {
        "options": server,
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": socket_ms,
        "connect_timeout": max(2, round(settings.socket_timeout)),
    }


# The listener's connection, where it is not one of the engine's (an asyncio
# engine's serve its loop): the kernel gives up on a server that stopped
# answering, as for pathlock's sessions.
_LISTENER_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "connect_timeout": 10,
}


def _listener_connection(engine: Engine) -> Callable[[], Any]:
    """How the listener of ``engine``'s database connects: a connection of
    the engine's, detached from its pool (made as the engine makes its
    own); for an asyncio engine, a synchronous psycopg connection to its
    URL, for the listener's thread."""
    if not is_async(engine):

        def detached() -> Any:
            pooled = engine.raw_connection()
            connection = pooled.driver_connection
            pooled.detach()  # the listener's, not the pool's
            return connection

        return detached

    def plain() -> Any:
        from pathlock.dialects import _psycopg  # noqa: PLC0415 - psycopg is an extra

        # The asyncio dialect's arguments are the synchronous one's.
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        return _psycopg.connect(*cargs, **{**_LISTENER_OPTIONS, **cparams})

    return plain


def _bounded_connect(_dialect: object, _record: object, cargs: Any, cparams: Any) -> Any:
    # Connections whose waits end with their caller's time (_psycopg.py). A
    # wait on the network: a Ctrl-C may end it (interrupts.py).
    from pathlock.dialects import _psycopg  # noqa: PLC0415 - psycopg is an extra

    with interrupts.let_through():
        return _psycopg.connect(*cargs, **cparams)


_SINCE = "CAST(extract(epoch FROM backend_start) * 1000000 AS bigint)"
# The session, the client's address and port as the server sees them, and
# the settings in force that pathlock's connections ask for (in ms).
_SESSION = (
    "SELECT pid, COALESCE(host(client_addr), ''), " + _SINCE + ", client_port,"
    " (SELECT setting FROM pg_settings WHERE name = 'lock_timeout'),"
    " (SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout')"
    " FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)
# The sessions still there, each told to end (again, if it was told before):
# found first, in a CTE of their own, so that nothing but them is told.
_TERMINATE = (
    "WITH found AS MATERIALIZED ("
    "SELECT a.pid, a.host, a.since FROM ("
    "SELECT pid, COALESCE(host(client_addr), '') AS host, " + _SINCE + " AS since"
    " FROM pg_stat_activity) AS a"
    " JOIN unnest(%s::integer[], %s::text[], %s::bigint[]) AS s(pid, host, since)"
    " ON a.pid = s.pid AND a.host = s.host AND a.since = s.since)"
    " SELECT pid, host, since, pg_terminate_backend(pid) FROM found"
)


def _session_reader(settings: Settings) -> Callable[[Any, Any], None]:
    """The ``connect`` listener of an engine pathlock opens with
    ``settings``: one round trip, once per connection, that checks the
    session's settings and records the session (:func:`_read_session`)."""
    wanted = (str(settings.lock_wait_timeout * 1000), str(settings.idle_transaction_timeout * 1000))

    def read(dbapi_connection: Any, record: Any) -> None:
        _read_session(dbapi_connection, record, wanted)

    return read


def _read_session(dbapi_connection: Any, record: Any, wanted: tuple[str, str]) -> None:
    """Check that the session's ``lock_timeout`` and
    ``idle_in_transaction_session_timeout`` are the ``wanted`` ones (in ms),
    which the connection's startup options set, and record the session on
    the server: what ends it if the connection is dropped in the middle of
    an operation (:meth:`PostgreSQL.end_sessions`), where the connection is
    the server's own.

    A pooler between pathlock and the server drops the startup options (or
    refuses them, and the connection), and hands a connection's transactions
    to server sessions that other clients use too: ending such a session
    would end theirs. Options dropped fail the connection (the server's row
    locks would be waited for without end, and a frozen client would hold
    its customer for hours); where the server sees another address or port
    than this connection's own (a proxy's), no session is recorded."""
    with interrupts.let_through():
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(_SESSION)
            row = cursor.fetchone()
            # The read began a transaction (psycopg's default): end it.
            dbapi_connection.rollback()
        finally:
            cursor.close()
    if row is None:
        return
    in_force = (str(row[4]), str(row[5]))
    if in_force != wanted:
        dbapi_connection.close()
        raise _not_in_force(in_force, wanted)
    if _direct(dbapi_connection, str(row[1]), row[3]):
        record.info[SERVER_SESSION] = ServerSession(int(row[0]), str(row[1]), int(row[2]))


def _not_in_force(in_force: tuple[str, str], wanted: tuple[str, str]) -> Exception:
    import psycopg  # noqa: PLC0415 - an extra, imported with the engine

    return psycopg.OperationalError(
        f"{NOT_IN_FORCE}: the server says lock_timeout={in_force[0]} ms and "
        f"idle_in_transaction_session_timeout={in_force[1]} ms, the connection asked for "
        f"{wanted[0]} ms and {wanted[1]} ms (its startup options did not reach the server: "
        "a pooler in between?)"
    )


def _direct(dbapi_connection: Any, host: str, port: int | None) -> bool:
    """Whether the server sees this connection's own address and port as
    its client's: no proxy or pooler in between. A connection over a Unix
    socket counts as direct (the server sees no port)."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    try:
        with socket.socket(fileno=os.dup(driver.pgconn.socket)) as own:
            local = own.getsockname()
    except (OSError, AttributeError):
        return False  # not told: nothing recorded, nothing ever ended
    if not isinstance(local, tuple):  # a Unix socket
        return port is None or port < 0
    try:
        return port == local[1] and ipaddress.ip_address(host) == ipaddress.ip_address(local[0])
    except ValueError:
        return False


@compiles(Now, "postgresql")
def _now(_element: Now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return _NOW


@compiles(NowPlus, "postgresql")
def _now_plus(element: NowPlus, compiler: SQLCompiler, **kw: Any) -> str:
    microseconds = compiler.process(element.clauses, **kw)
    return f"({_NOW} + make_interval(secs => ({microseconds}) / 1000000.0))"


def _key(path: Any) -> Any:
    """The part of ``path`` the path index holds (``left(path, 600)``, the
    length written in the SQL: a parameter would not match the index)."""
    return func.left(path, literal_column(str(PATH_KEY_LENGTH), Integer))


class _PathKey(TypeDecorator[str]):
    """A parameter of paths whose every value is sent cut to the index's
    length (each element of an expanding list too)."""

    impl = String
    cache_ok = True

    def bind_expression(self, bindvalue: Any) -> Any:
        return _key(bindvalue)


@compiles(PathIn, "postgresql")
def _path_in(element: PathIn, compiler: SQLCompiler, **kw: Any) -> str:
    path, values = element.clauses.clauses
    keys = bindparam(values.key, expanding=True, type_=_PathKey())
    return str(compiler.process(and_(_key(path).in_(keys), path.in_(values)), **kw))


@compiles(PathIs, "postgresql")
def _path_is(element: PathIs, compiler: SQLCompiler, **kw: Any) -> str:
    path, value = element.clauses.clauses
    return str(compiler.process(and_(_key(path) == _key(value), path == value), **kw))


@compiles(PathWithin, "postgresql")
def _path_within(element: PathWithin, compiler: SQLCompiler, **kw: Any) -> str:
    # The index's prefixes, then the full paths as every family compares
    # them (the default, written out: see pathlock.dialects.base).
    path, low, high = element.clauses.clauses
    key, bottom, top = (compiler.process(_key(operand), **kw) for operand in (path, low, high))
    return f"{key} >= {bottom} AND {key} <= {top} AND {path_within(element, compiler, **kw)}"


@compiles(CreateIndex, "postgresql")
def _create_index(element: CreateIndex, compiler: DDLCompiler, **kw: Any) -> str:
    # The (customer_id, path) index of pathlock's tables (their metadata says
    # so) holds the paths' first characters; any other index passes through.
    index = element.element
    table = index.table
    columns = [column.name for column in index.columns]
    if (
        table is None
        or not table.metadata.info.get("pathlock")
        or columns != ["customer_id", "path"]
    ):
        return str(compiler.visit_create_index(element, **kw))  # type: ignore[no-untyped-call]
    preparer = compiler.preparer
    return (
        f"CREATE INDEX {preparer.format_index(index)} ON {preparer.format_table(table)}"
        f" (customer_id, left(path, {PATH_KEY_LENGTH:d}))"
    )


@compiles(Bytes, "postgresql")
def _bytes(element: Bytes, compiler: SQLCompiler, **kw: Any) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS BYTEA)"


# Statements that travel several to a query (pathlock._batch) pass what one
# tells the next through settings of the transaction (set_config(..., true)):
# a data-modifying statement is wrapped so that it keeps its row count
# (pathlock.changed) and the id it generated (pathlock.id), and its reply is
# one row of both, which _psycopg.BoundedConnection.reply() reads as MySQL's
# OK packet; Fenced keeps its value in pathlock.id as MySQL's
# LAST_INSERT_ID(expr) does. Elsewhere the client passes them
# (Dialect.counts_from_client), and the sentinel write returns its version.
_CHANGED_SETTING = "pathlock.changed"
_ID_SETTING = "pathlock.id"
_UNTIL_SETTING = "pathlock.grant_until"
# When the row is judged: the clock, read after any lock wait (the
# statement's start is when the query arrived, for every statement of it).
_CLOCK = "(clock_timestamp() AT TIME ZONE 'UTC')"


def _setting(name: str, type_name: str) -> str:
    # A setting of the transaction reads '' after the transaction ends.
    return f"CAST(NULLIF(current_setting('{name}', true), '') AS {type_name})"


@compiles(Fenced, "postgresql")
def _fenced(element: Fenced, compiler: SQLCompiler, **kw: Any) -> str:
    value = str(compiler.process(element.clauses, **kw))
    if not kw.get(BATCHED):
        return value
    compiler.pathlock_fenced = True  # type: ignore[attr-defined] # read by in_batch()
    return f"CAST(set_config('{_ID_SETTING}', CAST({value} AS TEXT), true) AS BIGINT)"


@compiles(Changed, "postgresql")
def _changed(_element: Changed, compiler: SQLCompiler, **kw: Any) -> str:
    if kw.get(BATCHED):
        return _setting(_CHANGED_SETTING, "BIGINT")
    return str(compiler.process(bindparam(CHANGED_ROWS, type_=BigInteger), **kw))


@compiles(InsertedId, "postgresql")
def _inserted_id(_element: InsertedId, compiler: SQLCompiler, **kw: Any) -> str:
    if kw.get(BATCHED):
        return _setting(_ID_SETTING, "BIGINT")
    return str(compiler.process(bindparam(INSERTED_ID, type_=BigInteger), **kw))


@compiles(Notice, "postgresql")
def _notice(element: Notice, compiler: SQLCompiler, **kw: Any) -> str:
    return f"pg_notify('{CHANNEL}', {compiler.process(element.clauses, **kw)})"


@compiles(JsonArray, "postgresql")
def _json_array(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    # As text, which the client parses as it parses MySQL's.
    return f"CAST(json_build_array({compiler.process(element.clauses, **kw)}) AS TEXT)"


@compiles(MicrosecondsLeft, "postgresql")
def _microseconds_left(element: MicrosecondsLeft, compiler: SQLCompiler, **kw: Any) -> str:
    then = compiler.process(element.clauses, **kw)
    return f"CAST(EXTRACT(EPOCH FROM ({then} - {_NOW})) * 1000000 AS BIGINT)"


@compiles(WaitedInTime, "postgresql")
def _waited_in_time(element: WaitedInTime, compiler: SQLCompiler, **kw: Any) -> str:
    until = compiler.process(element.clauses, **kw)
    return f"{_CLOCK} < {_NOW} + make_interval(secs => ({until}) / 1000000.0)"


@compiles(InGrantTime, "postgresql")
def _in_grant_time(_element: InGrantTime, _compiler: SQLCompiler, **_kw: Any) -> str:
    return f"{_CLOCK} < {_setting(_UNTIL_SETTING, 'TIMESTAMP')}"


@compiles(SetGrantUntil, "postgresql")
def _set_grant_until(_element: SetGrantUntil, compiler: SQLCompiler, **kw: Any) -> str:
    until = compiler.process(bindparam("until_us", type_=BigInteger), **kw)
    then = f"{_NOW} + make_interval(secs => ({until}) / 1000000.0)"
    return f"SELECT set_config('{_UNTIL_SETTING}', CAST({then} AS TEXT), true)"


def _in_batch(sql: str, compiled: SQLCompiler) -> str:
    """``sql``, the statement ``compiled``, as it travels in a batch: wrapped
    to reply as MySQL's statements do (:func:`_wrapped`), and executed as a
    prepared statement (:func:`_executed`)."""
    return _executed(_wrapped(sql, compiled), compiled)


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _executed(sql: str, compiled: SQLCompiler) -> str:
    """``sql`` (in psycopg's ``%(name)s`` paramstyle) as the ``EXECUTE`` of a
    prepared statement, whose ``PREPARE`` goes into :data:`PREPARED`: a
    statement sent as text is parsed and planned anew by the server every
    time (for a grant or a release, more than the rest of the server's work
    for it), a prepared one once per session, or a few times (PostgreSQL
    plans the first five executions for their values)."""
    numbers: dict[str, str] = {}

    def numbered(match: re.Match[str]) -> str:
        return numbers.setdefault(match.group(1), f"${len(numbers) + 1}")

    body = _PLACEHOLDER.sub(numbered, sql)
    if len(numbers) > _PREPARED_PARAMETERS:
        # A large request's: its planning is little beside its work, and a
        # session would keep its plan for every shape of request.
        return sql
    name = "pathlock_" + hashlib.sha1(sql.encode(), usedforsecurity=False).hexdigest()[:24]
    if not numbers:
        PREPARED.setdefault(name, f"PREPARE {name} AS {body}")
        return f"EXECUTE {name}"
    # Each parameter's type as its value's would be (the text sent a
    # literal of it): where the statement does not say (a value selected,
    # as a request's derived table of paths does), the server takes text.
    types = ", ".join([_parameter_type(compiled, parameter) for parameter in numbers])
    PREPARED.setdefault(name, f"PREPARE {name} ({types}) AS {body}")
    return f"EXECUTE {name}({', '.join(f'%({parameter})s' for parameter in numbers)})"


_EXPANDED = re.compile(r"_\d+$")
_PREPARED_PARAMETERS = 64
"""Statements with more parameters than this travel as text (a request of
more than a few paths: lists up to eight long are sent as they are, longer
ones padded to the next power of two)."""


def _parameter_type(compiled: SQLCompiler, parameter: str) -> str:
    """The SQL type of ``compiled``'s parameter ``parameter`` (an element of
    an expanded list is named after the list: ``name_1``, ``name_2`` ...);
    ``unknown`` (the server's guess) where it has none."""
    bind = compiled.binds.get(parameter)
    if bind is None:
        bind = compiled.binds.get(_EXPANDED.sub("", parameter))
    # Its generic type (VARCHAR, not VARCHAR(4000) COLLATE "C": a parameter
    # has no collation), as the casts SQLAlchemy writes after parameters.
    type_: Any = None if bind is None else bind.type
    if isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    for kind, spelled in _PARAMETER_TYPES:
        if isinstance(type_, kind):
            return spelled
    return "unknown"


_PARAMETER_TYPES: tuple[tuple[type[TypeEngine[Any]], str], ...] = (
    (String, "VARCHAR"),
    (BigInteger, "BIGINT"),  # before Integer, its base class
    (Integer, "INTEGER"),
    (Boolean, "BOOLEAN"),
    (LargeBinary, "BYTEA"),
    (DateTime, "TIMESTAMP WITHOUT TIME ZONE"),
)


def _wrapped(sql: str, compiled: SQLCompiler) -> str:
    """``sql``, the statement ``compiled``: an INSERT, UPDATE or DELETE
    (without RETURNING of its own) wrapped so that it keeps its row count and
    generated id for the statements after it, and replies with them
    (:data:`BATCH_REPLY`)."""
    if not (compiled.isinsert or compiled.isupdate or compiled.isdelete):
        return sql
    table: Any = getattr(compiled.statement, "table", None)
    key = table.autoincrement_column if compiled.isinsert else None
    returning = compiled.effective_returning
    if returning:
        # Rows of its own to read; or the generated key, which SQLAlchemy
        # asks for itself (an INSERT of one row of values).
        if key is None or list(returning) != [key] or not compiled.implicit_returning:
            return sql
        head = f"WITH t(k) AS ({sql})"
    else:
        returned = "0" if key is None else compiled.preparer.quote(key.name)
        head = f"WITH t AS ({sql} RETURNING {returned} AS k)"
    changed = f"set_config('{_CHANGED_SETTING}', CAST(count(*) AS TEXT), true)"
    if key is not None:
        # The first id generated, as MySQL's LAST_INSERT_ID() (kept if none).
        generated = "COALESCE(min(k), 0)"
        changed += (
            f", CASE WHEN count(*) > 0 THEN set_config('{_ID_SETTING}', CAST(min(k) AS TEXT), true)"
            " END"
        )
    elif getattr(compiled, "pathlock_fenced", False):
        # The value Fenced kept, if the statement changed a row.
        generated = f"CASE WHEN count(*) > 0 THEN {_setting(_ID_SETTING, 'BIGINT')} ELSE 0 END"
    else:
        generated = "0"
    return (
        f"{head} SELECT count(*) AS {BATCH_REPLY[0]},"
        f" {generated} AS {BATCH_REPLY[1]}, {changed} FROM t"
    )

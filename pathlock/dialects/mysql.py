"""MySQL and MariaDB, Galera clusters included, over PyMySQL."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import URL, BigInteger, Connection, Engine, bindparam, event
from sqlalchemy.dialects import mysql
from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.compiler import DDLCompiler, SQLCompiler
from sqlalchemy.types import TypeEngine

from pathlock import _interrupts as interrupts
from pathlock.dialects import _pymysql
from pathlock.dialects._commits import commit_in_batches
from pathlock.dialects.base import (
    COMMIT_ALONE,
    ISOLATION_LEVEL,
    SERVER_SESSION,
    Changed,
    Dialect,
    Fenced,
    InGrantTime,
    InsertedId,
    JsonArray,
    MicrosecondsLeft,
    Now,
    NowPlus,
    ServerSession,
    SetGrantUntil,
    WaitedInTime,
    new_engine,
)
from pathlock.errors import BackendError

if TYPE_CHECKING:
    from pathlock.settings import Settings

# Error codes after which the same attempt can simply run again: the failed
# transaction was rolled back (or its outcome is checked, see try_grant).
TRANSIENT_ERRORS = frozenset(
    {
        1205,  # lock wait timeout
        1213,  # deadlock (and a cluster's certification failure)
        1047,  # a cluster node outside the primary component (Galera)
        1053,  # server shutdown in progress
        1180,  # error during COMMIT (a Galera node that lost the primary component)
        1927,  # connection killed (MariaDB)
        2003,  # cannot connect (server restarting)
        2006,  # server has gone away
        2013,  # lost connection during query
        2014,  # commands out of sync (a broken connection)
        4031,  # disconnected by the server for inactivity (MySQL 8)
    }
)

log = logging.getLogger("pathlock.store")

# Errors that say the node is gone or cannot serve (as opposed to the
# transaction having lost a race): a manager with several nodes moves on.
NODE_FAILURES = frozenset({1047, 1053, 1180, 2003, 2006, 2013, 2014, 4031})

# A lost race with another transaction of the same customer: on one server a
# deadlock, on a cluster mostly a certification failure.
CONTENTION = 1213

_NO_SUCH_TABLE = 1146
_TABLE_EXISTS = 1050
_NO_SUCH_THREAD = 1094
_NOT_OWNER = 1095
_DUPLICATE_ENTRY = 1062

_NOW = "UTC_TIMESTAMP(6)"

# Paths compare byte for byte: a case- or accent-insensitive collation would make
# /Shared/A and /Shared/a (or café and cafe) one lock. Normalization (NFC, optional
# case folding) happens in Python, where it is explicit.
PAD_SPACE_COLLATION = "utf8mb4_bin"

# InnoDB index keys are limited to 3072 bytes: 700 utf8mb4 characters plus the
# customer id fit. Longer paths are still found exactly (the server compares the
# full column after the index narrows the range); they only share index entries.
PATH_INDEX_PREFIX = 700


_NAMES = ("mysql", "mariadb")

# The SQL `pathlock db upgrade --sql` prints for one of the two works on that
# one alone: the NO PAD collations have different names (revision 0003), and
# MariaDB's records the revision with INSERT ... RETURNING (MariaDB 10.5+).
# Piped into the other server's client, the script made four tables and then
# failed, leaving them half made. So its first statement fails on any other
# server, and the client stops there (`mysql` and `mariadb` stop at the first
# error unless --force), before anything is created. An invalid sql_mode is
# an error on both, and the error shows the value: the reason, which must
# hold no comma (the server would show the part before it). Not a comment
# only MariaDB runs (/*M!...*/): MySQL's client strips those by default, so a
# MariaDB server it talks to never sees them. Not SIGNAL: a condition around
# it needs a stored program on MySQL.
_MAJOR = "CAST(SUBSTRING_INDEX(VERSION(), '.', 1) AS UNSIGNED)"
_MINOR = "CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(VERSION(), '.', 2), '.', -1) AS UNSIGNED)"
# For each name: (the condition on the server, the reason's end) per refusal.
_REFUSALS = {
    "mysql": (
        ("VERSION() LIKE '%MariaDB%'", ": print the SQL for it with --dialect mariadb"),
        (f"{_MAJOR} < 8", ""),
    ),
    "mariadb": (
        ("VERSION() NOT LIKE '%MariaDB%'", ": print the SQL for it with --dialect mysql"),
        (f"{_MAJOR} * 1000 + {_MINOR} < 10005", ""),
    ),
}
_SERVERS = {"mysql": "MySQL 8.0 or later", "mariadb": "MariaDB 10.5 or later"}
_SQL_HEADERS = {
    "mysql": "-- pathlock's tables, for MySQL 8.0 and later. For MariaDB, print them with\n"
    "-- --dialect mariadb (or a mariadb+pymysql:// URL): the collations differ.\n"
    "-- The first statement stops this script on any other server, before it creates anything.",
    "mariadb": "-- pathlock's tables, for MariaDB 10.5 and later. For MySQL 8.0, print them with\n"
    "-- --dialect mysql (or a mysql+pymysql:// URL): the collations differ.\n"
    "-- The first statement stops this script on any other server, before it creates anything.",
}


def _refusal(name: str) -> str:
    """The statement that fails, saying why, on a server the SQL printed for
    ``name`` is not for, and changes nothing on one it is for."""
    cases = []
    for condition, advice in _REFUSALS[name]:
        reason = f"'pathlock: this SQL is for {_SERVERS[name]} and the server is ', VERSION()"
        if advice:
            reason += f",\n            '{advice}'"
        cases.append(f"    WHEN {condition}\n        THEN CONCAT({reason})\n")
    return f"SET SESSION sql_mode = CASE\n{''.join(cases)}    ELSE @@SESSION.sql_mode END;"


# Several statements per query (pathlock._batch) need the connection flag
# pymysql.constants.CLIENT.MULTI_STATEMENTS, the protocol's capability bit.
MULTI_STATEMENTS = 1 << 16
# Where each driver's connection keeps the flags it connected with.
_FLAGS = {"pymysql": "client_flag", "asyncmy": "_client_flag"}


def _both(**options: Any) -> dict[str, Any]:
    """``options`` for both dialect names: SQLAlchemy's "mariadb" dialect (a
    mariadb+pymysql:// URL) reads only mariadb_* options, "mysql" only mysql_*."""
    return {f"{name}_{key}": value for name in _NAMES for key, value in options.items()}


def no_pad_collation(dialect: SQLAlchemyDialect) -> str:
    """The binary collation that also compares trailing spaces. utf8mb4_bin,
    the one every version knows, is PAD SPACE: it finds '/a ' equal to '/a'
    (a spurious conflict). MariaDB (10.2+) has utf8mb4_nopad_bin and MySQL 8
    utf8mb4_0900_bin; MySQL 5.7 has none, and keeps utf8mb4_bin. Without a
    server to ask (offline SQL from a mysql:// URL), MySQL 8 is assumed."""
    if getattr(dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin"
    version = getattr(dialect, "server_version_info", None)
    if version is None or version >= (8,):
        return "utf8mb4_0900_bin"
    return PAD_SPACE_COLLATION


@compiles(CreateTable, "mysql")
@compiles(CreateTable, "mariadb")
def _create_table(element: CreateTable, compiler: DDLCompiler, **kw: Any) -> str:
    # pathlock's own tables only (their metadata says so): the table option
    # stands for the server's NO PAD binary collation. Other tables of the
    # application pass through untouched.
    text: str = compiler.visit_create_table(element, **kw)  # type: ignore[no-untyped-call]
    if element.element.metadata.info.get("pathlock"):
        collation = no_pad_collation(compiler.dialect)
        text = text.replace(f"COLLATE {PAD_SPACE_COLLATION}", f"COLLATE {collation}")
    return text


class MySQL(Dialect):
    names = _NAMES
    token_from_reply = True
    # Not INSERT IGNORE: that answers an existing key with a warning, which
    # asyncmy fetches in a round trip of its own and logs as a WARNING.
    insert_if_absent = ""
    insert_if_absent_clause = "ON DUPLICATE KEY UPDATE {key} = {key}"
    # Only PyMySQL's connections bound every wait (_pymysql.BoundedConnection)
    # and batch statements.
    drivers = ("pymysql",)
    async_driver = "asyncmy"
    async_drivers = frozenset({"asyncmy", "aiomysql"})
    several_nodes = True
    index_hint = "FORCE INDEX ({index})"
    table_options: ClassVar[dict[str, Any]] = _both(
        engine="InnoDB", charset="utf8mb4", collate=PAD_SPACE_COLLATION
    )
    path_index_options: ClassVar[dict[str, Any]] = _both(length={"path": PATH_INDEX_PREFIX})
    column_types: ClassVar[dict[str, TypeEngine[Any]]] = {
        "timestamp": mysql.DATETIME(fsp=6),
        "long_text": mysql.MEDIUMTEXT(),
        "long_binary": mysql.MEDIUMBLOB(),
    }

    def skips_locked_rows(self, dialect: SQLAlchemyDialect) -> bool:
        # MariaDB 10.6 and MySQL 8.0.1 and later.
        version = dialect.server_version_info or ()
        if getattr(dialect, "is_mariadb", False):
            return version >= (10, 6)
        return version >= (8, 0, 1)

    def offline_url(self, name: str) -> str:
        return f"{name}+pymysql://"

    def sql_header(self, name: str) -> str:
        return f"{_SQL_HEADERS[name]}\n{_refusal(name)}"

    def server_version(self, connection: Connection) -> str:
        version = str(connection.exec_driver_sql("SELECT VERSION()").scalar())
        name = "MariaDB" if "mariadb" in version.lower() else "MySQL"
        return f"{name} {version}"

    def open_engine(self, url: URL, engine_options: dict[str, Any], settings: Settings) -> Engine:
        # No rollback when a connection goes back to the pool: every operation
        # of the store ends its transaction itself (commit or rollback), and a
        # Connection closed in the middle of one rolls it back before the pool
        # sees it. The pool's own "reset" would be one more round trip per
        # operation: a quarter of an uncontended acquire + release.
        options: dict[str, Any] = {
            "pool_recycle": 3600,
            "pool_reset_on_return": None,
            **engine_options,
        }
        options["isolation_level"] = ISOLATION_LEVEL
        # A server (or the network path to it) that hangs would otherwise hang
        # every call into it for good, where a lost connection fails over to
        # the next node or is retried. The caller's connect_args win.
        timeouts: dict[str, Any] = {}
        if url.get_driver_name() == "pymysql":
            timeouts = {
                "read_timeout": settings.socket_timeout,
                "write_timeout": settings.socket_timeout,
            }
        # (asyncio drivers: every attempt runs under an asyncio timeout instead.)
        options["connect_args"] = {**timeouts, **options.get("connect_args", {})}
        try:
            engine = new_engine(url, **options)
        except ImportError as error:
            raise BackendError("creating the database engine", error, _driver_hint(url)) from error
        except (SQLAlchemyError, ValueError) as error:
            raise BackendError("creating the database engine", error) from error
        self.enable_batches(engine)
        if engine.dialect.driver == "pymysql":
            # After enable_batches' listener, which adds a connection flag.
            event.listen(engine, "do_connect", _bounded_connect)
        event.listen(
            engine,
            "connect",
            _session_settings(settings.lock_wait_timeout, settings.idle_transaction_timeout),
        )
        return engine

    def is_transient(self, error: DBAPIError) -> bool:
        return super().is_transient(error) or self.error_code(error) in TRANSIENT_ERRORS

    def is_lost_race(self, error: DBAPIError) -> bool:
        return self.error_code(error) == CONTENTION

    def is_node_failure(self, error: DBAPIError) -> bool:
        return self.error_code(error) in NODE_FAILURES

    def is_missing_table(self, error: DBAPIError) -> bool:
        return self.error_code(error) == _NO_SUCH_TABLE or super().is_missing_table(error)

    def is_timeout(self, error: DBAPIError) -> bool:
        # PyMySQL says "timed out" in the lost-connection error of a socket timeout.
        return "timed out" in str(error.orig)

    def is_duplicate(self, error: DBAPIError) -> bool:
        return self.error_code(error) in (_TABLE_EXISTS, _DUPLICATE_ENTRY)

    def ping(self, connection: Connection) -> None:
        # Not SELECT 1: on a Galera node with causal reads (wsrep_sync_wait,
        # which pathlock's sessions have), every SELECT first waits until the
        # node has applied everything the cluster committed before it: the
        # ping would measure replication lag, and a busy but healthy node
        # could fail it. DO is no read.
        connection.exec_driver_sql("DO 1")

    def end_sessions(
        self, connection: Connection, sessions: Collection[ServerSession], ends: float
    ) -> set[ServerSession]:
        # A server runs what a client sent, COMMIT and all, even after the
        # client hung up: it finds out only when it answers. A dropped
        # connection's batch may be waiting for a lock, or not yet read, while
        # the request it belonged to is retried or cleaned up through another
        # connection; it must not land afterwards. KILL ends a session at
        # once, whatever it waits for; the session is gone once it is no
        # longer listed (a statement under way ends first).
        left = set(sessions)
        killed: set[ServerSession] = set()
        while True:
            listed = _listed(connection, left)
            left &= listed
            for session in left - killed:
                try:
                    connection.exec_driver_sql(f"KILL CONNECTION {session.id:d}")
                except DBAPIError as error:
                    code = self.error_code(error)
                    if code == _NOT_OWNER:
                        left.discard(session)  # another user's: none of ours
                    elif code != _NO_SUCH_THREAD:
                        raise
                killed.add(session)
            if not left or time.monotonic() >= ends:
                connection.rollback()
                return left
            time.sleep(0.005)

    def enable_batches(self, engine: Engine) -> None:
        commit_in_batches(engine)
        # PyMySQL only: asyncmy always sets the flag; other drivers are left
        # as they are (and send statements one by one).
        if engine.dialect.driver != "pymysql":
            return

        def connect(_dialect: object, _record: object, _args: object, options: Any) -> None:
            options["client_flag"] = options.get("client_flag", 0) | MULTI_STATEMENTS

        event.listen(engine, "do_connect", connect)

    def can_batch(self, connection: Connection) -> bool:
        attribute = _FLAGS.get(connection.dialect.driver)
        if attribute is None:
            return False
        flags = getattr(connection.connection.driver_connection, attribute, 0)
        return bool(flags & MULTI_STATEMENTS)

    @property
    def batches(self) -> bool:
        return True


def _driver_hint(url: URL) -> str:
    """What to write instead of a URL whose driver is not installed."""
    if url.get_driver_name() == "asyncmy":
        return "the asyncio API needs asyncmy: pip install 'pathlock[async]'"
    if url.get_backend_name() in ("mysql", "mariadb") and url.get_driver_name() != "pymysql":
        return (
            f"pathlock talks to MySQL and MariaDB through PyMySQL: write "
            f"{url.get_backend_name()}+pymysql://... instead of {url.drivername}://..."
        )
    return ""


# Which statements of a session wait for causality on a Galera node
# (wsrep_sync_wait bits): 1 reads (the queue watch, listings), 2 UPDATE and
# DELETE (the sentinel write that starts every grant and release, so the
# conflict check reads everything the cluster committed before it). Without
# it, a grant right after a release through another node may lose a
# certification race or see the released rows; never unsafe, but slower.
WSREP_SYNC_WAIT = 3


def _bounded_connect(_dialect: object, _record: object, cargs: Any, cparams: Any) -> Any:
    # Connections whose socket waits end with their caller's time (deadlines.py).
    # A wait on the network: a Ctrl-C may end it (interrupts.py).
    with interrupts.let_through():
        if _pymysql.DIRECT:
            return _pymysql.Connection(*cargs, **cparams)
        return _pymysql.BoundedConnection(*cargs, **cparams)


def _session_settings(lock_wait_timeout: int, idle: int) -> Callable[[Any, object], None]:
    """The ``connect`` listener of engines pathlock creates on MySQL/MariaDB.

    Causal reads only where the server is a Galera node with causality checks
    off (a value set by the operator, globally or in init_command, is kept);
    MySQL has no such variables. The lock wait, and on MariaDB the time a
    transaction may sit idle (``idle``: a frozen client must not hold its
    customer's row for hours), are only ever lowered. One SHOW for all, and
    one SET if anything needs changing, once per connection: nothing per
    operation."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        with interrupts.let_through():  # round trips: a Ctrl-C may end them
            # Before the settings: no causal wait on a Galera node.
            session = _server_session(dbapi_connection)
            galera = _apply_session_settings(dbapi_connection, lock_wait_timeout, idle)
        if session is not None:
            record.info[SERVER_SESSION] = session
        if galera:
            # A Galera node (MariaDB 10.11, Galera 26.4) sometimes answers
            # 1213 to a COMMIT sent at the end of a batch of statements, right
            # after a change of the cluster's members, and lands it all the
            # same, as a write never checked against the one committed beside
            # it: 7 of 2,702 such errors measured, and none of 2,737 answered
            # to a COMMIT sent on its own (docs/CLUSTER.md).
            record.info[COMMIT_ALONE] = True

    return on_connect


def _apply_session_settings(dbapi_connection: Any, lock_wait_timeout: int, idle: int) -> bool:
    """Set up the session; whether the server is a Galera node."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(
            "SHOW SESSION VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_sync_wait',"
            " 'innodb_lock_wait_timeout', 'idle_transaction_timeout')"
        )
        values = {str(name).lower(): str(value) for name, value in cursor.fetchall()}
        settings = []
        if values.get("wsrep_on", "").upper() == "ON" and values.get("wsrep_sync_wait") == "0":
            settings.append(f"wsrep_sync_wait = {WSREP_SYNC_WAIT}")
        lock_wait = values.get("innodb_lock_wait_timeout", "")
        if lock_wait.isdigit() and int(lock_wait) > lock_wait_timeout:
            settings.append(f"innodb_lock_wait_timeout = {lock_wait_timeout:d}")
        # MariaDB only (0: no limit, the default).
        idle_now = values.get("idle_transaction_timeout", "")
        if idle_now.isdigit() and (int(idle_now) == 0 or int(idle_now) > idle):
            settings.append(f"idle_transaction_timeout = {idle:d}")
        if settings:
            cursor.execute("SET SESSION " + ", ".join(settings))
    finally:
        cursor.close()
    return values.get("wsrep_on", "").upper() == "ON"


_SESSION = "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()"


def _listed(connection: Connection, sessions: Collection[ServerSession]) -> set[ServerSession]:
    """Those of ``sessions`` the server still lists."""
    if not sessions:
        return set()
    ids = ", ".join(f"{session.id:d}" for session in sessions)
    rows = connection.exec_driver_sql(
        f"SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE ID IN ({ids})"
    )
    return {ServerSession(int(row[0]), str(row[1])) for row in rows} & set(sessions)


def _server_session(dbapi_connection: Any) -> ServerSession | None:
    """The connection's session as the server knows it (one round trip, once
    per connection): what ends it if the connection is dropped in the middle
    of an operation (MySQLDialect.end_sessions)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_SESSION)
        row = cursor.fetchone()
    except Exception as error:  # noqa: BLE001 - the driver's own error classes
        # A server that does not list its sessions to this user (or not yet:
        # a Galera node joining its cluster): the connection works without;
        # only the clean-up after it is dropped is not there.
        log.debug("the connection's server session is unknown: %s", error)
        return None
    finally:
        cursor.close()
    return None if row is None else ServerSession(int(row[0]), str(row[1]))


# The default spelling (any dialect but SQLite's) is MySQL's.


@compiles(Now, "mysql")
@compiles(Now, "mariadb")
def _now(_element: Now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return _NOW


@compiles(NowPlus, "mysql")
@compiles(NowPlus, "mariadb")
def _now_plus(element: NowPlus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"TIMESTAMPADD(MICROSECOND, {compiler.process(element.clauses, **kw)}, {_NOW})"


@compiles(Fenced, "mysql")
@compiles(Fenced, "mariadb")
def _fenced(element: Fenced, compiler: SQLCompiler, **kw: Any) -> str:
    # LAST_INSERT_ID(expr) returns the value in the statement's own reply
    # (cursor.lastrowid), saving a SELECT on the hot path.
    return f"LAST_INSERT_ID({compiler.process(element.clauses, **kw)})"


@compiles(Changed, "mysql")
@compiles(Changed, "mariadb")
def _changed(_element: Changed, _compiler: SQLCompiler, **_kw: Any) -> str:
    # Matched rows, for an UPDATE: pathlock's connections set CLIENT_FOUND_ROWS.
    return "ROW_COUNT()"


@compiles(InsertedId, "mysql")
@compiles(InsertedId, "mariadb")
def _inserted_id(_element: InsertedId, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "LAST_INSERT_ID()"


@compiles(JsonArray, "mysql")
@compiles(JsonArray, "mariadb")
def _json_array(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_array({compiler.process(element.clauses, **kw)})"


@compiles(MicrosecondsLeft, "mysql")
@compiles(MicrosecondsLeft, "mariadb")
def _microseconds_left(element: MicrosecondsLeft, compiler: SQLCompiler, **kw: Any) -> str:
    return f"timestampdiff(MICROSECOND, {_NOW}, {compiler.process(element.clauses, **kw)})"


@compiles(WaitedInTime, "mysql")
@compiles(WaitedInTime, "mariadb")
def _waited_in_time(element: WaitedInTime, compiler: SQLCompiler, **kw: Any) -> str:
    # SYSDATE(6) is read when the row is judged, after any wait for its lock,
    # and NOW(6) when the statement began (both in the session's time zone).
    until = compiler.process(element.clauses, **kw)
    return f"SYSDATE(6) < timestampadd(MICROSECOND, {until}, NOW(6))"


# A session variable: it outlives the transaction, but every grant that reads
# it sets it first, in the same query. UTC_TIMESTAMP(6) is read when the
# statement begins, after the statements before it in the query waited.
@compiles(InGrantTime, "mysql")
@compiles(InGrantTime, "mariadb")
def _in_grant_time(_element: InGrantTime, _compiler: SQLCompiler, **_kw: Any) -> str:
    return f"{_NOW} < @pathlock_grant_until"


@compiles(SetGrantUntil, "mysql")
@compiles(SetGrantUntil, "mariadb")
def _set_grant_until(_element: SetGrantUntil, compiler: SQLCompiler, **kw: Any) -> str:
    until = compiler.process(bindparam("until_us", type_=BigInteger), **kw)
    return f"SET @pathlock_grant_until = TIMESTAMPADD(MICROSECOND, {until}, {_NOW})"

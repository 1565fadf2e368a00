"""SQLite: the embedded default, for the processes of one host."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import URL, Connection, Engine, Integer, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeEngine

from pathlock._owners import process_user
from pathlock.dialects.base import (
    READ_ONLY,
    Changed,
    Dialect,
    Fenced,
    InsertedId,
    JsonArray,
    MicrosecondsLeft,
    Now,
    NowPlus,
    new_engine,
)
from pathlock.errors import BackendError, InvalidArgument, PathLockError

if TYPE_CHECKING:
    from pathlock.settings import Settings

# SQLite's primary result codes (the low byte of the extended code) when the
# database is locked by another connection for longer than the busy timeout.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

# SQLite keeps time as text ('YYYY-MM-DD HH:MM:SS.SSS', milliseconds); three
# more digits give the six of SQLAlchemy's format, so stored and generated
# values compare as strings in time order.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now'{}) || '000'"


class SQLite(Dialect):
    names = ("sqlite",)
    # The store reads the version back with a SELECT (in-process, under the
    # file's write lock).
    token_from_reply = False
    insert_if_absent = "OR IGNORE"
    async_on_threads = True
    drivers = ("pysqlite",)  # the standard library's sqlite3
    async_driver = "aiosqlite"
    async_drivers = frozenset({"aiosqlite"})
    # The upgrade on open is one transaction: processes that open a new file
    # at once upgrade it once.
    transactional_ddl = True
    upgrades_on_open = True
    # SQLite auto-increments only an INTEGER PRIMARY KEY.
    column_types: ClassVar[dict[str, TypeEngine[Any]]] = {"id": Integer()}
    # A waiter's ticket is its place in the queue: never handed out twice.
    never_reused_options: ClassVar[dict[str, Any]] = {"sqlite_autoincrement": True}

    def sql_header(self, name: str) -> str:  # noqa: ARG002 - one name
        return "-- pathlock's tables, for SQLite."

    def server_version(self, connection: Connection) -> str:
        return f"SQLite {connection.exec_driver_sql('SELECT sqlite_version()').scalar()}"

    def open_engine(self, url: URL, engine_options: dict[str, Any], settings: Settings) -> Engine:
        database = url.database or ""
        if database in ("", ":memory:") or url.query.get("mode") == "memory":
            raise InvalidArgument(
                "pathlock needs a SQLite file that every process can open "
                f"(sqlite:///path/to/file), not an in-memory database: {url}"
            )
        if not url.query.get("uri"):
            _prepare_sqlite_file(Path(database).expanduser())
        connect_args = {
            "timeout": settings.sqlite_busy_timeout,
            # The pool hands a connection to one thread at a time (the heartbeat
            # renews from its own thread).
            "check_same_thread": False,
            **engine_options.pop("connect_args", {}),
        }
        try:
            engine = new_engine(url, connect_args=connect_args, **engine_options)
        except ImportError as error:
            hint = (
                "the asyncio API needs aiosqlite: pip install 'pathlock[async]'"
                if url.get_driver_name() == "aiosqlite"
                else ""
            )
            raise BackendError("creating the database engine", error, hint) from error
        except (SQLAlchemyError, ValueError) as error:
            raise BackendError("creating the database engine", error) from error
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        event.listen(engine, "invalidate", _sqlite_invalidate)
        return engine

    def adopt(self, engine: Engine, settings: Settings) -> tuple[Engine, bool]:
        # Its transactions must begin IMMEDIATE, which is set up per engine:
        # open an engine of pathlock's own on the same file.
        return self.open_engine(engine.url, {}, settings), True

    def before_transaction(self, connection: Connection, ends: float) -> None:
        bound_busy_wait(connection, ends)

    def is_transient(self, error: DBAPIError) -> bool:
        return super().is_transient(error) or self.is_busy(error)

    def is_busy(self, error: DBAPIError) -> bool:
        code = getattr(error.orig, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def _prepare_sqlite_file(path: Path) -> None:
    """Make sure this process can use the SQLite file at ``path``, with an
    error that says what to fix if not; create it (and its directory) if
    need be.

    Processes of several users share one file through a directory they may
    all write to (WAL mode creates ``-wal`` and ``-shm`` files beside it),
    usually group-writable and set-group-ID. A file created here in a
    group-writable directory is writable by the group too, whatever the
    umask; SQLite gives the ``-wal`` and ``-shm`` files the database file's
    permissions."""
    hint = (
        "every process that uses the file must be able to write to it and to its "
        "directory: see 'Several users, one host' in docs/CLI.md"
    )
    problem = PermissionError(f"user {process_user()} cannot write {path} or its directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        wal = path.with_name(path.name + "-wal")
        usable = os.access(path, os.R_OK | os.W_OK) and (
            os.access(wal, os.R_OK | os.W_OK) or os.access(path.parent, os.W_OK | os.X_OK)
        )
        if not usable:
            raise BackendError("opening the SQLite database", problem, hint) from None
        return
    except PermissionError:
        raise BackendError("opening the SQLite database", problem, hint) from None
    except OSError as error:
        raise BackendError("creating the SQLite database", error, hint) from error
    try:
        if path.parent.stat().st_mode & stat.S_IWGRP:
            os.fchmod(descriptor, os.fstat(descriptor).st_mode | stat.S_IRGRP | stat.S_IWGRP)
    finally:
        os.close(descriptor)


def _sqlite_connect(dbapi_connection: Any, record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN itself (see _sqlite_begin):
    # the driver's own transaction handling begins lazily, before the first
    # write only, which would let a transaction read before it holds the lock.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # WAL: readers never block the writer nor each other. FULL: a granted
        # lock survives a power cut, as on a server.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        # A queued request's path rows go with its row (ON DELETE CASCADE):
        # SQLite enforces foreign keys only where a connection asks.
        cursor.execute("PRAGMA foreign_keys=ON")
        # Paths compare byte for byte, LIKE included (it folds ASCII case by
        # default, which would make /A/x a descendant of /a).
        cursor.execute("PRAGMA busy_timeout")
        record.info[_BUSY_CONFIGURED] = record.info[_BUSY_NOW] = int(cursor.fetchone()[0])
        cursor.execute("PRAGMA case_sensitive_like=ON")
        cursor.execute("SELECT 'a' LIKE 'A'")
        if cursor.fetchone()[0]:
            raise PathLockError(
                "this SQLite build ignores PRAGMA case_sensitive_like; "
                "pathlock cannot compare paths exactly on it"
            )
    finally:
        cursor.close()


def _sqlite_invalidate(dbapi_connection: Any, _record: object, _error: object) -> None:
    # A connection is thrown away after an interrupt (Ctrl-C in the middle of
    # a statement, say). Closing it is not enough: while a statement of it is
    # still referenced (by the interrupt's traceback, until the garbage
    # collector runs), SQLite keeps the closed connection alive, and its
    # transaction with it: every other connection of the host then waits for
    # the write lock. Rolling back first lets go of the lock at once; on
    # SQLite that is a local call, which no interrupted protocol can confuse.
    # Closed already, or busy: closing follows anyway.
    with contextlib.suppress(Exception):
        dbapi_connection.rollback()


_BUSY_CONFIGURED = "pathlock_busy_timeout_ms"
_BUSY_NOW = "pathlock_busy_timeout_ms_now"
_ONE_SECOND_MS = 1000


def bound_busy_wait(connection: Connection, ends: float) -> None:
    """On SQLite, let the transaction about to begin on ``connection`` wait
    for the write lock until the monotonic time ``ends`` at most (the
    connection's own busy timeout still applies when it is shorter). Costs
    nothing on a server, and a PRAGMA (in-process, microseconds) on SQLite
    only when the value changes."""
    if connection.dialect.name != "sqlite":
        return
    info = connection.info
    configured = info.get(_BUSY_CONFIGURED)
    if configured is None:  # pragma: no cover - every connection of ours has it
        return
    left = int((ends - time.monotonic()) * 1000)
    # Whole tenths of a second above one second, so that calls with about
    # the same time left share one value and send no PRAGMA.
    if left >= _ONE_SECOND_MS:
        left -= left % 100
    wanted = min(configured, max(left, 1))
    if wanted != info.get(_BUSY_NOW):
        # On the DB-API connection, not through SQLAlchemy: that would begin
        # the transaction (BEGIN IMMEDIATE) before the wait is bounded.
        cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(wanted)}")
        finally:
            cursor.close()
        info[_BUSY_NOW] = wanted


def _sqlite_begin(connection: Any) -> None:
    # Take the write lock at the start of every transaction: the conflict check
    # then reads what the transaction's own write will be judged against.
    # Transactions that only read (listings, a waiter watching the version)
    # need no lock: under WAL they read a snapshot and block no writer.
    read_only = connection.get_execution_options().get(READ_ONLY, False)
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


@compiles(Now, "sqlite")
def _now(_element: Now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "(" + _NOW.format("") + ")"


@compiles(NowPlus, "sqlite")
def _now_plus(element: NowPlus, compiler: SQLCompiler, **kw: Any) -> str:
    shift = f", printf('%+.6f seconds', ({compiler.process(element.clauses, **kw)}) / 1000000.0)"
    return "(" + _NOW.format(shift) + ")"


@compiles(Fenced, "sqlite")
def _fenced(element: Fenced, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(Changed, "sqlite")
def _changed(_element: Changed, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "changes()"


@compiles(InsertedId, "sqlite")
def _inserted_id(_element: InsertedId, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "last_insert_rowid()"


@compiles(JsonArray, "sqlite")
def _json_array(element: JsonArray, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_array({compiler.process(element.clauses, **kw)})"


@compiles(MicrosecondsLeft, "sqlite")
def _microseconds_left(element: MicrosecondsLeft, compiler: SQLCompiler, **kw: Any) -> str:
    then = compiler.process(element.clauses, **kw)
    now = _NOW.format("")
    return f"CAST(round((julianday({then}) - julianday({now})) * 86400000000) AS INTEGER)"

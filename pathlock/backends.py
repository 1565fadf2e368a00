"""The databases pathlock runs on and how it opens them.

- **MySQL / MariaDB** (``mysql+pymysql://...``): the production backend. Every
  transaction runs in READ COMMITTED (see :mod:`pathlock.store`).
- **SQLite** (``sqlite:///path/to/file``): the embedded default, for one host.
  Every transaction that writes starts with ``BEGIN IMMEDIATE``, which takes
  the database's single write lock up front: writers are serialized across all processes that
  open the file, which is what the per-customer sentinel gives on a server
  (only coarser). The file is in WAL mode, so readers never wait. Database time
  is the host's clock, shared by every process on it. pathlock owns such a
  file: the manager brings its schema up to date when it opens it.

With no database given, :func:`default_database_url` applies:
``$PATHLOCK_DATABASE_URL`` if set, else a SQLite file at
``$XDG_STATE_HOME/pathlock/locks.sqlite3`` (``~/.local/state/pathlock/...``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.exc import SQLAlchemyError

from pathlock import batch, deadlines, interrupts
from pathlock.errors import ArgumentTypeError, BackendError, InvalidArgument, PathLockError
from pathlock.routing import node_name
from pathlock.schema import REVISION, VERSION_TABLE

URL_ENV_VAR = "PATHLOCK_DATABASE_URL"
SUPPORTED_DIALECTS = ("mysql", "mariadb", "sqlite")
ISOLATION_LEVEL = "READ COMMITTED"

# How long a SQLite connection waits for the write lock before SQLITE_BUSY
# (which the store then retries). Transactions hold it for well under a
# millisecond, so waiting long means something is wrong.
SQLITE_BUSY_TIMEOUT = 10.0


SOCKET_TIMEOUT = 30
"""Seconds PyMySQL waits for a server's reply (or to send to it) on engines
pathlock creates, before the connection counts as lost. pathlock's statements
take milliseconds; what may legitimately take longer is a commit on a Galera
cluster while it evicts a dead node (about ``evs.suspect_timeout`` + 1 s), or a
row lock held by a long transaction. Keep it above both. Every wait is also
cut to the time its call has left (see :mod:`pathlock.deadlines`)."""

LOCK_WAIT_TIMEOUT = 10
"""Seconds the server lets a statement of pathlock's engines wait for a row
lock (``innodb_lock_wait_timeout``, whole seconds; a smaller value the session
already has is kept). A caller stops waiting when its own time is up, but the
server does not notice a client that went away while its statement waits for a
lock: without this, every caller that gave up on a customer whose client froze
in the middle of a transaction would leave a server thread (and a connection
slot) waiting for the server's default 50 s."""


READ_ONLY = "pathlock_read_only"
"""Execution option of a connection whose transaction only reads."""


def default_sqlite_path() -> Path:
    """Where the embedded default database lives: under the XDG state
    directory, ``~/.local/state`` unless ``$XDG_STATE_HOME`` says otherwise."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "pathlock" / "locks.sqlite3"


def default_database_url() -> str:
    """``$PATHLOCK_DATABASE_URL`` if set, else the embedded SQLite file."""
    return os.environ.get(URL_ENV_VAR) or f"sqlite:///{default_sqlite_path()}"


def check_dialect(name: str) -> None:
    """Refuse databases pathlock has no SQL for, before connecting to them."""
    if name not in SUPPORTED_DIALECTS:
        raise InvalidArgument(
            f"unsupported database {name!r}: pathlock runs on MySQL, MariaDB and SQLite"
        )


def open_engine(database: object, engine_options: dict[str, Any]) -> tuple[Engine, bool]:
    """The engine to use for ``database`` (a URL, a URL string, an Engine or
    ``None`` for the default) and whether pathlock created it (and disposes it)."""
    if database is None:
        database = default_database_url()
    if isinstance(database, Engine):
        if engine_options:
            raise ArgumentTypeError("engine_options only apply when pathlock creates the engine")
        check_dialect(database.dialect.name)
        if database.dialect.name == "sqlite":
            # Its transactions must begin IMMEDIATE, which is set up per
            # engine: open our own engine on the same file.
            return _sqlite_engine(database.url, {}), True
        # The conflict check is only sound under READ COMMITTED (DESIGN.md).
        # An engine created with that level sets it once per connection; any
        # other engine gets it per checkout, which costs a round trip or two.
        if getattr(database.dialect, "_on_connect_isolation_level", None) == ISOLATION_LEVEL:
            return database, False
        return database.execution_options(isolation_level=ISOLATION_LEVEL), False
    if isinstance(database, (str, URL)):
        try:
            url = make_url(database)
        except (SQLAlchemyError, ValueError) as error:
            raise InvalidArgument(f"not a database URL: {error}") from error
        check_dialect(url.get_backend_name())
        if url.get_backend_name() == "sqlite":
            return _sqlite_engine(url, engine_options), True
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
        options["connect_args"] = {
            "read_timeout": SOCKET_TIMEOUT,
            "write_timeout": SOCKET_TIMEOUT,
            **options.get("connect_args", {}),
        }
        try:
            engine = create_engine(url, **options)
        except ImportError as error:
            raise BackendError("creating the database engine", error, _driver_hint(url)) from error
        except (SQLAlchemyError, ValueError) as error:
            raise BackendError("creating the database engine", error) from error
        batch.allow_batches(engine)
        if engine.dialect.driver == "pymysql":
            # After allow_batches' listener, which adds a connection flag.
            event.listen(engine, "do_connect", _bounded_connect)
        event.listen(engine, "connect", _session_settings)
        return engine, True
    kind = type(database).__name__
    raise ArgumentTypeError(
        f"database must be a URL string, a sqlalchemy URL, an Engine or None, got {kind}"
    )


def _driver_hint(url: URL) -> str:
    """What to write instead of a URL whose driver is not installed."""
    if url.get_backend_name() in ("mysql", "mariadb") and url.get_driver_name() != "pymysql":
        return (
            f"pathlock talks to MySQL and MariaDB through PyMySQL: write "
            f"{url.get_backend_name()}+pymysql://... instead of {url.drivername}://..."
        )
    return ""


def open_engines(database: object, engine_options: dict[str, Any]) -> list[tuple[Engine, bool]]:
    """:func:`open_engine` for one database, or for each node of a cluster
    given as a list or tuple of URLs and engines (MySQL or MariaDB only)."""
    # A sqlalchemy URL is a named tuple: one node.
    if not isinstance(database, (list, tuple)) or isinstance(database, URL):
        return [open_engine(database, engine_options)]
    if not database:
        raise InvalidArgument("no database node given: the list is empty")
    opened: list[tuple[Engine, bool]] = []
    try:
        for node in database:
            if node is None:
                raise ArgumentTypeError("a database node must be a URL or an Engine, got None")
            opened.append(open_engine(node, dict(engine_options)))
        _check_nodes([engine for engine, _ in opened])
    except PathLockError:
        for engine, owned in opened:
            if owned:
                engine.dispose()
        raise
    return opened


RENEWAL_POOL = {"pool_size": 1, "max_overflow": 5}
"""The pool of the heartbeat's engines: one renewal round at a time, and up to
``pathlock.manager.STRAGGLERS`` renewals that wait for a busy customer's row."""


def open_renewal_engines(
    opened: list[tuple[Engine, bool]], engine_options: dict[str, Any]
) -> list[tuple[Engine, bool]]:
    """The engines of a manager's renewals, one per engine in ``opened``
    (what :func:`open_engines` returned). For an engine pathlock created, a
    second engine on the same database with a small pool of its own
    (:data:`RENEWAL_POOL`, unless ``engine_options`` configure the pool): many
    threads waiting for locks may hold every connection of the main pool, and
    a renewal that waited behind them could come too late. An engine passed
    in is shared as it is: renewals take their connections from its pool."""
    pool_options = ("poolclass", "pool", "pool_size", "max_overflow")
    options = dict(engine_options)
    if not any(key in options for key in pool_options):
        options.update(RENEWAL_POOL)
    renewal: list[tuple[Engine, bool]] = []
    try:
        for engine, owned in opened:
            renewal.append(open_engine(engine.url, dict(options)) if owned else (engine, False))
    except PathLockError:
        for engine, owned in renewal:
            if owned:
                engine.dispose()
        raise
    return renewal


def _check_nodes(engines: list[Engine]) -> None:
    if len(engines) == 1:
        return
    if any(engine.dialect.name == "sqlite" for engine in engines):
        raise InvalidArgument(
            "several database nodes make sense for a MySQL or MariaDB cluster only, not SQLite"
        )
    names = [node_name(engine) for engine in engines]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidArgument(f"database node given twice: {', '.join(repeated)}")


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
        return deadlines.BoundedConnection(*cargs, **cparams)


def _session_settings(dbapi_connection: Any, _record: object) -> None:
    # Causal reads only where the server is a Galera node with causality
    # checks off (a value set by the operator, globally or in init_command, is
    # kept); MySQL has no such variables. The lock wait is only ever lowered.
    # One SHOW for both, and one SET if anything needs changing, once per
    # connection: nothing per operation.
    with interrupts.let_through():  # round trips: a Ctrl-C may end them
        _apply_session_settings(dbapi_connection)


def _apply_session_settings(dbapi_connection: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(
            "SHOW SESSION VARIABLES WHERE Variable_name IN "
            "('wsrep_on', 'wsrep_sync_wait', 'innodb_lock_wait_timeout')"
        )
        values = {str(name).lower(): str(value) for name, value in cursor.fetchall()}
        settings = []
        if values.get("wsrep_on", "").upper() == "ON" and values.get("wsrep_sync_wait") == "0":
            settings.append(f"wsrep_sync_wait = {WSREP_SYNC_WAIT}")
        lock_wait = values.get("innodb_lock_wait_timeout", "")
        if lock_wait.isdigit() and int(lock_wait) > LOCK_WAIT_TIMEOUT:
            settings.append(f"innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT}")
        if settings:
            cursor.execute("SET SESSION " + ", ".join(settings))
    finally:
        cursor.close()


def _sqlite_engine(url: URL, engine_options: dict[str, Any]) -> Engine:
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        raise InvalidArgument(
            "pathlock needs a SQLite file that every process can open "
            f"(sqlite:///path/to/file), not an in-memory database: {url}"
        )
    if not url.query.get("uri"):
        try:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise BackendError("creating the SQLite database's directory", error) from error
    connect_args = {
        "timeout": SQLITE_BUSY_TIMEOUT,
        # The pool hands a connection to one thread at a time (the heartbeat
        # renews from its own thread).
        "check_same_thread": False,
        **engine_options.pop("connect_args", {}),
    }
    try:
        engine = create_engine(url, connect_args=connect_args, **engine_options)
    except (SQLAlchemyError, ValueError, ImportError) as error:
        raise BackendError("creating the database engine", error) from error
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    event.listen(engine, "invalidate", _sqlite_invalidate)
    return engine


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
        driver = connection.connection.driver_connection
        if driver is not None:
            driver.execute(f"PRAGMA busy_timeout = {int(wanted)}")
            info[_BUSY_NOW] = wanted


def _sqlite_begin(connection: Any) -> None:
    # Take the write lock at the start of every transaction: the conflict check
    # then reads what the transaction's own write will be judged against.
    # Transactions that only read (listings, a waiter watching the version)
    # need no lock: under WAL they read a snapshot and block no writer.
    read_only = connection.get_execution_options().get(READ_ONLY, False)
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def upgrade_sqlite_schema(engine: Engine) -> None:
    """Bring an embedded SQLite database to the current schema: run the
    migrations unless they are at head already. The check and the upgrade run
    in one IMMEDIATE transaction, so processes that open a new file at once
    create its tables once."""
    try:
        with engine.connect() as connection:
            if inspect(connection).has_table(VERSION_TABLE):
                current = connection.execute(
                    text(f"SELECT version_num FROM {VERSION_TABLE}")
                ).scalar()
                if current == REVISION:
                    connection.rollback()
                    return
            from pathlock import migrate  # noqa: PLC0415 - Alembic only when needed

            migrate.upgrade(connection=connection)
            connection.commit()
    except SQLAlchemyError as error:
        raise BackendError("creating the SQLite database's tables", error) from error

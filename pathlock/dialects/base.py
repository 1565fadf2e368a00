"""The interface every database family implements, and the SQL constructs
whose spelling differs between them (each family's module compiles them)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sqlalchemy import (
    URL,
    BigInteger,
    Boolean,
    Connection,
    DateTime,
    Engine,
    Insert,
    LargeBinary,
    String,
    create_engine,
)
from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.exc import CompileError, DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeEngine

from pathlock import _deadlines as deadlines
from pathlock.errors import InvalidArgument
from pathlock.waiting import Hearing

if TYPE_CHECKING:
    from sqlalchemy.engine import CursorResult

    from pathlock.settings import Settings

ISOLATION_LEVEL = "READ COMMITTED"
"""The conflict check is only sound under READ COMMITTED (see the README's
"How it works"): every transaction of pathlock runs in it."""

COMMIT_ALONE = "pathlock_commit_alone"
"""Set (``True``) in a connection's pool record ``info`` by a family whose
server must get that connection's COMMIT on its own, never at the end of a
batch (:mod:`pathlock._batch`): a Galera node (see
:mod:`pathlock.dialects.mysql`)."""

SERVER_SESSION = "pathlock_server_session"
"""Set in a connection's pool record ``info`` by a family whose server runs
what a client sent even after the client hung up: the server's id of the
connection's session and the client address it sees, as a
:class:`ServerSession` (see :meth:`Dialect.end_sessions`)."""


@dataclass(frozen=True, slots=True)
class ServerSession:
    """A connection's session on the server: its id, and the client's
    address as the server sees it (ids start again from 1 when the server
    restarts: both must match); where the server reuses ids while it runs
    (PostgreSQL's are process ids), when the session began too."""

    id: int
    host: str
    since: int = 0
    """When the session began, in microseconds of the server's clock, where
    its id alone does not tell it from a later session's; else 0."""


CHANGED_ROWS = "pathlock_changed_rows"
"""The bind parameter that stands for :class:`Changed` where the database
cannot tell (:attr:`Dialect.counts_from_client`): the row count of the
statement before, which the client passes."""

INSERTED_ID = "pathlock_inserted_id"
"""The bind parameter that stands for :class:`InsertedId` where the database
cannot tell (:attr:`Dialect.counts_from_client`)."""

BATCHED = "pathlock_batched"
"""The compile keyword (``compile_kwargs``) with which statements that
travel several to a query are compiled (:mod:`pathlock._batch`): a family
whose constructs are spelled differently there (:class:`Changed` read from
what the statement before left on the server, where the client cannot pass
it) looks for it in its ``@compiles`` functions' keywords."""

READ_ONLY = "pathlock_read_only"
"""Execution option of a connection whose transaction only reads."""


class Now(FunctionElement[datetime]):
    """The database's current UTC time, to the microsecond."""

    type = DateTime()
    inherit_cache = True


class NowPlus(FunctionElement[datetime]):
    """The database's current UTC time plus a number of microseconds."""

    type = DateTime()
    inherit_cache = True


class Fenced(FunctionElement[int]):
    """An expression whose value an UPDATE hands back to the client, where
    the database can (the sentinel's new version: the fencing token)."""

    type = BigInteger()
    inherit_cache = True


class Changed(FunctionElement[int]):
    """How many rows the statement before this one, on the same connection,
    inserted, deleted or matched (MySQL's ``ROW_COUNT()``, SQLite's
    ``changes()``)."""

    type = BigInteger()
    inherit_cache = True


class InsertedId(FunctionElement[int]):
    """The id the last INSERT of this connection generated, or the last
    value :class:`Fenced` handed back (MySQL's ``LAST_INSERT_ID()``,
    SQLite's ``last_insert_rowid()``)."""

    type = BigInteger()
    inherit_cache = True


class Notice(FunctionElement[str]):
    """Tells every session listening for pathlock's notices, when the
    transaction commits, its one argument (text): what a release that
    handed paths to a queued request sends, for the process of that request
    to wake it at once (see :meth:`Dialect.listen`). Only a family whose
    :attr:`Dialect.notices` is true spells it."""

    type = String()
    inherit_cache = True


class JsonArray(FunctionElement[str]):
    """Its arguments as the text of one JSON array (times as ISO 8601
    text), for reads whose rows the client parses."""

    type = String()
    inherit_cache = True


class MicrosecondsLeft(FunctionElement[int]):
    """The microseconds from the database's current UTC time (:class:`Now`)
    to its one argument, a time."""

    type = BigInteger()
    inherit_cache = True


class WaitedInTime(FunctionElement[bool]):
    """Whether the row is judged (after any wait for its lock) before the
    client stops waiting: the statement's start plus its one argument, in
    microseconds (the client's time left), in the database's clock."""

    type = Boolean()
    inherit_cache = True
    _is_implicitly_boolean = True


class InGrantTime(FunctionElement[bool]):
    """Whether the statement runs (after any wait for a lock in the
    statements before it) before the time :class:`SetGrantUntil` kept for
    this transaction."""

    type = Boolean()
    inherit_cache = True
    _is_implicitly_boolean = True


class SetGrantUntil(Executable, ClauseElement):
    """A statement that keeps, for the rest of its transaction, the
    database's current UTC time plus its ``until_us`` parameter (until when
    the client waits for the reply): :class:`InGrantTime` reads it."""

    inherit_cache = True
    _traverse_internals = []  # noqa: RUF012 - SQLAlchemy's own attribute


@compiles(Now)
@compiles(NowPlus)
@compiles(Fenced)
@compiles(Changed)
@compiles(InsertedId)
@compiles(JsonArray)
@compiles(Notice)
@compiles(MicrosecondsLeft)
@compiles(WaitedInTime)
@compiles(InGrantTime)
@compiles(SetGrantUntil)
def _unspelled(element: ClauseElement, compiler: Any, **_kw: Any) -> str:
    # Each family spells these for its own dialect names; any other database
    # has no spelling, rather than MySQL's by default.
    raise CompileError(
        f"pathlock has no SQL for {type(element).__name__} on {compiler.dialect.name}: "
        "its dialect module must compile it (see docs/EXTENDING.md)"
    )


class Bytes(FunctionElement[bytes]):
    """Its one argument, which holds bytes or NULL: spelled as it is, except
    where the database must be told its type (PostgreSQL types a NULL
    parameter as text)."""

    type = LargeBinary()
    inherit_cache = True


@compiles(Bytes)
def _bytes(element: Bytes, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


class _PathLookup(FunctionElement[bool]):
    """How every statement looks paths up in the ``(customer_id, path)``
    index (:class:`PathIn`, :class:`PathIs`, :class:`PathWithin`), spelled
    by a family whose index holds less than the whole path (see
    :mod:`pathlock.dialects.postgresql`); elsewhere, the plain comparison."""

    type = Boolean()
    inherit_cache = True
    # A condition as it stands (no "= 1" after it where booleans are numbers).
    _is_implicitly_boolean = True


class PathIn(_PathLookup):
    """``path IN (:values)``: ``path`` a column of paths, ``values`` an
    expanding parameter."""

    inherit_cache = True


class PathIs(_PathLookup):
    """``path = value``."""

    inherit_cache = True


class PathWithin(_PathLookup):
    """``low <= path AND path < high``."""

    inherit_cache = True


@compiles(PathIn)
def _path_in(element: PathIn, compiler: Any, **kw: Any) -> str:
    path, values = element.clauses.clauses
    return str(compiler.process(path.in_(values), **kw))


@compiles(PathIs)
def _path_is(element: PathIs, compiler: Any, **kw: Any) -> str:
    path, value = element.clauses.clauses
    return str(compiler.process(path == value, **kw))


@compiles(PathWithin)
def path_within(element: PathWithin, compiler: Any, **kw: Any) -> str:
    """``low <= path AND path < high``, as every family compares paths (a
    family's own spelling may add to it)."""
    # Written out, each operand compiled once: a request of a thousand paths
    # has a thousand of these, and compiling them as SQLAlchemy comparisons
    # was most of the time its first statements took to compile.
    path, low, high = element.clauses.clauses
    column = compiler.process(path, **kw)
    # The parameters as a comparison with the column types them.
    bottom = compiler.process((path >= low).right, **kw)
    top = compiler.process((path < high).right, **kw)
    return f"{column} >= {bottom} AND {column} < {top}"


class InsertIfAbsent(Insert):
    """An INSERT that skips a row whose key exists already, spelled by each
    family: its :attr:`Dialect.insert_if_absent` prefix (given by
    :func:`pathlock.dialects.insert_if_absent`) and its
    :attr:`Dialect.insert_if_absent_clause` after the values."""

    inherit_cache = True


@compiles(InsertIfAbsent)
def _insert_if_absent(element: InsertIfAbsent, compiler: Any, **kw: Any) -> str:
    sql: str = compiler.visit_insert(element, **kw)
    each = family(compiler.dialect.name)
    clause = "" if each is None else each.insert_if_absent_clause
    if not clause:
        return sql
    key = next(iter(element.table.primary_key.columns))  # type: ignore[attr-defined]
    return f"{sql} {clause.format(key=compiler.preparer.quote(key.name))}"


# What a family must set: the class attributes without a default.
_NO_DEFAULT = ("token_from_reply", "insert_if_absent")

# Every registered family, by each of its names: filled by Dialect's
# __init_subclass__, read through family() and families().
_by_name: dict[str, Dialect] = {}


def family(name: str) -> Dialect | None:
    """The registered family of SQLAlchemy's dialect ``name``, if any."""
    return _by_name.get(name)


def families() -> tuple[Dialect, ...]:
    """Every registered family once, in the order they registered."""
    return tuple(dict.fromkeys(_by_name.values()))


class Dialect:
    """What pathlock needs to know about one family of databases. One
    instance per family serves every engine of it (it keeps no state).

    A subclass that sets :attr:`names` is a family: defining it registers it
    (one instance, found by each of its names), as Alembic's ``DefaultImpl``
    subclasses register by their ``__dialect__``. A subclass without
    ``names`` of its own is a base for families and registers nothing.

    The SQL constructs above are compiled by each family's module (with
    SQLAlchemy's ``@compiles``), so statements are written once."""

    names: ClassVar[tuple[str, ...]]
    """SQLAlchemy's dialect names of the family (``engine.dialect.name``):
    setting them registers the family."""

    token_from_reply: ClassVar[bool]
    """Whether the sentinel write's reply carries the new version
    (``cursor.lastrowid``), or a SELECT must read it."""

    insert_if_absent: ClassVar[str]
    """The INSERT prefix that skips a row whose key exists already (``""``:
    none, the clause below does it)."""

    insert_if_absent_clause: ClassVar[str] = ""
    """The clause after an INSERT's values that skips a row whose key exists
    already (``{key}`` stands for the table's key column, quoted), where the
    prefix does not do it; ``""``: none."""

    several_nodes: ClassVar[bool] = False
    """Whether several databases may be the nodes of one cluster."""

    table_options: ClassVar[dict[str, Any]] = {}
    """Keyword arguments of every pathlock table (``Table(..., **options)``),
    prefixed with the family's dialect names as SQLAlchemy wants them: the
    storage engine, the character set and the collation that makes paths
    compare byte for byte."""

    path_index_options: ClassVar[dict[str, Any]] = {}
    """Keyword arguments of the ``(customer_id, path)`` index: where index
    keys are limited, the length of the path prefix it holds."""

    upgrades_on_open: ClassVar[bool] = False
    """Whether pathlock brings the tables up to date itself when it opens the
    database (an embedded file of one host), rather than a DBA running the
    migrations (and the manager checking their revision)."""

    index_hint: ClassVar[str | None] = None
    """How a query names the index it must use (``{index}`` stands for its
    name), where the planner may otherwise scan: the conflict query's
    lookups by computed values are costed from statistics that may be stale."""

    never_reused_options: ClassVar[dict[str, Any]] = {}
    """Keyword arguments of a table whose auto-incremented key must never be
    handed out twice, even after the newest row was deleted (the queue's
    tickets)."""

    column_types: ClassVar[dict[str, TypeEngine[Any]]] = {}
    """The family's own type for a kind of column, where the portable one
    does not do: ``"id"`` (a BIGINT key that auto-increments),
    ``"timestamp"`` (microseconds), ``"long_text"`` (a waiter's paths, up
    to 100,000 characters and more) and ``"long_binary"`` (a lease's data,
    up to 64 KiB and a byte)."""

    unseen_tables: ClassVar[str] = ""
    """What else the error of missing tables may mean on this family, after
    the advice to create them (``""``: nothing else)."""

    drivers: ClassVar[tuple[str, ...]] = ()
    """The synchronous drivers pathlock reaches the family through, the one to
    name first: a URL that names another one is refused, by both APIs alike
    (the asyncio API reads these with :attr:`async_driver`), whatever
    drivers are installed; ``()``: any."""

    async_driver: ClassVar[str | None] = None
    """The asyncio driver the asyncio API (:class:`AsyncPathLockManager`) uses
    for this family: a URL naming another driver is read with this one."""

    async_drivers: ClassVar[frozenset[str]] = frozenset()
    """Every asyncio driver a URL of the family may name, :attr:`async_driver`
    among them: such a URL is opened as an asyncio engine, which serves the
    asyncio API only (:data:`ASYNC_DRIVERS` is every family's)."""

    transactional_ddl: ClassVar[bool] = False
    """Whether the migrations run as one transaction on a connection pathlock
    hands them (the upgrade of a database it opens, :attr:`upgrades_on_open`):
    processes that open a new database at once then upgrade it once."""

    async_on_threads: ClassVar[bool] = False
    """Whether the asyncio API reaches this family through its synchronous
    driver, unless the URL names the asyncio driver: each transaction runs
    whole on the loop's own thread, or on a worker thread if it would have
    to wait for a lock (:meth:`is_busy`). For an embedded database, whose
    driver calls are quick and many: an asyncio driver costs a hand-off
    between the loop and a thread per call."""

    counts_from_client: ClassVar[bool] = False
    """Whether the database cannot tell a statement how many rows the one
    before it changed, or which id it generated (:class:`Changed`,
    :class:`InsertedId`): the family compiles them as the bind parameters
    :data:`CHANGED_ROWS` and :data:`INSERTED_ID`, whose values the store
    passes from the previous statement's reply. Statements then travel one
    by one (no batch can carry them)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "names" not in vars(cls):
            return  # a base for families, not a family
        if not cls.names or not all(isinstance(name, str) and name for name in cls.names):
            raise TypeError(f"{cls.__qualname__}.names must be SQLAlchemy dialect names")
        unset = [member for member in _NO_DEFAULT if not hasattr(cls, member)]
        if unset:
            raise TypeError(f"{cls.__qualname__} must set {' and '.join(unset)}: no default")
        if cls.async_driver is not None and cls.async_driver not in cls.async_drivers:
            raise TypeError(f"{cls.__qualname__}.async_drivers must hold its async_driver")
        taken = {name: _by_name[name] for name in cls.names if name in _by_name}
        if taken:
            raise ValueError(
                f"{cls.__qualname__} claims {', '.join(map(repr, taken))}, which "
                f"{type(next(iter(taken.values()))).__qualname__} has registered already"
            )
        instance = cls()
        for name in cls.names:
            _by_name[name] = instance

    def offline_url(self, name: str) -> str:
        """A URL without a server for SQLAlchemy's dialect ``name`` of the
        family: ``pathlock db upgrade --sql --dialect NAME`` prints the SQL
        for it. By default the bare name (SQLAlchemy's default driver)."""
        return f"{name}://"

    def sql_header(self, name: str) -> str:
        """The first lines of the SQL printed for ``name`` (``--sql``): an SQL
        comment that says which server it is for and, where the SQL works on
        that server alone, a statement that fails on any other, so that a
        client stops before anything is created."""
        return f"-- pathlock's tables, for {name}."

    def async_url(self, url: URL) -> URL:
        """``url`` with the family's asyncio driver (``mysql+pymysql://`` ->
        ``mysql+asyncmy://``); a URL that names an asyncio driver already is
        returned."""
        driver = self.async_driver
        if driver is None:
            raise InvalidArgument(f"pathlock has no asyncio driver for {url.get_backend_name()}")
        if url.get_driver_name() in ASYNC_DRIVERS:
            return url  # an asyncio driver the caller chose (aiomysql, say)
        return url.set(drivername=f"{url.get_backend_name()}+{driver}")

    def skips_locked_rows(self, dialect: SQLAlchemyDialect) -> bool:  # noqa: ARG002
        """Whether the connected server knows ``FOR UPDATE SKIP LOCKED``."""
        return False

    def server_version(self, connection: Connection) -> str:
        """The server's name and version, for people (``pathlock info``)."""
        raise NotImplementedError

    def open_engine(self, url: URL, engine_options: dict[str, Any], settings: Settings) -> Engine:
        """An engine pathlock creates (and later disposes) for ``url``, set
        up as pathlock needs it; ``engine_options`` are the caller's extra
        ``create_engine`` arguments."""
        raise NotImplementedError

    def adopt(self, engine: Engine, settings: Settings) -> tuple[Engine, bool]:  # noqa: ARG002
        """The engine to use for a caller's ``engine``, and whether pathlock
        created it. By default the caller's own, in READ COMMITTED: an engine
        created with that level sets it once per connection; any other gets
        it per checkout, which costs a round trip or two."""
        if getattr(engine.dialect, "_on_connect_isolation_level", None) == ISOLATION_LEVEL:
            return engine, False
        return engine.execution_options(isolation_level=ISOLATION_LEVEL), False

    def before_transaction(self, connection: Connection, ends: float) -> None:
        """Called before each transaction's first statement, with the
        monotonic time by which the call must end."""

    @staticmethod
    def error_code(error: DBAPIError) -> int | None:
        """The driver's numeric error code, if it has one."""
        args = getattr(error.orig, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
        return None

    def is_transient(self, error: DBAPIError) -> bool:
        """Worth another try: the transaction was rolled back (a deadlock, a
        lock-wait timeout, a lost connection), or its outcome is checked."""
        return bool(error.connection_invalidated)

    def is_busy(self, error: DBAPIError) -> bool:  # noqa: ARG002 - a family may need it
        """An embedded database's write lock was held by another connection
        for longer than the transaction could wait: it was rolled back
        before it wrote anything."""
        return False

    def is_lost_race(self, error: DBAPIError) -> bool:  # noqa: ARG002 - a family may need it
        """Lost a race with another transaction of the same customer:
        retried for as long as the caller may wait, not a number of times."""
        return False

    def is_node_failure(self, error: DBAPIError) -> bool:  # noqa: ARG002
        """The node is gone, restarting or cannot serve: a manager with
        several nodes moves on to the next."""
        return False

    def is_missing_table(self, error: DBAPIError) -> bool:
        """pathlock's tables are not there (no migration ran)."""
        return "no such table" in str(error.orig)

    def hint(self, error: DBAPIError) -> str:  # noqa: ARG002 - a family may need it
        """What to do about ``error``, which pathlock does not retry, where
        the family knows (said with the error); else ``""``."""
        return ""

    def is_timeout(self, error: DBAPIError) -> bool:  # noqa: ARG002
        """The driver gave up waiting for the server's reply (a socket
        timeout): a hung node, or a statement waiting for a row lock. With
        several nodes, the node is asked whether it is alive (:meth:`ping`)
        before it is passed over."""
        return False

    def is_duplicate(self, error: DBAPIError) -> bool:
        """The table, or the row, exists already: another process created it
        first (``create_schema()`` from many processes at once)."""
        message = str(error.orig)
        return "already exists" in message or "UNIQUE constraint failed" in message

    def ping(self, connection: Connection) -> None:
        """The cheapest statement the server must answer (whether a node that
        timed out is alive)."""
        connection.exec_driver_sql("SELECT 1")

    def end_sessions(
        self,
        connection: Connection,  # noqa: ARG002 - a family with sessions needs it
        sessions: Collection[ServerSession],  # noqa: ARG002
        ends: float,  # noqa: ARG002
    ) -> set[ServerSession]:
        """End ``sessions`` of connections that were dropped in the middle of
        an operation (see :data:`SERVER_SESSION`), through ``connection``,
        and wait for them to be gone, until the monotonic time ``ends``:
        those still there then. A family without such sessions has none."""
        return set()

    def integer_rows(self, rows: Sequence[tuple[int, int]]) -> str | None:  # noqa: ARG002
        """How the family writes a derived table of ``(k, n)`` pairs of
        integers, columns ``k`` and ``n``, into a statement (a request's paths
        and the lengths their ancestors are cut at); ``None`` (the default): a
        ``UNION ALL`` of ``SELECT``s, nested in blocks."""
        return None

    def inserted_id(self, result: CursorResult[Any]) -> int:
        """The id the INSERT whose reply is ``result`` generated (the DB-API's
        ``lastrowid`` by default); 0 for any other statement."""
        return result.lastrowid

    def in_batch(self, sql: str, compiled: SQLCompiler) -> str:  # noqa: ARG002
        """``sql``, the SQL of the statement ``compiled`` (compiled with
        :data:`BATCHED`), as it travels in a batch: as it is, by default. A
        family whose statements must be wrapped there to reply as MySQL's do
        (their row count and generated id: see :mod:`pathlock._batch`) wraps
        them here."""
        return sql

    def enable_batches(self, engine: Engine) -> None:
        """Let connections of ``engine`` (one pathlock created) take several
        statements per round trip, where the driver can."""

    def can_batch(self, connection: Connection) -> bool:  # noqa: ARG002
        """Whether ``connection`` takes several statements per round trip."""
        return False

    @property
    def batches(self) -> bool:
        """Whether engines of this family that pathlock creates batch."""
        return False

    notices: ClassVar[bool] = False
    """Whether a release that hands paths to a queued request tells the
    request's process so at once, in its transaction (:class:`Notice`), for
    :meth:`listen` to hear: then the request waits for that, rather than
    reading the database every millisecond or so while it is next in line."""

    def listen(
        self,
        engine: Engine,  # noqa: ARG002 - a family with notices needs them
        heard: Callable[[int, int], None],  # noqa: ARG002
    ) -> Hearing | None:
        """Start hearing the notices of hand-overs on ``engine``'s database
        (:attr:`notices`), on a connection of their own that this process
        shares among its listeners: ``heard(customer_id, ticket)`` is called,
        from another thread, for each hand-over to the queued request
        ``ticket``. ``None`` where the family, or ``engine``, has no notices."""
        return None


_T = TypeVar("_T")


class _AsyncDrivers(AbstractSet[str]):
    """The asyncio drivers of every registered family, read when asked."""

    @staticmethod
    def _now() -> frozenset[str]:
        return frozenset(driver for family in families() for driver in family.async_drivers)

    @classmethod
    def _from_iterable(cls, items: Iterable[_T]) -> frozenset[_T]:
        return frozenset(items)  # what "|", "&" and "-" make: a plain frozenset

    def __contains__(self, driver: object) -> bool:
        return driver in self._now()

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())

    def __repr__(self) -> str:
        return f"ASYNC_DRIVERS{set(self._now())!r}"


ASYNC_DRIVERS: AbstractSet[str] = _AsyncDrivers()
"""Drivers that speak asyncio (every family's :attr:`Dialect.async_drivers`):
their engines serve the asyncio API only."""


def is_async(engine: Engine) -> bool:
    """Whether ``engine`` talks to its database through an asyncio driver
    (the synchronous face of an :class:`~sqlalchemy.ext.asyncio.AsyncEngine`)."""
    return bool(getattr(engine.dialect, "is_async", False))


def new_engine(url: URL, **options: Any) -> Engine:
    """``create_engine(url, **options)``; for an asyncio driver, the
    synchronous face of a new :class:`~sqlalchemy.ext.asyncio.AsyncEngine`,
    which pathlock's code runs inside greenlets (see :mod:`pathlock._aio`).
    Unless ``options`` choose the pool, its wait for a free connection ends
    with the call's time limit (:func:`pathlock._deadlines.bounded_pool`)."""
    asynchronous = url.get_driver_name() in ASYNC_DRIVERS
    if "poolclass" not in options and "pool" not in options:
        dialect: Any = url.get_dialect(_is_async=asynchronous)
        default = dialect.get_pool_class(url)
        options["poolclass"] = deadlines.bounded_pool(default)
    if asynchronous:
        from sqlalchemy.ext.asyncio import create_async_engine  # noqa: PLC0415 - greenlet

        return create_async_engine(url, **options).sync_engine
    return create_engine(url, **options)

"""The tables, defined once in SQLAlchemy Core.

Alembic's ``migrations/env.py`` points ``target_metadata`` at :data:`metadata`,
and a test proves the migrated schema equals it. The library never changes a
schema on its own: ``PathLockManager.create_schema()`` is an explicit call for
quick starts and tests (:func:`create_tables`); production runs the migrations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    inspect,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from pathlock import dialects
from pathlock._core.limits import (
    LEASE_ID_LENGTH,
    NODE_ID_LENGTH,
    OWNER_KEY_LENGTH,
    REASON_LENGTH,
    THREAD_LENGTH,
)
from pathlock.paths import MAX_PATH_LENGTH

if TYPE_CHECKING:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import FetchedValue

# A new revision in migrations/versions/ is added here too. The ids are not
# read from that directory when pathlock is imported: on a server the library
# never loads its migrations (a DBA runs them), so it runs today where they
# are not files it could read (a zip, a frozen application, .pyc only).
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011")
"""Every revision shipped, oldest first (a test checks them against the
migrations): a recorded revision not among them was made by a newer pathlock."""
REVISION = REVISIONS[-1]
"""The Alembic revision these tables correspond to, the newest one shipped:
lets a SQLite database be checked without loading Alembic."""
VERSION_TABLE = "pathlock_alembic_version"

# Deterministic constraint names, so migrations can refer to them.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    },
    # Marks pathlock's own tables for the dialects' DDL (the MySQL family's
    # NO PAD collation applies to these only).
    info={"pathlock": True},
)

# What differs between the databases (engine, character set, collation, index
# prefix, column types) is each dialect's (pathlock.dialects): the tables are
# written once, with every family's options.
_TABLE = dialects.table_options()
PATH_INDEX = dialects.path_index_options()


# BIGINT keys that auto-increment.
_BigId = dialects.column_type("id", BigInteger())
# Microsecond precision: leases of a few milliseconds must expire in order.
_Timestamp = dialects.column_type("timestamp", DateTime())
# A waiter's paths as JSON: up to 100,000 characters of paths and more.
_LongText = dialects.column_type("long_text", Text())
_LongBinary = dialects.column_type("long_binary", LargeBinary())
# A path: compared byte for byte, ranges included (see path_locks).
_Path = dialects.column_type("path", String(MAX_PATH_LENGTH))


def _lease_data() -> Column[bytes]:
    # The lease's data (revision 0009): what the caller gave with its request
    # (CustomerLocks.lock_paths(data=...)), on the queue row while it waits
    # and on the row of its first path once granted (NULL on the others, and
    # where none was given). One byte says what it was: 0 bytes, 1 text
    # (UTF-8), then the value (pathlock._core.records.lease_data).
    return Column("data", _LongBinary, nullable=True)


def _shallow() -> Column[bool]:
    # Whether the lock (or the queued request's path) is on the path alone,
    # at depth 0, rather than on its subtree (revision 0010): it meets rows on
    # the same path and rows on its ancestors that cover their subtree, and
    # does not reach below its path. False on rows written before it.
    return Column("shallow", Boolean, nullable=False, server_default="0")


def _owner_key() -> Column[str]:
    # The owner's identity (pathlock._owners); '' on rows written before it.
    # Last, where revision 0004 added it.
    return Column("owner_key", String(OWNER_KEY_LENGTH), nullable=False, server_default="")


def _owner_columns() -> list[Column[object]]:
    return [
        Column("node_id", String(NODE_ID_LENGTH), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("thread", String(THREAD_LENGTH), nullable=False),
        Column("reason", String(REASON_LENGTH), nullable=False, server_default=""),
    ]


customer_locks = Table(
    "customer_locks",
    metadata,
    # The per-customer sentinel: every grant and release writes this row first,
    # which serializes them per customer (on Galera too, where only conflicting
    # writes abort each other). Its version is the fencing token; rows are never
    # deleted, so tokens never go back.
    Column("customer_id", BigInteger, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False, server_default="0"),
    # Whether the customer's paths are case-folded: recorded by the first grant
    # (NULL until then, and on rows written before revision 0005). Managers
    # with the other setting are refused, since their paths would never meet
    # the folded ones: /Shared/Foo and /shared/foo would both be granted.
    Column("case_insensitive", Boolean, nullable=True),
    # How many rows the customer has in path_locks and in path_lock_waiters,
    # live or expired (revision 0008): a grant to a customer with neither
    # needs no conflict or queue search. Kept in the transactions that insert
    # and delete those rows. They count only while ``counted_version`` equals
    # ``version``: every sentinel write of this pathlock moves both, so a write
    # that moves the version alone (a pathlock without the counts, during a
    # rolling upgrade) leaves them uncounted until the reaper counts again.
    # NULL: never counted.
    Column("lock_rows", BigInteger, nullable=True),
    Column("waiter_rows", BigInteger, nullable=True),
    Column("counted_version", BigInteger, nullable=True),
    **_TABLE,
)

path_locks = Table(
    "path_locks",
    metadata,
    Column("id", _BigId, primary_key=True, autoincrement=True),
    Column("customer_id", BigInteger, nullable=False),
    Column("lease_id", String(LEASE_ID_LENGTH), nullable=False),
    Column("path", _Path, nullable=False),
    Column("mode", String(9), nullable=False),
    *_owner_columns(),
    Column("fencing_token", BigInteger, nullable=False),
    Column("created_at", _Timestamp, nullable=False),
    Column("expires_at", _Timestamp, nullable=False),
    _owner_key(),
    _lease_data(),
    _shallow(),
    CheckConstraint("mode IN ('exclusive', 'shared')", name="mode"),
    # The conflict query: one customer, exact paths (self and ancestors) and
    # ranges of descendants (LIKE 'prefix/%').
    Index(None, "customer_id", "path", **PATH_INDEX),
    Index(None, "lease_id"),  # release and renewal of one lease
    Index(None, "expires_at"),  # the reaper's scan
    Index(None, "node_id", "pid", "thread"),  # node clean-up
    Index(None, "customer_id", "owner_key"),  # release_locks(), the owner's own locks
    **_TABLE,
)

path_lock_waiters = Table(
    "path_lock_waiters",
    metadata,
    # The queue of blocked requests, oldest ticket first.
    Column("ticket", _BigId, primary_key=True, autoincrement=True),
    Column("customer_id", BigInteger, nullable=False),
    Column("lease_id", String(LEASE_ID_LENGTH), nullable=False),
    # JSON list of [path, mode] pairs ([path, mode, 0] at depth 0): a request
    # is read and compared as a whole.
    # MEDIUMTEXT on MySQL: TEXT's 64 KiB is less than a valid request may need.
    Column("paths", _LongText, nullable=False),
    *_owner_columns(),
    Column("created_at", _Timestamp, nullable=False),
    # Short, refreshed while the waiter is alive: a dead waiter stops blocking
    # others once it lapses.
    Column("expires_at", _Timestamp, nullable=False),
    _owner_key(),
    # How long paths a release grants the request last until it takes them up
    # (microseconds; revision 0006). NULL on rows of older versions, which do
    # not take paths handed over: releases leave them to try for themselves.
    Column("hand_over_us", BigInteger, nullable=True),
    _lease_data(),
    Index(None, "customer_id", "ticket"),
    Index(None, "lease_id"),
    Index(None, "expires_at"),
    Index(None, "node_id", "pid", "thread"),
    # Tickets never repeat (SQLite would reuse the highest rowid once deleted).
    **dialects.never_reused_options(),
    **_TABLE,
)

path_lock_waiter_paths = Table(
    "path_lock_waiter_paths",
    metadata,
    # One row per (queued request, path), beside the request's row (revision
    # 0007): "is an older request that conflicts with mine queued?" is then
    # the conflict query on an index, as for live locks, instead of a read of
    # the customer's whole queue. They go with their request's row (ON DELETE
    # CASCADE), whoever deletes it: a grant, a give-up, the reaper, an operator.
    Column("id", _BigId, primary_key=True, autoincrement=True),
    Column(
        "ticket",
        BigInteger,
        ForeignKey(path_lock_waiters.c.ticket, ondelete="CASCADE"),
        nullable=False,
    ),
    Column("customer_id", BigInteger, nullable=False),
    Column("path", _Path, nullable=False),
    Column("mode", String(9), nullable=False),
    _shallow(),
    CheckConstraint("mode IN ('exclusive', 'shared')", name="mode"),
    Index(None, "customer_id", "path", **PATH_INDEX),
    Index(None, "ticket"),
    **_TABLE,
)


def compare_server_default(
    _context: MigrationContext,
    _inspected_column: Column[Any],
    _metadata_column: Column[Any],
    inspected_default: str | None,
    _metadata_default: FetchedValue | None,
    rendered_metadata_default: str | None,
) -> bool | None:
    """Alembic's ``compare_server_default`` hook for these tables.

    Alembic's MySQL comparison (1.20) quotes a string default before comparing
    it with the reflected one, but skips that step for the empty string, so the
    reflected ``DEFAULT ''`` never equals ``server_default=""`` and autogenerate
    would propose the same ``alter_column`` forever. Only that exact pair is
    settled here; ``None`` hands every other default to Alembic's comparison.
    """
    if rendered_metadata_default == "" and inspected_default == "''":
        return False
    return None


# Alembic's version table, as Alembic creates it: create_schema() records the
# revision it made, so that `pathlock db upgrade` afterwards finds nothing to do.
version_table = Table(
    VERSION_TABLE,
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
)

_RACES = 5  # create_tables() attempts while other processes create the same tables


def create_tables(engine: Engine) -> None:
    """Create pathlock's tables that do not exist yet (``create_schema()``).
    If none existed, record :data:`REVISION` as the database's revision, as
    the migrations would. Never alters an existing table. Safe to call from
    many processes at once: a table or a revision another process created in
    the meantime is taken as created."""
    with engine.connect() as connection:
        fresh = not set(inspect(connection).get_table_names()) & set(metadata.tables)
        connection.rollback()
    for attempt in range(1, _RACES + 1):
        try:
            with engine.begin() as connection:
                metadata.create_all(connection)
                if fresh:
                    version_table.create(connection, checkfirst=True)
                    recorded = connection.execute(select(version_table.c.version_num)).first()
                    if recorded is None:
                        connection.execute(version_table.insert().values(version_num=REVISION))
        except DBAPIError as error:
            dialect = dialects.for_name(engine.dialect.name)
            if attempt == _RACES or not dialect.is_duplicate(error):
                raise
        else:
            return

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
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    inspect,
    select,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.compiler import DDLCompiler

from pathlock.paths import MAX_PATH_LENGTH

if TYPE_CHECKING:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import FetchedValue

REVISION = "0004"
"""The Alembic revision these tables correspond to (a test checks it is the
newest one shipped): lets a SQLite database be checked without loading Alembic."""
REVISIONS = ("0001", "0002", "0003", "0004")
"""Every revision shipped, oldest first (a test checks them against the
migrations): a recorded revision not among them was made by a newer pathlock."""
VERSION_TABLE = "pathlock_alembic_version"

# Deterministic constraint names, so migrations can refer to them.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# Paths compare byte for byte: a case- or accent-insensitive collation would make
# /Shared/A and /Shared/a (or café and cafe) one lock. Normalization (NFC, optional
# case folding) happens in Python, where it is explicit.
PAD_SPACE_COLLATION = "utf8mb4_bin"
# Spelled for both dialect names: SQLAlchemy's "mariadb" dialect (a
# mariadb+pymysql:// URL) reads only mariadb_* options, "mysql" only mysql_*.
_MYSQL_TABLE: dict[str, Any] = {
    f"{name}_{option}": value
    for name in ("mysql", "mariadb")
    for option, value in (
        ("engine", "InnoDB"),
        ("charset", "utf8mb4"),
        ("collate", PAD_SPACE_COLLATION),
    )
}


def no_pad_collation(dialect: Dialect) -> str:
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
    # pathlock's own tables only: the table option above stands for the
    # server's NO PAD binary collation. Other tables of the application pass
    # through untouched.
    text: str = compiler.visit_create_table(element, **kw)  # type: ignore[no-untyped-call]
    if element.element.metadata is metadata:
        collation = no_pad_collation(compiler.dialect)
        text = text.replace(f"COLLATE {PAD_SPACE_COLLATION}", f"COLLATE {collation}")
    return text


# InnoDB index keys are limited to 3072 bytes: 700 utf8mb4 characters plus the
# customer id fit. Longer paths are still found exactly (the server compares the
# full column after the index narrows the range); they only share index entries.
PATH_INDEX_PREFIX = 700

LEASE_ID_LENGTH = 32
REASON_LENGTH = 1000
NODE_ID_LENGTH = 255
THREAD_LENGTH = 64
# A manager's identity (16 hex digits), a dot and a holder: "t12", "a7" or
# "n" + 24 hex digits of a caller's owner name (see pathlock.owners).
OWNER_KEY_LENGTH = 64

# BIGINT keys everywhere, but SQLite only auto-increments INTEGER PRIMARY KEY.
_BigId = BigInteger().with_variant(Integer(), "sqlite")
# Microsecond precision: leases of a few milliseconds must expire in order.
_Timestamp = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _owner_key() -> Column[str]:
    # The owner's identity (pathlock.owners); '' on rows written before it.
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
    **_MYSQL_TABLE,
)

path_locks = Table(
    "path_locks",
    metadata,
    Column("id", _BigId, primary_key=True, autoincrement=True),
    Column("customer_id", BigInteger, nullable=False),
    Column("lease_id", String(LEASE_ID_LENGTH), nullable=False),
    Column("path", String(MAX_PATH_LENGTH), nullable=False),
    Column("mode", String(9), nullable=False),
    *_owner_columns(),
    Column("fencing_token", BigInteger, nullable=False),
    Column("created_at", _Timestamp, nullable=False),
    Column("expires_at", _Timestamp, nullable=False),
    _owner_key(),
    CheckConstraint("mode IN ('exclusive', 'shared')", name="mode"),
    # The conflict query: one customer, exact paths (self and ancestors) and
    # ranges of descendants (LIKE 'prefix/%').
    Index(
        None,
        "customer_id",
        "path",
        mysql_length={"path": PATH_INDEX_PREFIX},
        mariadb_length={"path": PATH_INDEX_PREFIX},
    ),
    Index(None, "lease_id"),  # release and renewal of one lease
    Index(None, "expires_at"),  # the reaper's scan
    Index(None, "node_id", "pid", "thread"),  # node clean-up
    Index(None, "customer_id", "owner_key"),  # release_locks(), the owner's own locks
    **_MYSQL_TABLE,
)

path_lock_waiters = Table(
    "path_lock_waiters",
    metadata,
    # The queue of blocked requests, oldest ticket first.
    Column("ticket", _BigId, primary_key=True, autoincrement=True),
    Column("customer_id", BigInteger, nullable=False),
    Column("lease_id", String(LEASE_ID_LENGTH), nullable=False),
    # JSON list of [path, mode] pairs: a request is read and compared as a whole.
    # MEDIUMTEXT on MySQL: TEXT's 64 KiB is less than a valid request may need.
    Column("paths", Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb"), nullable=False),
    *_owner_columns(),
    Column("created_at", _Timestamp, nullable=False),
    # Short, refreshed while the waiter is alive: a dead waiter stops blocking
    # others once it lapses.
    Column("expires_at", _Timestamp, nullable=False),
    _owner_key(),
    Index(None, "customer_id", "ticket"),
    Index(None, "lease_id"),
    Index(None, "expires_at"),
    Index(None, "node_id", "pid", "thread"),
    # Tickets never repeat (SQLite would reuse the highest rowid once deleted).
    sqlite_autoincrement=True,
    **_MYSQL_TABLE,
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
_TABLE_EXISTS = 1050
_DUPLICATE_ENTRY = 1062


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
            if attempt == _RACES or not _lost_a_race(error):
                raise
        else:
            return


def _lost_a_race(error: DBAPIError) -> bool:
    """Another process created the table (or recorded the revision) first."""
    args = getattr(error.orig, "args", ())
    if args and args[0] in (_TABLE_EXISTS, _DUPLICATE_ENTRY):
        return True
    message = str(error.orig)
    return "already exists" in message or "UNIQUE constraint failed" in message

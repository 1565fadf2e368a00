"""Run pathlock's Alembic migrations from inside the package.

The revisions live in the repository's top-level ``migrations/`` directory and
are installed with the package as ``pathlock/migrations`` (see
``pyproject.toml``), so ``pathlock db upgrade`` works from any directory after
``pip install``. The ``alembic`` command with the repository's ``alembic.ini``
runs the same revisions.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, TextIO, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import URL, Connection, Engine, inspect, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from pathlock import dialects
from pathlock._backends import URL_ENV_VAR, open_engine
from pathlock.errors import BackendError, InvalidArgument, PathLockError, SchemaMismatch
from pathlock.schema import REVISION, VERSION_TABLE, metadata
from pathlock.settings import Settings

# The engines of the migrations are opened as pathlock opens every engine it
# creates (the URL, the driver and a SQLite file checked, with errors that say
# what to write instead), but their waits are the server's: a migration's DDL
# may rewrite every row of a table (0003), far longer than a lock's call may
# take. A day is the longest wait Settings accept; the lock wait is only ever
# lowered, so this keeps the session's own.
_MIGRATIONS = Settings(socket_timeout=24 * 3600.0, lock_wait_timeout=24 * 3600)

Database = str | URL
_T = TypeVar("_T")


def script_location() -> Path:
    """The directory holding ``env.py`` and ``versions/``: inside the installed
    package, or next to it in a source checkout (and an editable install)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise PathLockError(f"pathlock's migrations are missing from this installation ({package})")


def alembic_config(
    url: Database | None = None,
    *,
    connection: Connection | None = None,
    engine: Engine | None = None,
    output: TextIO | None = None,
) -> Config:
    """An Alembic configuration for pathlock's revisions, without an ini file.

    Give the database as ``url`` (run on a connection of its own), as an
    ``engine`` (the same, on an engine of :func:`engine_for`) or as an open
    ``connection`` (run inside its transaction).
    """
    config = Config(stdout=output if output is not None else sys.stdout)
    config.set_main_option("script_location", str(script_location()))
    config.attributes["configure_logger"] = False
    for name, value in (("url", url), ("engine", engine), ("connection", connection)):
        if value is not None:
            config.attributes[name] = value
    return config


def engine_for(url: Database) -> Engine:
    """An engine for migrating the database at ``url``, opened the way pathlock
    opens its own (:class:`InvalidArgument` for a URL it cannot use, naming
    the URL to write for a driver it does not use; :class:`BackendError`
    for a driver that is not installed), without a pool; the caller
    disposes it."""
    engine, _ = open_engine(url, {"poolclass": NullPool}, _MIGRATIONS)
    return engine


def sql_dialect(url: Database) -> str:
    """The SQLAlchemy dialect of ``url``, for SQL printed instead of run
    (``--sql``): nothing connects, so no driver is needed, but the database
    must be one pathlock runs on (:class:`InvalidArgument` otherwise)."""
    try:
        name = make_url(url).get_backend_name()
    except (SQLAlchemyError, ValueError) as error:
        raise InvalidArgument(f"not a database URL: {error}") from error
    dialects.for_name(name)  # pathlock's SQL for a database it runs on, or none
    return name


def upgrade(
    url: Database | None = None,
    *,
    connection: Connection | None = None,
    revision: str = "head",
    sql: bool = False,
    output: TextIO | None = None,
) -> None:
    """Upgrade the database to ``revision``; with ``sql``, print the SQL to
    ``output`` instead of running it (the URL then only names the dialect).

    Tables that exist without a recorded revision (an older pathlock's
    ``create_schema()`` made them) are refused with :class:`SchemaMismatch`
    before anything changes: the migrations would create them again."""
    _run(
        command.upgrade,
        url,
        connection=connection,
        revision=revision,
        sql=sql,
        output=output,
        upgrading=True,
    )


def stamp(
    url: Database | None = None,
    *,
    revision: str = "head",
    sql: bool = False,
    output: TextIO | None = None,
) -> None:
    """Record ``revision`` as the database's without running any migration
    (for tables created or altered by hand); with ``sql``, print the SQL."""
    _run(command.stamp, url, revision=revision, sql=sql, output=output)


def downgrade(
    url: Database | None = None,
    *,
    revision: str,
    sql: bool = False,
    output: TextIO | None = None,
) -> None:
    """Downgrade the database to ``revision`` (``base``: drop every table);
    with ``sql``, print the SQL instead of running it (``revision`` must then
    be ``FROM:TO``, as Alembic wants it offline)."""
    _run(command.downgrade, url, revision=revision, sql=sql, output=output)


def _run(
    run: Callable[..., object],
    url: Database | None,
    *,
    connection: Connection | None = None,
    revision: str,
    sql: bool,
    output: TextIO | None,
    upgrading: bool = False,
) -> None:
    """An Alembic command on the database given, its failures as pathlock's
    errors (the database's own checked first, as for every engine pathlock
    opens)."""
    if connection is not None:
        if upgrading:
            _refuse_unrecorded(connection)
        _alembic(run, alembic_config(connection=connection, output=output), revision, sql)
        return
    url = _given(url)
    if sql:
        sql_dialect(url)
        _alembic(run, alembic_config(url, output=output), revision, sql)
        return
    with _engine(url) as engine:
        if upgrading:
            _refuse_unrecorded_at(engine)
        _alembic(run, alembic_config(engine=engine, output=output), revision, sql)


def _given(url: Database | None) -> Database:
    """``url``, else ``$PATHLOCK_DATABASE_URL``."""
    url = url if url is not None else os.environ.get(URL_ENV_VAR)
    if not url:
        raise InvalidArgument(
            f"pathlock's migrations need a database: give its URL (or set ${URL_ENV_VAR}), "
            "or a connection"
        )
    return url


def _alembic(run: Callable[..., object], config: Config, revision: str, sql: bool) -> None:
    try:
        run(config, revision, sql=sql)
    except CommandError as error:
        raise PathLockError(f"migration failed: {error}") from error
    except SQLAlchemyError as error:
        raise BackendError("migrating the schema", error) from error


@contextmanager
def _engine(url: Database) -> Iterator[Engine]:
    engine = engine_for(url)
    try:
        yield engine
    finally:
        engine.dispose()


class SchemaState(NamedTuple):
    """What a database holds of pathlock's schema."""

    revision: str | None
    """The revision it records (``None``: none)."""
    tables: tuple[str, ...]
    """Which of pathlock's tables exist."""

    @property
    def unrecorded(self) -> bool:
        """Tables without a recorded revision: an older pathlock's
        ``create_schema()`` made them, or a person did."""
        return self.revision is None and bool(self.tables)


def current(url: Database) -> str | None:
    """The revision the database records (``None``: none recorded)."""
    return state(url).revision


def state(url: Database) -> SchemaState:
    """The revision the database records and which of pathlock's tables exist."""
    with _engine(url) as engine:
        return _read(engine, "reading the schema's revision", schema_state)


def schema_state(connection: Connection) -> SchemaState:
    """:func:`state`, on an open connection."""
    existing = set(inspect(connection).get_table_names())
    tables = tuple(table.name for table in metadata.sorted_tables if table.name in existing)
    return SchemaState(recorded_revision(connection), tables)


def recorded_revision(connection: Connection) -> str | None:
    """The revision recorded in pathlock's version table (``None``: none)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _read(engine: Engine, action: str, read: Callable[[Connection], _T]) -> _T:
    try:
        with engine.connect() as connection:
            found = read(connection)
            connection.rollback()
    except SQLAlchemyError as error:
        raise BackendError(action, error) from error
    return found


def _refuse_unrecorded_at(engine: Engine) -> None:
    _read(engine, "reading the schema's revision", _refuse_unrecorded)


def _refuse_unrecorded(connection: Connection) -> None:
    """:class:`SchemaMismatch` for tables without a recorded revision: an
    upgrade would start at the first revision, and fail creating them."""
    if schema_state(connection).unrecorded:
        raise SchemaMismatch(None, REVISION)


@functools.cache
def head_revision() -> str | None:
    """The newest revision this installation ships."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()

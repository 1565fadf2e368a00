"""Run pathlock's Alembic migrations from inside the package.

The revisions live in the repository's top-level ``migrations/`` directory and
are installed with the package as ``pathlock/migrations`` (see
``pyproject.toml``), so ``pathlock db upgrade`` works from any directory after
``pip install``. The ``alembic`` command with the repository's ``alembic.ini``
runs the same revisions.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from pathlock.errors import BackendError, PathLockError
from pathlock.schema import VERSION_TABLE


def script_location() -> Path:
    """The directory holding ``env.py`` and ``versions/``: inside the installed
    package, or next to it in a source checkout (and an editable install)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise PathLockError(f"pathlock's migrations are missing from this installation ({package})")


def alembic_config(
    url: str | None = None, *, connection: Connection | None = None, output: TextIO | None = None
) -> Config:
    """An Alembic configuration for pathlock's revisions, without an ini file.

    Give the database as ``url`` (run on a connection of its own) or as an open
    ``connection`` (run inside its transaction).
    """
    config = Config(stdout=output if output is not None else sys.stdout)
    config.set_main_option("script_location", str(script_location()))
    config.attributes["configure_logger"] = False
    if url is not None:
        config.attributes["url"] = url
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(
    url: str | None = None,
    *,
    connection: Connection | None = None,
    revision: str = "head",
    sql: bool = False,
    output: TextIO | None = None,
) -> None:
    """Upgrade the database to ``revision``; with ``sql``, print the SQL to
    ``output`` instead of running it (the URL then only names the dialect)."""
    _run(command.upgrade, alembic_config(url, connection=connection, output=output), revision, sql)


def stamp(
    url: str | None = None,
    *,
    revision: str = "head",
    sql: bool = False,
    output: TextIO | None = None,
) -> None:
    """Record ``revision`` as the database's without running any migration
    (for tables created or altered by hand); with ``sql``, print the SQL."""
    _run(command.stamp, alembic_config(url, output=output), revision, sql)


def downgrade(
    url: str | None = None,
    *,
    revision: str,
    sql: bool = False,
    output: TextIO | None = None,
) -> None:
    """Downgrade the database to ``revision`` (``base``: drop every table);
    with ``sql``, print the SQL instead of running it (``revision`` must then
    be ``FROM:TO``, as Alembic wants it offline)."""
    _run(command.downgrade, alembic_config(url, output=output), revision, sql)


def _run(run: Callable[..., object], config: Config, revision: str, sql: bool) -> None:
    """An Alembic command, its failures as pathlock's errors."""
    try:
        run(config, revision, sql=sql)
    except CommandError as error:
        raise PathLockError(f"migration failed: {error}") from error
    except SQLAlchemyError as error:
        raise BackendError("migrating the schema", error) from error


def current(url: str) -> str | None:
    """The revision the database records (``None``: none recorded)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return recorded_revision(connection)
    except SQLAlchemyError as error:
        raise BackendError("reading the schema's revision", error) from error
    finally:
        engine.dispose()


def recorded_revision(connection: Connection) -> str | None:
    """The revision recorded in pathlock's version table (``None``: none)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


@functools.cache
def head_revision() -> str | None:
    """The newest revision this installation ships."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()

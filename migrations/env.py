"""Alembic environment for pathlock's tables.

The database comes from, first to last: a connection, engine or URL handed
over by :mod:`pathlock.migrate` (``config.attributes``), ``alembic -x url=...``,
the environment variable ``PATHLOCK_DATABASE_URL``, ``sqlalchemy.url`` in the
ini file. A URL is checked as pathlock checks every database it is given
(:func:`pathlock.migrate.engine_for`, :func:`pathlock.migrate.sql_dialect`):
one pathlock runs on, through a driver that is installed. The revisions are
recorded in their own version table, ``pathlock_alembic_version``, so these
migrations can run against the same database as a host application's own
Alembic migrations without either one seeing the other's revisions.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from alembic.runtime.environment import NameFilterParentNames, NameFilterType
from alembic.util import CommandError
from sqlalchemy import Engine

import pathlock.dialects
import pathlock.migrate
import pathlock.schema
from pathlock.errors import PathLockError

URL_ENV_VAR = "PATHLOCK_DATABASE_URL"
VERSION_TABLE = pathlock.schema.VERSION_TABLE

config = context.config
target_metadata = pathlock.schema.metadata

# Only the `alembic` command line wants logging set up from the ini file: code
# that runs these migrations itself (tests, a host application) already has its
# logging and can opt out with config.attributes["configure_logger"] = False.
if (
    config.config_file_name is not None
    and config.file_config.has_section("loggers")
    and config.attributes.get("configure_logger", True)
):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _database_url() -> str:
    url = (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get(URL_ENV_VAR)
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        # CommandError, here and below: the alembic command line prints it
        # without a traceback (pathlock.migrate checked its own URL already).
        raise CommandError(
            "pathlock migrations need a database URL: pass "
            "`alembic -x url=mysql+pymysql://user:pass@host/db ...`, set "
            f"{URL_ENV_VAR}, or set sqlalchemy.url in the ini file"
        )
    return url


def _include_name(
    name: str | None, type_: NameFilterType, _parent_names: NameFilterParentNames
) -> bool:
    # pathlock's tables usually share a database with an application's tables.
    # Autogenerate must not see those, or it would propose dropping them.
    if type_ == "table":
        return name in target_metadata.tables
    return True


def _configure(**connection_options: Any) -> None:
    """Configure the context the same way online and offline."""
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=_include_name,
        compare_type=True,
        compare_server_default=pathlock.schema.compare_server_default,
        **connection_options,
    )


def _sql_url() -> tuple[str, str]:
    """The URL whose dialect the SQL printed is for, and that dialect's name."""
    url = _database_url()
    try:
        return url, pathlock.migrate.sql_dialect(url)
    except PathLockError as error:
        raise CommandError(str(error)) from error


def _engine() -> tuple[Engine, bool]:
    """The engine handed over, else one for the URL; and whether it is ours
    to dispose."""
    handed_over: Engine | None = config.attributes.get("engine")
    if handed_over is not None:
        return handed_over, False
    try:
        return pathlock.migrate.engine_for(_database_url()), True
    except PathLockError as error:
        raise CommandError(str(error)) from error


def run_migrations_offline() -> None:
    """Print the SQL (``alembic upgrade head --sql``) instead of running it,
    after the lines that say which server it is for: where it works on that
    server alone, they stop it on any other before it creates anything."""
    url, dialect = _sql_url()
    _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    context.get_context().impl.static_output(pathlock.dialects.sql_header(dialect))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the connection handed over, else on one of their own."""
    handed_over = config.attributes.get("connection")
    if handed_over is not None:
        # Where the family says so (SQLite), the whole upgrade is one
        # transaction, so processes that open a new database at once upgrade
        # it once. (A family's attribute, not DDL: no revision reads it.)
        family = pathlock.dialects.family(handed_over.dialect.name)
        transactional = family is not None and family.transactional_ddl
        _configure(connection=handed_over, transactional_ddl=transactional)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine, owned = _engine()
    try:
        with engine.connect() as connection:
            _configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        if owned:
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

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
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from pathlock.errors import BackendError, PathLockError


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
    config = alembic_config(url, connection=connection, output=output)
    try:
        command.upgrade(config, revision, sql=sql)
    except CommandError as error:
        raise PathLockError(f"migration failed: {error}") from error
    except SQLAlchemyError as error:
        raise BackendError("migrating the schema", error) from error


@functools.cache
def head_revision() -> str | None:
    """The newest revision this installation ships."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()

"""Opening the embedded database (SQLite): pathlock owns the file, and
brings it to the current schema when it opens it. Apart from the engines
(:mod:`pathlock._backends`), which the migrations use to open theirs: the
migrations, and Alembic, are loaded only when there is something to run."""

from __future__ import annotations

from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from pathlock.errors import BackendError
from pathlock.schema import REVISION, VERSION_TABLE


def upgrade_on_open(engine: Engine) -> None:
    """Bring an embedded database (SQLite) to the current schema: run the
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

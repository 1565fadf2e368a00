"""A lease's data: ``data`` on ``path_locks`` and ``path_lock_waiters``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

A request may carry data of its own (``lock_paths(data=...)``: a WebDAV lock's
owner, timeout and token, say; up to 64 KiB), returned by
``CustomerLocks.get_lease()``. It is written with the request's queue row while
the request waits, and with the row of its first path once granted, in the
transaction that grants it (a release that hands a queued request its paths
copies it from the queue row), so a lease never exists without it; it goes
with the rows.

Columns added at the end of the tables, nullable (NULL: no data): an instant
change on MariaDB 10.3+ and MySQL 8.0.12+. During a rolling upgrade, a lease
granted by a process of an older version, or handed its paths by one, has no
data.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("path_locks", "path_lock_waiters")


def _data_type() -> sa.types.TypeEngine[bytes]:
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        return mysql.MEDIUMBLOB()
    return sa.LargeBinary()


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("data", _data_type(), nullable=True))


def downgrade() -> None:
    for table in reversed(_TABLES):
        if op.get_context().dialect.name == "sqlite":
            # SQLite 3.35+ drops a column in place (see revision 0004).
            op.execute(f"ALTER TABLE {table} DROP COLUMN data")
        else:
            op.drop_column(table, "data")

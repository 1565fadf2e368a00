"""Locks at depth 0: ``shallow`` on ``path_locks`` and ``path_lock_waiter_paths``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28

A lock may be on a path alone rather than on its subtree
(``lock_paths(shallow=[...])``, WebDAV's ``Depth: 0``): it meets locks on the
same path and those on its ancestors that cover their subtree, never those on
its descendants. Each lock row, and each path row of a queued request, says
which it is; the queue row's JSON marks such a path as ``[path, mode, 0]``.

Columns added at the end of the tables, NOT NULL with a default of false (every
row written before is on its subtree): an instant change on MariaDB 10.3+ and
MySQL 8.0.12+. During a rolling upgrade, a process of an older version takes a
lock at depth 0 for one on its subtree: it may wait for it where it need not,
and it never grants what conflicts with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("path_locks", "path_lock_waiter_paths")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("shallow", sa.Boolean(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in reversed(_TABLES):
        if op.get_context().dialect.name == "sqlite":
            # SQLite 3.35+ drops a column in place (see revision 0004).
            op.execute(f"ALTER TABLE {table} DROP COLUMN shallow")
        else:
            op.drop_column(table, "shallow")

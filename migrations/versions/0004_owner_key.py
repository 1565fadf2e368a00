"""Owners get an identity of their own: ``owner_key`` on lock and queue rows.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

An owner used to be (node id, process id, OS thread id), which repeats: two
managers of one process with the default node id, containers that share a host
name and are all pid 1, pool threads and reused thread ids. Then one owner's
``release_locks()`` deleted another's rows, and a restarted container was told
it deadlocked with its dead predecessor. ``owner_key`` holds the manager
instance's random identity and the holder within it (thread, asyncio task or a
caller's owner name). Node id, pid and thread stay, for people and for node
clean-up. Rows written before this revision get ``''``: pathlock then falls
back to node, pid and thread for them, as before.

The values are spelled out rather than imported from pathlock, so this revision
keeps doing what it did when pathlock's code changes later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_path_locks_customer_id_owner_key"


def upgrade() -> None:
    for table in ("path_locks", "path_lock_waiters"):
        op.add_column(
            table, sa.Column("owner_key", sa.String(64), nullable=False, server_default="")
        )
    op.create_index(_INDEX, "path_locks", ["customer_id", "owner_key"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="path_locks")
    for table in ("path_lock_waiters", "path_locks"):
        if op.get_context().dialect.name == "sqlite":
            # SQLite 3.35+ drops a column in place; Alembic's batch mode would
            # rebuild the table from reflection and lose the queue's
            # AUTOINCREMENT (revision 0002).
            op.execute(f"ALTER TABLE {table} DROP COLUMN owner_key")
        else:
            op.drop_column(table, "owner_key")

"""Queue rows: paths in MEDIUMTEXT on MySQL/MariaDB; tickets that never repeat on SQLite.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

``path_lock_waiters.paths`` holds the JSON list of a queued request's (path,
mode) pairs. TEXT stops at 64 KiB, which a valid request of about a dozen
4000-character paths exceeds; MEDIUMTEXT holds 16 MiB. SQLite's TEXT has no
such limit; there, the table is rebuilt with AUTOINCREMENT instead, so that a
ticket is never handed out twice (SQLite otherwise reuses the highest rowid
once its row is deleted, and a waiter could take another's place in the queue).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _is_mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def _waiters_as_of_0001() -> sa.Table:
    """The table as revision 0001 made it on SQLite, spelled out: batch mode
    copies it from this definition instead of reflecting it, which also works
    offline (``--sql``)."""
    table = sa.Table(
        "path_lock_waiters",
        sa.MetaData(),
        sa.Column("ticket", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("customer_id", sa.BigInteger(), nullable=False),
        sa.Column("lease_id", sa.String(32), nullable=False),
        sa.Column("paths", sa.Text(), nullable=False),
        sa.Column("node_id", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("thread", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(1000), nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
    )
    for columns in (
        ("customer_id", "ticket"),
        ("lease_id",),
        ("expires_at",),
        ("node_id", "pid", "thread"),
    ):
        sa.Index(f"ix_path_lock_waiters_{'_'.join(columns)}", *(table.c[c] for c in columns))
    return table


def _rebuild_sqlite_table(autoincrement: bool) -> None:
    with op.batch_alter_table(
        "path_lock_waiters",
        recreate="always",
        copy_from=_waiters_as_of_0001(),
        table_kwargs={"sqlite_autoincrement": autoincrement},
    ):
        pass


def upgrade() -> None:
    if _is_mysql():
        op.alter_column(
            "path_lock_waiters",
            "paths",
            existing_type=sa.Text(),
            type_=mysql.MEDIUMTEXT(),
            existing_nullable=False,
        )
    elif op.get_context().dialect.name == "sqlite":
        _rebuild_sqlite_table(autoincrement=True)


def downgrade() -> None:
    # Rows longer than 64 KiB would not fit back: drop them first (queued
    # requests only; a waiter whose row is gone queues again).
    if _is_mysql():
        op.execute("DELETE FROM path_lock_waiters WHERE LENGTH(paths) > 65535")
        op.alter_column(
            "path_lock_waiters",
            "paths",
            existing_type=mysql.MEDIUMTEXT(),
            type_=sa.Text(),
            existing_nullable=False,
        )
    elif op.get_context().dialect.name == "sqlite":
        _rebuild_sqlite_table(autoincrement=False)

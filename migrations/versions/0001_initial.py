"""The initial tables: customer_locks, path_locks, path_lock_waiters.

Revision ID: 0001
Revises:
Create Date: 2026-11-21

Written by hand to match ``pathlock/schema.py`` as of this revision. The values
are spelled out instead of imported from pathlock, so that this revision keeps
creating the same tables when the schema module later changes (that change then
gets a revision of its own). A test compares the migrated schema with the
metadata, including SHOW CREATE TABLE on MySQL/MariaDB.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# Revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Byte-for-byte path comparison: see PAD_SPACE_COLLATION in pathlock/dialects/mysql.py.
# For both dialect names: a mariadb+pymysql:// URL reads only mariadb_*
# options. (Until this was spelled out, such a URL failed at the path index,
# whose prefix length it ignored: no database was ever made that way.)
_MYSQL_TABLE: dict[str, Any] = {
    f"{name}_{option}": value
    for name in ("mysql", "mariadb")
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}
# 700 utf8mb4 characters plus the customer id stay under InnoDB's 3072-byte key.
_PATH_INDEX_PREFIX = 700


def _big_id() -> sa.types.TypeEngine[int]:
    # SQLite only auto-increments INTEGER PRIMARY KEY.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _timestamp() -> sa.types.TypeEngine[Any]:
    # Microseconds: leases of a few milliseconds must expire in order.
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def _owner_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("node_id", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("thread", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(1000), nullable=False, server_default=""),
    ]


def _create_indexes(table: str, *columns: tuple[str, ...]) -> None:
    # One statement per index in a fixed order: SHOW CREATE TABLE lists keys in
    # the order they were created.
    for cols in columns:
        op.create_index(op.f(f"ix_{table}_{'_'.join(cols)}"), table, list(cols))


def upgrade() -> None:
    # Names go through op.f(): they are final, and the naming convention of the
    # target metadata must not rewrite them again.
    op.create_table(
        "customer_locks",
        sa.Column("customer_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("customer_id", name=op.f("pk_customer_locks")),
        **_MYSQL_TABLE,
    )

    op.create_table(
        "path_locks",
        sa.Column("id", _big_id(), autoincrement=True, nullable=False),
        sa.Column("customer_id", sa.BigInteger(), nullable=False),
        sa.Column("lease_id", sa.String(32), nullable=False),
        sa.Column("path", sa.String(4000), nullable=False),
        sa.Column("mode", sa.String(9), nullable=False),
        *_owner_columns(),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("expires_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_path_locks")),
        sa.CheckConstraint("mode IN ('exclusive', 'shared')", name=op.f("ck_path_locks_mode")),
        **_MYSQL_TABLE,
    )
    op.create_index(
        op.f("ix_path_locks_customer_id_path"),
        "path_locks",
        ["customer_id", "path"],
        mysql_length={"path": _PATH_INDEX_PREFIX},
        mariadb_length={"path": _PATH_INDEX_PREFIX},
    )
    _create_indexes("path_locks", ("lease_id",), ("expires_at",), ("node_id", "pid", "thread"))

    op.create_table(
        "path_lock_waiters",
        sa.Column("ticket", _big_id(), autoincrement=True, nullable=False),
        sa.Column("customer_id", sa.BigInteger(), nullable=False),
        sa.Column("lease_id", sa.String(32), nullable=False),
        sa.Column("paths", sa.Text(), nullable=False),
        *_owner_columns(),
        sa.Column("created_at", _timestamp(), nullable=False),
        sa.Column("expires_at", _timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("ticket", name=op.f("pk_path_lock_waiters")),
        **_MYSQL_TABLE,
    )
    _create_indexes(
        "path_lock_waiters",
        ("customer_id", "ticket"),
        ("lease_id",),
        ("expires_at",),
        ("node_id", "pid", "thread"),
    )


def downgrade() -> None:
    # Dropping a table drops its indexes; there are no foreign keys between them.
    op.drop_table("path_lock_waiters")
    op.drop_table("path_locks")
    op.drop_table("customer_locks")

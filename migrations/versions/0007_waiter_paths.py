"""Queued requests' paths, one row each: ``path_lock_waiter_paths``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27

A queued request kept its paths only as one JSON text, so the question every
blocked attempt asks -- is an older request that conflicts with mine queued?
-- was answered by reading and decoding the customer's whole queue: a burst of
Q waiters cost O(Q) per attempt, O(Q^2) in all. Each queued request now also
has one row per path, indexed like ``path_locks``, and the question is the
same indexed conflict query as for live locks. The rows go with their
request's row (a foreign key, ON DELETE CASCADE). The JSON text stays: it is
what listings and releases read of a request as a whole.

Requests queued before this revision get their rows here. Requests that an
older pathlock still running queues afterwards have none: until those
processes are upgraded, later requests may be granted ahead of them (a
matter of order only, never of two conflicting grants: live locks are
checked as ever).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 700 utf8mb4 characters plus the customer id stay under InnoDB's 3072-byte key
# (as the path index of path_locks, revision 0001).
_PATH_INDEX_PREFIX = 700
_BACKFILL_BATCH = 500


def _table_options() -> dict[str, Any]:
    """The MySQL family's table options, with the server's NO PAD binary
    collation (revision 0003's choice, spelled out here so this revision
    keeps doing what it did)."""
    dialect = op.get_context().dialect
    if dialect.name not in ("mysql", "mariadb"):
        return {}
    collation = "utf8mb4_bin"
    if getattr(dialect, "is_mariadb", False):
        collation = "utf8mb4_nopad_bin"
    else:
        version = getattr(dialect, "server_version_info", None)
        if version is None or version >= (8,):  # offline SQL assumes MySQL 8
            collation = "utf8mb4_0900_bin"
    return {
        f"{name}_{option}": value
        for name in ("mysql", "mariadb")
        for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"), ("collate", collation))
    }


def upgrade() -> None:
    waiter_paths = op.create_table(
        "path_lock_waiter_paths",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("ticket", sa.BigInteger(), nullable=False),
        sa.Column("customer_id", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.String(4000), nullable=False),
        sa.Column("mode", sa.String(9), nullable=False),
        sa.CheckConstraint(
            "mode IN ('exclusive', 'shared')", name=op.f("ck_path_lock_waiter_paths_mode")
        ),
        sa.ForeignKeyConstraint(
            ["ticket"],
            ["path_lock_waiters.ticket"],
            name=op.f("fk_path_lock_waiter_paths_ticket"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_path_lock_waiter_paths")),
        **_table_options(),
    )
    op.create_index(
        op.f("ix_path_lock_waiter_paths_customer_id_path"),
        "path_lock_waiter_paths",
        ["customer_id", "path"],
        mysql_length={"path": _PATH_INDEX_PREFIX},
        mariadb_length={"path": _PATH_INDEX_PREFIX},
    )
    op.create_index(op.f("ix_path_lock_waiter_paths_ticket"), "path_lock_waiter_paths", ["ticket"])
    if not op.get_context().as_sql:
        _backfill(waiter_paths)


def _backfill(waiter_paths: sa.Table) -> None:
    """Rows for the requests queued now (a row pathlock could not have
    written, unreadable, gets none)."""
    waiters = sa.table(
        "path_lock_waiters",
        sa.column("ticket", sa.BigInteger()),
        sa.column("customer_id", sa.BigInteger()),
        sa.column("paths", sa.Text()),
    )
    bind = op.get_bind()
    rows: list[dict[str, Any]] = []
    for ticket, customer_id, paths in bind.execute(sa.select(waiters)):
        try:
            pairs = [(str(path), str(mode)) for path, mode in json.loads(paths)]
        except (ValueError, TypeError):
            continue
        rows.extend(
            {"ticket": ticket, "customer_id": customer_id, "path": path, "mode": mode}
            for path, mode in pairs
            if mode in ("exclusive", "shared")
        )
    for start in range(0, len(rows), _BACKFILL_BATCH):
        bind.execute(waiter_paths.insert(), rows[start : start + _BACKFILL_BATCH])


def downgrade() -> None:
    op.drop_table("path_lock_waiter_paths")

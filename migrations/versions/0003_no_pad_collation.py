"""Paths, lease ids and node ids compare trailing spaces too (NO PAD collation).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21

``utf8mb4_bin`` is a PAD SPACE collation on MariaDB and MySQL: ``'/a '`` and
``'/a'`` compare equal, so a lock on a path with a trailing space blocked the
path without it (and its subtree), and ``release_node('web-1 ')`` freed node
``web-1``'s locks. Spurious conflicts, never a double grant, but not "a path
locks exactly itself". The tables move to the server's NO PAD binary
collation: ``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on MySQL 8.
MySQL 5.7 has none and stays as it is. SQLite compares bytes already.

The choice is spelled out here rather than imported from pathlock, so this
revision keeps doing what it did when pathlock's code changes later.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("customer_locks", "path_locks", "path_lock_waiters")
_PAD_SPACE = "utf8mb4_bin"


def _no_pad() -> str | None:
    """The server's NO PAD binary collation, or None where it has none (or
    the database is not MySQL/MariaDB)."""
    dialect = op.get_context().dialect
    if dialect.name not in ("mysql", "mariadb"):
        return None
    if getattr(dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin"
    version = getattr(dialect, "server_version_info", None)
    if version is None or version >= (8,):  # offline SQL assumes MySQL 8
        return "utf8mb4_0900_bin"
    return None


def _convert(collation: str) -> None:
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}")


def upgrade() -> None:
    collation = _no_pad()
    if collation is not None:
        _convert(collation)


def downgrade() -> None:
    if _no_pad() is not None:
        _convert(_PAD_SPACE)

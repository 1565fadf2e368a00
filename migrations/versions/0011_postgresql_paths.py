"""PostgreSQL: paths compare code point by code point, and the path index holds any path.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

A lock conflicts with the locks inside its subtree, found as a range of paths
(``/a/`` up to ``/a0``): the range holds exactly the descendants only where
paths sort code point by code point. A database's default collation on
PostgreSQL is usually a language's (``en_US.UTF-8``), which sorts ``/a/b``
and ``/a-b`` by other rules. The path columns move to the ``C`` collation
(byte order of UTF-8, which is code point order); on MySQL, MariaDB and
SQLite this revision changes nothing (revision 0003 made their paths compare
byte for byte).

A B-tree index entry holds at most 2,704 bytes on PostgreSQL, a path up to
4,000 characters (16,000 bytes in UTF-8): inserting a long path into the
``(customer_id, path)`` index failed. The index holds the first 600
characters of the path instead (``left(path, 600)``, 2,400 bytes at most), as
MySQL's index holds its first 700; pathlock's statements name that
expression in every lookup.

Spelled out here rather than imported from pathlock, so this revision keeps
doing what it did when pathlock's code changes later.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("path_locks", "path_lock_waiter_paths")
_KEY_LENGTH = 600


def _paths(collation: str, indexed: str) -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table in _TABLES:
        index = f"ix_{table}_customer_id_path"
        op.execute(f"DROP INDEX {index}")
        op.execute(
            f'ALTER TABLE {table} ALTER COLUMN path TYPE VARCHAR(4000) COLLATE "{collation}"'
        )
        op.execute(f"CREATE INDEX {index} ON {table} (customer_id, {indexed})")


def upgrade() -> None:
    _paths("C", f"left(path, {_KEY_LENGTH})")


def downgrade() -> None:
    _paths("default", "path")

"""Each customer counts its lock and queue rows: ``lock_rows``, ``waiter_rows``
and ``counted_version`` on ``customer_locks``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27

Every grant searched the customer's locks for a conflict and its queue for an
older request in the way, even where the customer had neither -- the usual
case -- and those searches cost the database as much as the rest of the grant.
The sentinel row now counts the customer's rows in ``path_locks`` and
``path_lock_waiters`` (live or expired, until deleted), in the same
transactions that insert and delete them; a grant to a customer with none is
a write of the sentinel and an insert, without searches.

The counts are trusted only while ``counted_version`` equals ``version``.
This version of pathlock moves both in every write of the sentinel; an older
one, still running during a rolling upgrade, moves the version alone when it
grants, so its rows are never missed: the customer's grants search as before
until the counts are made again. Nothing counts here: the columns start NULL
(not counted), and pathlock's reaper (``pathlock reap``, or
``manager.reap_expired()``) counts each customer's rows once every process
runs this version, under the customer's sentinel row. Until then grants
search, as they always did.

Columns added at the end of the table, nullable: an instant change on MariaDB
10.3+ and MySQL 8.0.12+.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("lock_rows", "waiter_rows", "counted_version")


def upgrade() -> None:
    for name in _COLUMNS:
        op.add_column("customer_locks", sa.Column(name, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for name in reversed(_COLUMNS):
        if op.get_context().dialect.name == "sqlite":
            # SQLite 3.35+ drops a column in place (see revision 0004).
            op.execute(f"ALTER TABLE customer_locks DROP COLUMN {name}")
        else:
            op.drop_column("customer_locks", name)

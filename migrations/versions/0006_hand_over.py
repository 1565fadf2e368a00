"""Releases hand paths to the head of the queue: ``hand_over_us`` on queue rows.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26

A release used to delete its rows and move the customer's version; each
waiter then noticed at its next check and made an attempt of its own. A
release now grants the paths to the oldest queued request itself, in the same
breath, and that request only has to notice. A request queued by a pathlock
that does not expect this would take its own granted rows for a request that
waits for itself, so each queue row says whether its request takes paths
handed to it, and for how long such paths last until it takes them up (no
longer than its queue row would, nor than the lease it asked for):
``hand_over_us``, in microseconds. It is NULL on rows written before (and by
older versions still running during an upgrade), which releases leave to try
for themselves, as before.

The column is nullable and last, so adding it does not rebuild the table on
MariaDB 10.3+ or MySQL 8.0.12+.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("path_lock_waiters", sa.Column("hand_over_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        # SQLite 3.35+ drops a column in place (see revision 0004).
        op.execute("ALTER TABLE path_lock_waiters DROP COLUMN hand_over_us")
    else:
        op.drop_column("path_lock_waiters", "hand_over_us")

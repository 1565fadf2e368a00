"""Each customer records whether its paths are case-folded: ``case_insensitive``
on ``customer_locks``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

A manager built with ``case_insensitive=True`` stores ``/shared/foo`` for
``/Shared/Foo``; one with the default stores the path as given. Both used to be
granted on the same customer, since their paths never meet. The first grant of
a customer now records the setting it used, and a manager with the other one is
refused. Existing customers get NULL: their next grant records its setting.

Adding a nullable column at the end of the table is an instant change on
MariaDB 10.3+ and MySQL 8.0.12+: it does not rewrite the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Revision identifiers, used by Alembic.
revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("customer_locks", sa.Column("case_insensitive", sa.Boolean(), nullable=True))


def downgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        # SQLite 3.35+ drops a column in place (see revision 0004).
        op.execute("ALTER TABLE customer_locks DROP COLUMN case_insensitive")
    else:
        op.drop_column("customer_locks", "case_insensitive")

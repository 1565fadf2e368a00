"""What PostgreSQL's batches share between the module that writes their
statements (:mod:`pathlock.dialects.postgresql`) and the connection that
sends them (:mod:`pathlock.dialects._psycopg`, imported only with psycopg)."""

from __future__ import annotations

BATCH_REPLY = ("pathlock_changed", "pathlock_id")
"""The columns of the reply of a data-modifying statement in a batch: the
rows it changed and the id it generated (or ``Fenced`` kept)."""

PREPARED: dict[str, str] = {}
"""The ``PREPARE`` statement of each prepared statement a batch may execute,
by its name (``pathlock_`` and a hash of its SQL): a connection sends it,
in the batch, before the first batch that executes it (see
:meth:`pathlock.dialects._psycopg.BoundedConnection.send_batch`). One per
statement and shape of request (lists longer than eight are padded to the
next power of two), as the batches' plans are."""

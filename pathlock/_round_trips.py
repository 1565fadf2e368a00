"""How the statements that end a transaction travel: with its COMMIT or its
ROLLBACK in one batch where the connection can, the statements together and
the COMMIT alone where only they can (a Galera node), one by one elsewhere."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from pathlock import _batch as batch
from pathlock import _deadlines as deadlines
from pathlock.dialects.base import CHANGED_ROWS, INSERTED_ID, Dialect
from pathlock.settings import Settings

Steps = list[tuple[Any, dict[str, Any]]]
"""Statements and their parameters, in the order they run."""


def commit(
    connection: Connection, dialect: Dialect, steps: Sequence[tuple[Any, dict[str, Any]]]
) -> list[batch.Reply]:
    """Run ``steps`` and commit: in one round trip where the COMMIT can
    travel in a batch, in two where only the statements can, one by one
    otherwise. These writes come last in a transaction that holds the
    customer's sentinel row, which every grant and release of the customer
    waits for: on a busy customer each round trip saved there is one less
    for everyone behind it."""
    if batch.commits_in_batches(connection):
        return batch.run(connection, steps, commit=True)
    if len(steps) > 1 and dialect.can_batch(connection):
        # The COMMIT alone, the statements in one query.
        replies = batch.run(connection, steps)
        connection.commit()
        return replies
    replies = []
    for statement, parameters in steps:
        if replies and dialect.counts_from_client:
            before = replies[-1]
            parameters = {  # noqa: PLW2901 - the step's, with the reply before
                **parameters,
                CHANGED_ROWS: before.rowcount,
                INSERTED_ID: before.lastrowid,
            }
        result = connection.execute(statement, parameters)
        replies.append(batch.Reply(result.rowcount, dialect.inserted_id(result)))
    connection.commit()
    return replies


def read_and_roll_back(
    connection: Connection,
    steps: Sequence[tuple[Any, dict[str, Any]]],
    *,
    every: bool = False,
) -> list[Any]:
    """Plain reads, then ROLLBACK: in one round trip where it can. Each
    read's first row (``None``: none), or with ``every`` its rows."""
    replies: list[Sequence[Any]]
    if batch.rolls_back_in_batches(connection):
        replies = [reply.rows for reply in batch.run(connection, steps, rollback=True)]
    else:
        replies = [
            connection.execute(statement, parameters).all() for statement, parameters in steps
        ]
        connection.rollback()
    if every:
        return replies
    return [rows[0] if rows else None for rows in replies]


def until(settings: Settings) -> dict[str, Any]:
    """The parameters of ``SET_GRANT_UNTIL``: until when this transaction's
    client waits for the reply (its socket timeout, or the current limit)."""
    waits = settings.socket_timeout
    limit = deadlines.LIMIT.get()  # (current(), without the call: in every grant)
    if limit is not None:
        left = limit.ends - time.monotonic()
        if left < waits:
            waits = left if left > 0.0 else 0.0  # noqa: FURB136 - not max(): a call
    return {"until_us": int(waits * 1_000_000)}

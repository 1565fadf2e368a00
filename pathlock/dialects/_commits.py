"""What the engines of a dialect need of batches (:mod:`pathlock._batch`):
a batch may carry its transaction's COMMIT or ROLLBACK, which SQLAlchemy
must then not send again. Here, below the dialects, so that a dialect's
``enable_batches()`` turns it on without importing the batches themselves."""

from __future__ import annotations

import weakref
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine.interfaces import Dialect

COMMITTING: weakref.WeakSet[Dialect] = weakref.WeakSet()
"""The dialects (one per engine) whose COMMIT may travel in a batch."""
SENT: ContextVar[object | None] = ContextVar("pathlock_commit_sent", default=None)
"""The connection whose COMMIT or ROLLBACK a batch has just sent: its
``Connection.commit()`` or ``rollback()`` sends nothing more (set and reset
by :mod:`pathlock._batch` around them)."""


def commit_in_batches(engine: Engine) -> None:
    """Let batches of ``engine`` carry their transaction's COMMIT (for the
    engines pathlock creates; see :func:`pathlock._batch.commits_in_batches`)."""
    dialect = engine.dialect
    if dialect in COMMITTING:
        return
    send_commit, send_rollback = dialect.do_commit, dialect.do_rollback

    def do_commit(dbapi_connection: Any) -> None:
        if SENT.get() is not dbapi_connection:
            send_commit(dbapi_connection)

    def do_rollback(dbapi_connection: Any) -> None:
        if SENT.get() is not dbapi_connection:
            send_rollback(dbapi_connection)

    dialect.do_commit = do_commit  # type: ignore[method-assign]
    dialect.do_rollback = do_rollback  # type: ignore[method-assign]
    COMMITTING.add(dialect)


def may_commit(dialect: Dialect) -> bool:
    """Whether batches of ``dialect``'s engine may carry their COMMIT (see
    :func:`commit_in_batches`; a connection may still not:
    :func:`pathlock._batch.commits_in_batches`)."""
    return dialect in COMMITTING

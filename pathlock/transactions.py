"""The retry loop around one transaction, and the sentinel write that
serializes a customer's grants and releases: what every operation of
:mod:`pathlock.store` and :mod:`pathlock.upkeep` is built on."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from pathlock.backends import READ_ONLY, check_dialect
from pathlock.errors import BackendError
from pathlock.statements import BUMP, CREATE_SENTINEL, VERSION
from pathlock.transient import hint, is_transient

# Retries are logged under the name they always had, which operators may filter on.
log = logging.getLogger("pathlock.store")

T = TypeVar("T")


class Transactions:
    """One engine, and the two things every operation of pathlock needs: the
    retry loop around one transaction, and the customer's sentinel write."""

    def __init__(self, engine: Engine, *, max_attempts: int = 5, retry_delay: float = 0.05) -> None:
        check_dialect(engine.dialect.name)
        self.engine = engine
        # MySQL hands the fencing token back in the UPDATE's reply; SQLite
        # needs a SELECT (cheap: in-process, under the write lock).
        self._token_from_reply = engine.dialect.name != "sqlite"
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay

    # -- the retry loop -------------------------------------------------------

    def _run(
        self,
        action: str,
        operation: Callable[[Connection, int], T],
        *,
        read_only: bool = False,
    ) -> T:
        """Run ``operation(connection, attempt)`` in a transaction, retrying
        transient failures up to ``max_attempts`` times. A ``read_only``
        transaction on SQLite does not take the write lock (see
        :mod:`pathlock.backends`)."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                with self.engine.connect() as connection:
                    if read_only:
                        connection.execution_options(**{READ_ONLY: True})
                    return operation(connection, attempt)
            except DBAPIError as error:
                if not is_transient(error):
                    raise BackendError(action, error, hint(error)) from error
                if attempt == self.max_attempts:
                    raise BackendError(
                        action, error, f"transient error persisted through {attempt} attempts"
                    ) from error
                delay = self.retry_delay * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)  # noqa: S311
                log.warning(
                    "%s: transient database error (attempt %d of %d, retrying in %.0f ms): %s",
                    action,
                    attempt,
                    self.max_attempts,
                    delay * 1000,
                    error.orig,
                )
                time.sleep(delay)
            except SQLAlchemyError as error:
                raise BackendError(action, error) from error
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the sentinel ---------------------------------------------------------

    def _bump(self, connection: Connection, customer_id: int) -> int:
        """Write the customer's sentinel row and return its new version."""
        parameters = {"c_id": customer_id}
        result = connection.execute(BUMP, parameters)
        if result.rowcount == 0:
            # First use of this customer: create the row in a transaction of
            # its own. Inserting and then updating it in one transaction
            # deadlocks when several clients start at once (each waits on the
            # others' shared lock on the new key). Nothing is held yet here.
            connection.rollback()
            connection.execute(CREATE_SENTINEL, parameters)
            connection.commit()
            result = connection.execute(BUMP, parameters)
        token: Any
        if self._token_from_reply:
            token = result.lastrowid
        else:
            token = connection.execute(VERSION, parameters).scalar()
        if not token:
            raise BackendError(
                "reading the fencing token",
                RuntimeError("the database returned no version for the sentinel"),
            )
        return int(token)

"""The naive algorithm from the original blog post (``SELECT ... FOR UPDATE``,
reverse exponential backoff): the baseline of the contention benchmarks.

This is what pathlock replaces, kept only so that every benchmark can measure
it beside pathlock in the same run. It uses pathlock's tables and conflict
query, so the two differ in how they wait, not in what conflicts:

- one attempt is one READ COMMITTED transaction: ``SELECT ... FOR UPDATE`` of
  the customer's sentinel row (created first, in a transaction of its own, if
  it is missing), a check for live conflicting rows, then insert the rows and
  commit, or roll back;
- a denied request sleeps the original blog post's reverse exponential backoff,
  ``wait_ms = 250 ** (1 / (retry % 15))`` with the division by zero of every
  15th retry mapped to 15 as :class:`~pathlock.waiting.ReverseExponentialBackoff`
  does (no jitter: the original had none), never under 10 ms, and tries again;
- no queue, no version watch, no wake-up of local waiters: a release is a
  DELETE of the lease's rows and a commit, and waiters find out at their next
  poll.

Not for production: nothing here renews, fences or retries transient errors.
"""

from __future__ import annotations

import os
import secrets
import threading
import time

from sqlalchemy import BigInteger, Engine, bindparam, delete, insert, select, update

from pathlock._statements.common import now, now_plus
from pathlock._statements.conflicts import blockers_query, conflict_parameters, shape
from pathlock._statements.grants import CREATE_SENTINEL
from pathlock.schema import customer_locks, path_locks
from pathlock.types import EXCLUSIVE, PathMode
from pathlock.waiting import ReverseExponentialBackoff

_SENTINEL = (
    select(customer_locks.c.version)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .with_for_update()
)
_INSERT = insert(path_locks).values(
    customer_id=bindparam("c_id"),
    lease_id=bindparam("l_id"),
    path=bindparam("path"),
    mode=EXCLUSIVE,
    node_id=bindparam("o_node"),
    pid=bindparam("o_pid"),
    thread=bindparam("o_thread"),
    reason="naive",
    fencing_token=bindparam("token"),
    created_at=now(),
    expires_at=now_plus(bindparam("ttl_us", type_=BigInteger)),
)
_UNCOUNTED = (
    update(customer_locks)
    .where(customer_locks.c.customer_id == bindparam("c_id"))
    .values(counted_version=None)
)
_RELEASE = delete(path_locks).where(
    path_locks.c.customer_id == bindparam("c_id"),
    path_locks.c.lease_id == bindparam("l_id"),
)


class NaiveLocks:
    """The naive algorithm's exclusive locks of one customer, on ``engine``
    (which must run READ COMMITTED, as the original's did)."""

    def __init__(
        self, engine: Engine, customer_id: int, *, node_id: str, ttl: float = 30.0
    ) -> None:
        self.engine = engine
        self.customer_id = customer_id
        self.node_id = node_id
        self.ttl = ttl
        # The original blog post's schedule; its only gesture towards fairness is that a
        # request that has waited longer polls more eagerly than a newcomer.
        self.backoff = ReverseExponentialBackoff(jitter=0)

    def acquire(self, *paths: str, timeout: float) -> str | None:
        """Lock ``paths`` exclusive, all or nothing, trying until ``timeout``
        seconds have passed; the lease id, or ``None`` if not granted."""
        request = tuple((path, EXCLUSIVE) for path in paths)
        deadline = time.monotonic() + timeout
        delays = self.backoff.start()
        while True:
            lease_id = self._attempt(request)
            if lease_id is not None:
                return lease_id
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(delays.next(), remaining))

    def release(self, lease_id: str) -> None:
        with self.engine.connect() as connection:
            connection.execute(_RELEASE, {"c_id": self.customer_id, "l_id": lease_id})
            connection.commit()

    def _attempt(self, request: tuple[PathMode, ...]) -> str | None:
        customer = {"c_id": self.customer_id}
        with self.engine.connect() as connection:
            version = connection.execute(_SENTINEL, customer).scalar()
            if version is None:
                # First use of the customer: the row is created in a transaction
                # of its own (creating and locking it in one deadlocks when
                # several clients start at once), then locked as usual.
                connection.rollback()
                connection.execute(CREATE_SENTINEL, customer)
                # This algorithm does not count its rows on the sentinel row
                # (pathlock's grants without searches rely on the counts):
                # its customer's counts are not to be trusted.
                connection.execute(_UNCOUNTED, customer)
                connection.commit()
                version = connection.execute(_SENTINEL, customer).scalar_one()
            conflict = conflict_parameters(request) | customer
            if connection.execute(blockers_query(shape(request)), conflict).first() is not None:
                connection.rollback()
                return None
            lease_id = secrets.token_hex(16)
            owner = {
                "l_id": lease_id,
                "o_node": self.node_id,
                "o_pid": os.getpid(),
                "o_thread": str(threading.get_native_id()),
                # The original wrote no fencing token; the version read is as good as any.
                "token": version,
                "ttl_us": round(self.ttl * 1_000_000),
            }
            connection.execute(
                _INSERT, [{**customer, **owner, "path": path} for path, _ in request]
            )
            connection.commit()
            return lease_id

"""Requests that ``test_fairness.py`` and ``test_authority.py`` run in spawned
processes.

Not a test module: :func:`request` is the target of a ``multiprocessing``
process started with the "spawn" method, so the child builds its own manager
and imports only pathlock, not pytest.
"""

from __future__ import annotations

import time
import traceback
from multiprocessing.queues import Queue
from typing import Any

from pathlock import PathLockManager

# A bound on every wait, so a test that died early leaves no process behind.
WAIT_SECONDS = 60.0


def request(
    database_url: str,
    customer_id: int,
    path: str,
    name: str,
    events: Queue[tuple[str, ...]],
) -> None:
    """Lock ``path`` exclusively, then put ``("granted", name, fencing token)``
    on ``events`` and release at once. A failure is put as ``("error", name,
    traceback)``.

    The order in which events arrive is not the order of the grants: a
    ``multiprocessing.Queue`` hands each item to a feeder thread, so the next
    process in line can be granted and be heard first. The fencing token is
    the grant's place in the customer's order."""
    try:
        with PathLockManager(database_url, node_id=f"queue-worker-{name}") as manager:
            lease = manager.for_customer(customer_id).lock_paths(
                path, timeout=WAIT_SECONDS, reason=name
            )
            events.put(("granted", name, str(lease.fencing_token)))
            lease.release()
    except BaseException:
        events.put(("error", name, traceback.format_exc()))
        raise


def own_customer(
    database_url: str,
    customer_id: int,
    rounds: int,
    start: Any,
    events: Queue[tuple[str, ...]],
) -> None:
    """Try-lock the root of ``customer_id`` exclusively ``rounds`` times, each
    held briefly; put ``("done", granted, refused)`` on ``events``. Every
    worker of the isolation test has a customer of its own, so none may ever
    be refused."""
    try:
        with PathLockManager(database_url, node_id=f"tenant-{customer_id}") as manager:
            locks = manager.for_customer(customer_id)
            locks.list_locks()  # connected before the start line
            start.wait(WAIT_SECONDS)
            granted = refused = 0
            for _ in range(rounds):
                lease = locks.try_lock_paths("/", reason="whole tree")
                if lease is None:
                    refused += 1
                    continue
                granted += 1
                time.sleep(0.001)
                lease.release()
            events.put(("done", str(granted), str(refused)))
    except BaseException:
        events.put(("error", str(customer_id), traceback.format_exc()))
        raise

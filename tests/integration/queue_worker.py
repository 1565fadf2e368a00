"""A request that ``test_fairness.py`` runs in a spawned process.

Not a test module: :func:`request` is the target of a ``multiprocessing``
process started with the "spawn" method, so the child builds its own manager
and imports only pathlock, not pytest.
"""

from __future__ import annotations

import os
import traceback
from multiprocessing.queues import Queue

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
    """Lock ``path`` exclusively, then put ``("granted", name, pid)`` on
    ``events`` and release at once. A failure is put as ``("error", name,
    traceback)``."""
    try:
        with PathLockManager(database_url, node_id=f"queue-worker-{name}") as manager:
            lease = manager.for_customer(customer_id).lock_paths(
                path, timeout=WAIT_SECONDS, reason=name
            )
            events.put(("granted", name, str(os.getpid())))
            lease.release()
    except BaseException:
        events.put(("error", name, traceback.format_exc()))
        raise

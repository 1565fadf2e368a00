"""A lock holder that ``test_nodes.py`` runs in a spawned process and kills.

Not a test module: :func:`hold` is the target of a ``multiprocessing`` process
started with the "spawn" method, so the child builds its own manager (nothing
crosses a fork) and imports only pathlock, not pytest.
"""

from __future__ import annotations

import os
import time
import traceback
from multiprocessing.connection import Connection

from pathlock import PathLockManager

# The holder waits this long for its test to kill it: a bound, so a test that
# died before killing it does not leave it holding a lock forever.
HOLD_SECONDS = 120.0


def hold(
    database_url: str, customer_id: int, path: str, node_id: str, ttl: float, ready: Connection
) -> None:
    """Lock ``path`` (heartbeat on), report ``("held", lease_id, pid)`` on
    ``ready``, then sleep until killed. Failures are reported as
    ``("error", traceback)`` so the test can show them."""
    try:
        manager = PathLockManager(database_url, node_id=node_id, ttl=ttl)
        lease = manager.for_customer(customer_id).lock_paths(
            path, timeout=30, reason="holder that gets killed"
        )
    except BaseException:
        ready.send(("error", traceback.format_exc()))
        raise
    ready.send(("held", lease.lease_id, os.getpid()))
    ready.close()
    time.sleep(HOLD_SECONDS)
    manager.close()

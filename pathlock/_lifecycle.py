"""What happens to live managers when the process forks or exits.

- **fork()** (gunicorn's pre-fork workers, ``multiprocessing`` with the fork
  start method): the child must never use or close the parent's pooled
  connections, renew or release the parent's leases, or wait on a lock that a
  parent thread held at the moment of the fork. Every live manager is rebuilt
  in the child (``_after_fork``): fresh pools, a new identity, no leases, new
  threads and internal locks.
- **Interpreter exit**: a script that ends without ``close()`` would leave its
  locks held for the whole ttl. Managers still open at exit are closed, which
  releases what they hold.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Protocol

log = logging.getLogger("pathlock.manager")


class Managed(Protocol):
    def _after_fork(self) -> None: ...
    def close(self) -> None: ...


_managers: weakref.WeakSet[Managed] = weakref.WeakSet()
_lock = threading.Lock()


def track(manager: Managed) -> None:
    """Rebuild ``manager`` in forked children and close it at exit."""
    with _lock:
        _managers.add(manager)


def forget(manager: Managed) -> None:
    with _lock:
        _managers.discard(manager)


def _live() -> list[Managed]:
    with _lock:
        return list(_managers)


def _after_fork_in_child() -> None:
    global _lock  # noqa: PLW0603 - another thread may have held it at the fork
    _lock = threading.Lock()
    for manager in _live():
        try:
            manager._after_fork()
        except Exception:  # a failure here must not break the child's own work
            log.exception("could not prepare %r for use in a forked child", manager)


def _close_at_exit() -> None:
    for manager in _live():
        try:
            manager.close()
        except Exception:  # nothing may stop the interpreter's exit
            log.warning("closing %r at exit failed", manager, exc_info=True)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)

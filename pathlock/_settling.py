"""Leases in doubt: rows that may exist although no :class:`Lease` holds them.

A grant interrupted after its COMMIT went out (Ctrl-C, an exception raised by
a signal handler, a task cancelled at the wrong moment) may have committed its
rows, and a release interrupted the same way may not have deleted them. The
lease id is known, so the rows can be deleted by it: at once, before the
interrupt propagates; if that fails too, from a short-lived thread soon after,
at the manager's next call, and at ``close()``. An entry is dropped once its
rows are known gone, or once they have surely expired (twice the ttl: nobody
renews them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pathlock.errors import PathLockError

log = logging.getLogger("pathlock.manager")


K = TypeVar("K")


class Expiring(Generic[K]):
    """Things that matter for a while (a lease whose rows may still exist, a
    session the server may still run), each until its own monotonic time;
    thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[K, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def add(self, key: K, seconds: float) -> None:
        """Keep ``key`` for ``seconds`` from now."""
        with self._lock:
            self._until[key] = time.monotonic() + seconds

    def current(self) -> list[K]:
        """Those whose time has not passed."""
        if not self._until:
            return []  # mostly: none (asked in every request)
        now = time.monotonic()
        with self._lock:
            for key, until in list(self._until.items()):
                if until <= now:
                    del self._until[key]
            return list(self._until)

    def discard(self, keys: Iterable[K]) -> None:
        with self._lock:
            for key in keys:
                self._until.pop(key, None)


@dataclass(frozen=True, slots=True)
class _Entry:
    customer_id: int
    gone_by: float  # monotonic time by which the rows have surely expired


class InDoubt:
    """The leases in doubt of one manager and the means to settle them.

    ``release(customer_id, lease_id)`` deletes a lease's rows (raising a
    :class:`PathLockError` when the database cannot); ``closed()`` tells the
    background thread to stop.
    """

    def __init__(
        self,
        release: Callable[[int, str], object],
        closed: Callable[[], bool],
        *,
        name: str,
        retry_every: float = 1.0,
    ) -> None:
        self._release = release
        self._retry_every = retry_every
        self._closed = closed
        self._name = name
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._thread: threading.Thread | None = None

    def add(self, customer_id: int, lease_id: str, ttl: float) -> None:
        """Record ``lease_id`` before the step that may leave it in doubt
        (kept at least as long as any earlier record of it asked)."""
        gone_by = time.monotonic() + 2 * ttl
        with self._lock:
            earlier = self._entries.get(lease_id)
            if earlier is not None:
                gone_by = max(gone_by, earlier.gone_by)
            self._entries[lease_id] = _Entry(customer_id, gone_by)

    def discard(self, lease_id: str) -> None:
        """Its rows are known gone (or known to expire unaided)."""
        with self._lock:
            self._entries.pop(lease_id, None)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._entries

    def settle(self, *, first: str | None = None) -> bool:
        """Try to delete the rows of every lease in doubt, once each, ``first``
        first; True when none is left. The first database error ends the
        pass (the others would most likely meet it too, each after its own
        retries): it is logged, not raised, and the rest wait for the next."""
        with self._lock:
            entries = sorted(self._entries.items(), key=lambda item: item[0] != first)
        for done, (lease_id, entry) in enumerate(entries):
            if time.monotonic() >= entry.gone_by:
                self.discard(lease_id)  # expired long ago: nothing left to block anyone
                continue
            try:
                self._release(entry.customer_id, lease_id)
            except PathLockError as error:
                log.warning(
                    "could not yet release %d lease(s) left in doubt: %s",
                    len(entries) - done,
                    error,
                )
                break
            self.discard(lease_id)
        return not self._entries

    def settle_soon(self) -> None:
        """Settle from a background thread, retrying every ``retry_every``
        seconds until nothing is left or the manager closes."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed():
            try:
                if self.settle():
                    return
            except Exception:  # the thread must not die with entries left
                log.exception("settling leases in doubt failed unexpectedly")
            time.sleep(self._retry_every)

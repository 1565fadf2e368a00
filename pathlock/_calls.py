"""The calls of a manager that are using the database right now, so that
``close()`` can let them finish before it disposes the engine."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from pathlock import _deadlines as deadlines
from pathlock import _interrupts as interrupts


class Calls:
    """The calls of a manager that are using the database right now, so that
    close() can let them finish before it disposes the engine."""

    def __init__(self) -> None:
        # Each running call by a token of its own. Adding one and discarding
        # one are single operations of a C set, which a signal handler's
        # exception (raised between bytecodes) cannot cut in half, and which
        # take no lock it could leave held (CPython issue 29988): counting a
        # call needs no interrupts held back, which cost more than the rest
        # of the counting. The condition is only for close() to wait on.
        self._running: set[object] = set()
        self._condition = threading.Condition()
        self._waiting = 0  # wait_idle() calls under way

    @property
    def _count(self) -> int:
        return len(self._running)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        token = object()
        try:
            # In the try: an interrupt right after the token is added still
            # takes it away again. (One that ends __enter__ after this yield
            # does too, as the generator is finalized.)
            self._running.add(token)
            yield
        finally:
            self._running.discard(token)
            if self._waiting:
                self._wake()

    def _wake(self) -> None:
        """Tell wait_idle() a call ended (only while one waits)."""
        # Interrupts held back while the condition's lock is taken (see
        # pathlock._interrupts).
        with interrupts.held_back(), self._condition:
            self._condition.notify_all()

    def wait_idle(self, timeout: float) -> None:
        """Wait until no call is running, at most ``timeout`` seconds and
        never past the limit in force (close()'s bound)."""
        timeout = deadlines.capped(timeout)
        with self._condition:
            # Counted before the look: a call that ends after it sees the
            # count and wakes this one (see running()).
            self._waiting += 1
            try:
                self._condition.wait_for(lambda: not self._running, timeout)
            finally:
                self._waiting -= 1

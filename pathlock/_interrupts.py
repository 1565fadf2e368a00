"""Interrupts held back while a connection goes in or out of the pool.

A signal handler that raises (Ctrl-C's ``KeyboardInterrupt``, a ``SIGALRM`` or
``SIGTERM`` handler of the application) raises in the main thread between any
two bytecodes. Inside SQLAlchemy's connection pool that can happen right after
a ``with`` statement took the pool's lock and before its block began, which
leaves the lock held for good: every other thread of the process then hangs
in the pool (CPython issue 29988, and the note on signal handlers and
exceptions in the :mod:`signal` documentation). The stress run with random
interrupts hung that way about once in four runs.

:class:`held_back` keeps such signals from raising while the main thread takes
a connection from the pool or gives one back: their Python handlers are swapped
for one that only records the signal, and each recorded signal is handed to its
own handler right after, which raises as it would have. Opening a new
connection to the server is the exception (:func:`let_through`): it waits on
the network, and a Ctrl-C must be able to end that wait.

Only the main thread runs signal handlers; elsewhere this does nothing.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import _thread
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

# The signals an application commonly handles in Python. The others keep
# their handlers: looking at every signal's costs about 25 µs each time.
# (The C functions of ``_signal``: ``signal``'s wrappers convert to and from
# enums, which costs more than the swap itself.)
_SIGNALS = tuple(
    int(getattr(signal, name))
    for name in (
        "SIGINT",
        "SIGTERM",
        "SIGHUP",
        "SIGQUIT",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGUSR1",
        "SIGUSR2",
    )
    if hasattr(signal, name)
)

Handler = Callable[[int, FrameType | None], Any]

_local = threading.local()

# The main thread's id, read on every use of held_back (threading's
# current_thread() and main_thread() are Python calls). After a fork the
# thread that forked is the child's main thread.
_main = [threading.main_thread().ident]


def _forked() -> None:
    _main[0] = _thread.get_ident()


os.register_at_fork(after_in_child=_forked)


class held_back:  # noqa: N801 - used like a function: ``with held_back():``
    """Within the block, in the main thread, the signals of ``_SIGNALS``
    whose handlers are Python functions are recorded instead of handled, and
    handled (in arrival order) when it ends."""

    __slots__ = ("_held", "_outer", "_saved")

    def __init__(self) -> None:
        self._saved: dict[int, Handler] = {}
        self._held: list[tuple[int, FrameType | None]] = []
        self._outer: held_back | None = None

    def __enter__(self) -> held_back:
        if _thread.get_ident() != _main[0]:
            return self
        self._outer = getattr(_local, "current", None)
        try:
            self._hold()
        except BaseException:
            # A signal handled before its handler was swapped raised here:
            # no handler may stay swapped.
            self._restore()
            raise
        _local.current = self
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        if _thread.get_ident() != _main[0]:
            return
        _local.current = self._outer
        self._restore()
        held, self._held = self._held, []
        for signum, frame in held:
            handler = _signal.getsignal(signum)
            if callable(handler):
                handler(signum, frame)  # raises, as it would have when it came

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._held.append((signum, frame))

    def _hold(self) -> None:
        record, saved, getsignal = self._record, self._saved, _signal.getsignal
        for signum in _SIGNALS:
            handler = getsignal(signum)
            if callable(handler) and handler != record:
                saved[signum] = handler  # before the swap: restored whatever happens
                _signal.signal(signum, record)

    def _restore(self) -> None:
        """Put the handlers back, every one of them even if a signal that
        arrives meanwhile raises; then raise that."""
        raised: BaseException | None = None
        saved, self._saved = self._saved, {}
        for signum, handler in saved.items():
            try:
                _signal.signal(signum, handler)
            except BaseException as error:  # noqa: BLE001 - re-raised below
                raised = raised or error
                _signal.signal(signum, handler)
        if raised is not None:
            raise raised


@contextmanager
def let_through() -> Iterator[None]:
    """Within :class:`held_back`, let signals be handled again for the block:
    for a wait on the network, which a Ctrl-C must be able to end. Signals
    held back so far are handled first."""
    blocks: list[held_back] = []  # innermost first
    current: held_back | None = getattr(_local, "current", None)
    while current is not None:
        blocks.append(current)
        current = current._outer
    if not blocks or _thread.get_ident() != _main[0]:
        yield
        return
    left: list[held_back] = []
    try:
        for block in blocks:
            left.append(block)  # first: its __exit__ may raise a held-back signal
            block.__exit__(None, None, None)
        yield
    finally:
        # On the way out of an interrupted connect, too: the pool's clean-up
        # (and the held_back blocks' ends) follow.
        for block in reversed(left):
            block.__enter__()

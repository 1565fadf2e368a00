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
from collections.abc import Callable
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

# The main thread's id, read on every use of held_back (threading's
# current_thread() and main_thread() are Python calls). After a fork the
# thread that forked is the child's main thread.
_main = [threading.main_thread().ident]


class _State:
    """The main thread's held_back blocks (only the main thread runs signal
    handlers, so only it ever holds one), and the last look at the handlers."""

    current: held_back | None = None
    """The outermost block in force (the one that swapped the handlers);
    ``None``: signals are not held back."""
    seen: tuple[object, ...] = ()
    """The handlers of ``_SIGNALS`` at the last look."""
    python: tuple[tuple[int, Handler], ...] = ()
    """Those of them that are Python functions, with their signal numbers."""


_state = _State()


def _forked() -> None:
    _main[0] = _thread.get_ident()
    # The parent's main thread may have been inside a block: not this one.
    _state.current = None


os.register_at_fork(after_in_child=_forked)


def _python_handlers() -> tuple[tuple[int, Handler], ...]:
    """The handlers of ``_SIGNALS`` that are Python functions now, with their
    signal numbers.

    One look at every handler (about a microsecond, C calls only); which of
    them are Python functions is worked out again only when one changed."""
    seen = tuple(map(_signal.getsignal, _SIGNALS))
    if seen != _state.seen:
        _state.python = tuple(
            (signum, handler)
            for signum, handler in zip(_SIGNALS, seen, strict=True)
            if callable(handler)
        )
        _state.seen = seen
    return _state.python


class held_back:  # noqa: N801 - used like a function: ``with held_back():``
    """Within the block, in the main thread, the signals of ``_SIGNALS``
    whose handlers are Python functions are recorded instead of handled, and
    handled (in arrival order) when it ends.

    Only the outermost block in force swaps handlers: a block inside it
    costs a comparison, and what arrives meanwhile is handled when the
    outermost one ends (as it would be if the inner block swapped too).
    Elsewhere than in the main thread a block does nothing."""

    # No __init__: a block that does nothing allocates nothing.
    _active = False
    _saved: list[tuple[int, Handler]]
    _held: list[tuple[int, FrameType | None]]

    def __enter__(self) -> held_back:
        if _thread.get_ident() != _main[0] or _state.current is not None:
            return self  # another thread, or inside a block that holds already
        record = self._record
        self._held = []
        saved: list[tuple[int, Handler]] = []
        self._saved = saved
        # _python_handlers(), without the call when no handler changed.
        seen = tuple(map(_signal.getsignal, _SIGNALS))
        handlers = _state.python if seen == _state.seen else _python_handlers()
        try:
            for signum, handler in handlers:
                if handler != record:
                    saved.append((signum, handler))  # before the swap: restored whatever happens
                    _signal.signal(signum, record)
        except BaseException:
            # A signal handled before its handler was swapped raised here:
            # no handler may stay swapped.
            self._restore()
            raise
        self._active = True
        _state.current = self
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        if not self._active:
            return
        self._active = False
        _state.current = None
        self._restore()
        held, self._held = self._held, []
        for signum, frame in held:
            handler = _signal.getsignal(signum)
            if callable(handler):
                handler(signum, frame)  # raises, as it would have when it came

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._held.append((signum, frame))

    def _restore(self) -> None:
        """Put the handlers back, every one of them even if a signal that
        arrives meanwhile raises; then raise that."""
        raised: BaseException | None = None
        saved, self._saved = self._saved, []
        for signum, handler in saved:
            try:
                _signal.signal(signum, handler)
            except BaseException as error:  # noqa: BLE001 - re-raised below
                raised = raised or error
                _signal.signal(signum, handler)
        if raised is not None:
            raise raised


class let_through:  # noqa: N801 - used like a function: ``with let_through():``
    """Within :class:`held_back`, let signals be handled again for the block:
    for a wait on the network, which a Ctrl-C must be able to end. Signals
    held back so far are handled first.

    A class, not a generator: a generator's ``finally`` that held signals
    back again would run whenever the generator is collected if an
    interrupt struck at the start of the ``with`` block's exit (signals are
    let through there), long after the block it belonged to had ended; that
    block then stayed in force for good, its handlers swapped in and its
    held signals replayed at some later call."""

    __slots__ = ("_block",)

    def __enter__(self) -> let_through:
        block = _state.current
        self._block = None
        if block is None or _thread.get_ident() != _main[0]:
            return self
        try:
            block.__exit__(None, None, None)  # may raise a held-back signal
        except BaseException:
            block.__enter__()  # held back again for the pool's clean-up
            raise
        self._block = block
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        # On the way out of an interrupted connect, too: the pool's clean-up
        # (and the held_back block's end) follow.
        block, self._block = self._block, None
        if block is not None:
            block.__enter__()

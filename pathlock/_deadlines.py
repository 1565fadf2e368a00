"""How long a database call may still take.

A caller's ``timeout=`` bounds its whole call: connecting, every statement,
the retries and the sleeps between them. :mod:`pathlock._transactions` runs
every attempt under :func:`within`, which records, for this thread, the
monotonic time by which the attempt must be over; limits nest, and the
earliest one wins (``close()`` and a lock request put one around everything
they do).

A limit lives in a copy of the caller's context that the call leaves behind
(:meth:`contextvars.Context.run`, which is C code): a ``KeyboardInterrupt``
raised between any two bytecodes cannot leave it in force afterwards, as it
could between a ``ContextVar.set()`` and the ``try`` that resets it. One limit
left over that way made every later call of the thread fail at once.

Each dialect's connections keep to the limit in their driver's own way
(PyMySQL's: :class:`pathlock.dialects._pymysql.BoundedConnection`; psycopg's:
:mod:`pathlock.dialects._psycopg`; SQLite's busy wait:
:mod:`pathlock.dialects.sqlite`), reading :func:`time_left`, so a server that
hangs, a host that never answers, or a row lock held by a client that froze
mid-transaction costs an attempt no more than its limit.

The wait for a connection of a full pool keeps to the same limit
(:func:`bounded_pool`): threads stuck in transactions on a frozen
customer's row must not make every other call wait the pool's own timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar, copy_context
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.pool import AsyncAdaptedQueuePool, Pool, QueuePool

SHORTEST_WAIT = 0.001
"""Seconds a socket may wait once the limit has passed: a socket timeout of 0
would mean "never wait" to PyMySQL only by accident (a non-blocking socket),
and ``None`` would mean "forever"."""


@dataclass
class Limit:
    """The limit of the current attempt (or of an enclosing call)."""

    ends: float
    """Monotonic time by which every wait on the database must be over."""
    commit_unanswered: bool = False
    """True while a COMMIT sent under this limit has had no reply: after a
    failure, the transaction may or may not have been committed."""
    outer: Limit | None = None
    """The limit this one is nested in."""
    connected: bool = False
    """True once an attempt under this limit, or under one nested in it, got
    a connection (:func:`note_connected`): before that, nothing of the call
    can have reached the database."""


_monotonic = time.monotonic
_current: ContextVar[Limit | None] = ContextVar("pathlock_limit", default=None)
LIMIT = _current
"""The current limit, for a driver's connection that reads it where a call
would cost too much (``LIMIT.get()``; see :func:`time_left`)."""

T = TypeVar("T")


def within(ends: float, function: Callable[[Limit], T]) -> T:
    """``function(limit)``, with this thread's database calls ending by the
    monotonic time ``ends``, or by the limit already in force if that is
    earlier. The limit is gone when the call returns or raises, whatever
    interrupted it (see the module's docstring)."""
    return copy_context().run(_run_within, ends, function)


def _run_within(ends: float, function: Callable[[Limit], T]) -> T:
    outer = _current.get()  # as _nested(), without the call
    inner = Limit(ends if outer is None or ends < outer.ends else outer.ends, outer=outer)
    _current.set(inner)  # in the copied context: nothing to reset
    return function(inner)


def _nested(ends: float) -> Limit:
    """A limit that ends by ``ends``, or by the one in force if that is earlier."""
    outer = _current.get()
    return Limit(ends if outer is None else min(ends, outer.ends), outer=outer)


def note_connected() -> None:
    """Mark the limits in force as having got a connection (see
    :attr:`Limit.connected`)."""
    limit = _current.get()
    while limit is not None and not limit.connected:
        limit.connected = True
        limit = limit.outer


@asynccontextmanager
async def limit(ends: float) -> AsyncIterator[Limit]:
    """:func:`within` for a coroutine's block: in a coroutine an exception
    arrives only at an ``await``, never between the ``set()`` and the
    ``try``, so a reset in ``finally`` always runs."""
    inner = _nested(ends)
    token = _current.set(inner)
    try:
        yield inner
    finally:
        _current.reset(token)


def current() -> Limit | None:
    """The innermost limit in force, if any."""
    return _current.get()


_brief: ContextVar[float | None] = ContextVar("pathlock_brief_waits", default=None)


@contextmanager
def brief_waits(seconds: float) -> Iterator[None]:
    """Within the block, a wait for a free connection of the pool or for an
    embedded database's write lock lasts ``seconds`` at most, whatever the
    limits allow (statements are not bound by it): for an attempt made on an
    event loop's own thread, which must not block it (see
    :meth:`pathlock._aio.LoopRunner.attempt`)."""
    token = _brief.set(seconds)
    try:
        yield
    finally:
        _brief.reset(token)


def wait_ceiling() -> float:
    """The monotonic time by which a wait for a connection or a lock must end:
    the limits' :func:`ceiling`, or sooner within :func:`brief_waits`."""
    brief = _brief.get()
    ends = ceiling()
    return ends if brief is None else min(ends, _monotonic() + brief)


def ceiling() -> float:
    """The monotonic time by which the limits in force end (infinity: none)."""
    current = _current.get()
    return math.inf if current is None else current.ends


def capped(seconds: float) -> float:
    """``seconds``, or fewer: a wait that ends with the limits in force."""
    return min(seconds, max(0.0, ceiling() - _monotonic()))


def time_left(configured: float | None) -> float | None:
    """Seconds a wait may take now: ``configured`` (``None``: no timeout of
    its own), shortened to the time left under the current limit."""
    current = _current.get()
    if current is None:
        return configured
    ends = current.ends
    if ends == math.inf:
        return configured
    # Rounded up to the next 10 ms: PyMySQL calls settimeout() only when the
    # value changes, and a value that changes on every packet would cost a
    # system call per packet. (PyMySQL asks before every packet, twice: this
    # is on the hot path, hence no calls of math's functions.)
    left = max(-((_monotonic() - ends) * 100 // 1) / 100, SHORTEST_WAIT)
    return left if configured is None or left < configured else configured


def noting_unanswered(commit: Callable[[], None]) -> None:
    """``commit()``, with :attr:`Limit.commit_unanswered` true until its reply
    came (the COMMIT of a connection that keeps to the limits)."""
    current = _current.get()
    if current is not None:
        current.commit_unanswered = True
    commit()
    if current is not None:
        current.commit_unanswered = False


class _BoundedCheckout:
    """A queue pool whose wait for a free connection (``timeout``, read by
    SQLAlchemy as ``_timeout`` at every checkout that must wait) ends with
    the current limit."""

    _configured_timeout: float

    @property
    def _timeout(self) -> float:
        left = time_left(self._configured_timeout)
        brief = _brief.get()
        if brief is not None:
            return brief if left is None else min(left, brief)
        return self._configured_timeout if left is None else left

    @_timeout.setter
    def _timeout(self, value: float) -> None:
        self._configured_timeout = value


# SQLAlchemy names a pool's logger after its class's module: without the
# namespace of the pool they extend, these pools' lines ("Pool disposed")
# would come from a logger of pathlock's, for `pathlock -v` and every
# application that logs pathlock at INFO.


class _BoundedQueuePool(_BoundedCheckout, QueuePool):
    _sqla_logger_namespace = f"{QueuePool.__module__}.{QueuePool.__name__}"

    # An idle connection taken, and one given back to a pool with room, as
    # SQLAlchemy's queue does under its lock, without its conditions' calls
    # (nobody waits to give a connection back: the pool never blocks
    # there) or the time left for a wait that does not happen: a third of
    # the calls of a checkout and a checkin. Anything else, as QueuePool.

    def _do_get(self) -> Any:
        queue: Any = self._pool  # SQLAlchemy's util.queue.Queue
        with queue.mutex:
            if queue.queue:
                return queue._get()
        return super()._do_get()

    def _do_return_conn(self, record: Any) -> None:
        queue: Any = self._pool
        with queue.mutex:
            if queue.maxsize <= 0 or len(queue.queue) < queue.maxsize:
                queue._put(record)
                queue.not_empty.notify()  # a checkout that waits for one
                return
        super()._do_return_conn(record)


class _BoundedAsyncAdaptedQueuePool(_BoundedCheckout, AsyncAdaptedQueuePool):
    _sqla_logger_namespace = f"{AsyncAdaptedQueuePool.__module__}.{AsyncAdaptedQueuePool.__name__}"


_BOUNDED: dict[type[Pool], type[Pool]] = {
    QueuePool: _BoundedQueuePool,
    AsyncAdaptedQueuePool: _BoundedAsyncAdaptedQueuePool,
}


def bounded_pool(pool_class: type[Pool]) -> type[Pool]:
    """The pool class to use instead of ``pool_class`` (SQLAlchemy's default
    for an engine pathlock creates): one whose wait for a free connection
    ends with the current limit. SQLAlchemy's queue pools, the default for
    every database pathlock supports, wait their ``pool_timeout`` (30 s)
    whatever the caller's ``timeout``, so threads stuck in transactions on a
    frozen customer's row would make every other call wait that long. Any
    other kind of pool is kept."""
    return _BOUNDED.get(pool_class, pool_class)

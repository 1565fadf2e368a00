"""What runs inside the benchmark's worker processes.

Each worker is a process of its own (the ``spawn`` start method: a fresh
interpreter, as an app server's process would be) with its own
:class:`PathLockManager` (default settings), its own engine for the naive
algorithm, its own autocommit engine for the floor, and one connection of
each warmed up. It runs jobs
sent by :class:`pathlock.bench.team.Team`: a job is a module-level function of
this module and its keyword arguments. Jobs start at an agreed
``time.monotonic()`` instant and report ``time.monotonic()`` timestamps, which
the parent compares across processes: on Linux ``CLOCK_MONOTONIC`` is one
clock for the whole system.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from multiprocessing.queues import Queue, SimpleQueue
from multiprocessing.synchronize import Event
from typing import Any, Literal, Protocol

from sqlalchemy import create_engine, text

from pathlock import LockTimeout, PathLockManager
from pathlock.bench import BenchError
from pathlock.bench.database import Floor, floor_engine
from pathlock.bench.naive import NaiveLocks
from pathlock.lease import Lease

Algorithm = Literal["pathlock", "naive", "floor"]

Job = tuple[Callable[..., Any], dict[str, Any]]
"""A module-level function taking the worker's :class:`Context` first, and
its keyword arguments."""

# (requested, granted, released): time.monotonic() of one acquire + release.
Sample = tuple[float, float, float]

# What a request waits at most where nothing should block it for long; past
# it the benchmark has gone wrong (a lost worker holds the path), not slow.
STUCK = 120.0


class Locker(Protocol):
    """Acquire one path (``None``: not granted within ``timeout``) and release it."""

    def acquire(self, path: str, timeout: float) -> object | None: ...
    def release(self, held: Any) -> None: ...


class _Pathlock:
    def __init__(self, manager: PathLockManager, customer_id: int) -> None:
        self._locks = manager.for_customer(customer_id)

    def acquire(self, path: str, timeout: float) -> Lease | None:
        try:
            return self._locks.lock_paths(path, timeout=timeout)
        except LockTimeout:
            return None

    def release(self, held: Lease) -> None:
        held.release()


class _Naive:
    def __init__(self, naive: NaiveLocks) -> None:
        self._naive = naive

    def acquire(self, path: str, timeout: float) -> str | None:
        return self._naive.acquire(path, timeout=timeout)

    def release(self, held: str) -> None:
        self._naive.release(held)


class Context:
    """One worker's connections, kept for all its jobs."""

    def __init__(self, index: int, url: str, stop: Event) -> None:
        self.index = index
        self.stop = stop
        self.node_id = f"pathlock-bench-{index}"
        self.manager = PathLockManager(url, node_id=self.node_id)
        self.engine = create_engine(
            url, isolation_level="READ COMMITTED", pool_reset_on_return=None
        )
        self.floor_engine = floor_engine(url)
        # Connect all three now, so no job's first sample pays for it.
        self.manager.database_time()
        for engine in (self.engine, self.floor_engine):
            with engine.connect() as connection:
                connection.execute(text("SELECT 1"))

    def locker(self, algorithm: Algorithm, customer_id: int) -> Locker:
        """``algorithm``'s locks of ``customer_id``; for the floor, its row
        of that id (workers on customers of their own update rows of their
        own)."""
        if algorithm == "pathlock":
            return _Pathlock(self.manager, customer_id)
        if algorithm == "naive":
            return _Naive(NaiveLocks(self.engine, customer_id, node_id=self.node_id))
        return Floor(self.floor_engine, customer_id)

    def close(self) -> None:
        self.manager.close()
        self.engine.dispose()
        self.floor_engine.dispose()


def serve(
    index: int, url: str, inbox: SimpleQueue[Job | None], outbox: Queue[Any], stop: Event
) -> None:
    """A worker's main loop: report ready, then run jobs until ``None``.
    Every job's outcome goes to ``outbox`` as ``(index, ok, result)``; a
    failure carries its traceback as text."""
    try:
        context = Context(index, url, stop)
    except Exception:  # noqa: BLE001 - reported to the parent, which raises
        outbox.put((index, False, traceback.format_exc()))
        return
    try:
        outbox.put((index, True, None))
        while (job := inbox.get()) is not None:
            function, arguments = job
            try:
                outbox.put((index, True, function(context, **arguments)))
            except Exception:  # noqa: BLE001 - reported to the parent, which raises
                outbox.put((index, False, traceback.format_exc()))
    finally:
        context.close()


def _sleep_until(instant: float) -> None:
    delay = instant - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# -- jobs ---------------------------------------------------------------------------


def churn(
    context: Context,
    *,
    algorithm: Algorithm,
    customer_id: int,
    path: str,
    hold: float,
    start_at: float,
    until: float | None = None,
) -> list[Sample]:
    """From ``start_at``: acquire ``path``, hold it ``hold`` seconds, release,
    and again at once, until ``until`` or until the team's stop event."""
    locker = context.locker(algorithm, customer_id)
    samples: list[Sample] = []
    _sleep_until(start_at)
    while not context.stop.is_set() and (until is None or time.monotonic() < until):
        requested = time.monotonic()
        held = locker.acquire(path, STUCK)
        granted = time.monotonic()
        if held is None:
            raise BenchError(f"{path} not granted within {STUCK:g} s")
        if hold:
            time.sleep(hold)
        locker.release(held)
        samples.append((requested, granted, time.monotonic()))
    return samples


def request_once(
    context: Context,
    *,
    algorithm: Algorithm,
    customer_id: int,
    path: str,
    settle: float,
    cap: float,
    start_at: float,
) -> float | None:
    """``settle`` seconds after ``start_at``, request ``path`` and release it
    as soon as it is granted. Returns the time to grant, or ``None`` if it was
    not granted within ``cap`` seconds."""
    locker = context.locker(algorithm, customer_id)
    _sleep_until(start_at + settle)
    requested = time.monotonic()
    held = locker.acquire(path, cap)
    if held is None:
        return None
    waited = time.monotonic() - requested
    locker.release(held)
    return waited


def hand_off(
    context: Context,
    *,
    algorithm: Algorithm,
    customer_id: int,
    path: str,
    role: Literal["holder", "waiter"],
    acquire_at: float,
    release_at: float,
) -> tuple[float, ...]:
    """One round of the hand-off. The holder acquires at ``acquire_at`` and
    releases at ``release_at``: it returns (granted, release called, release
    returned). The waiter requests at ``acquire_at`` and releases at once
    when granted: it returns (requested, granted)."""
    locker = context.locker(algorithm, customer_id)
    _sleep_until(acquire_at)
    started = time.monotonic()
    held = locker.acquire(path, STUCK)
    granted = time.monotonic()
    if held is None:
        raise BenchError(f"{path} not granted within {STUCK:g} s")
    if role == "holder":
        _sleep_until(release_at)
    called = time.monotonic()
    locker.release(held)
    return (granted, called, time.monotonic()) if role == "holder" else (started, granted)

"""How the asyncio API runs pathlock's one algorithm without blocking the loop.

The request loop (:mod:`pathlock._acquire`, :mod:`pathlock._core.flow`), the retry
loop (:mod:`pathlock._transactions`), the store's transactions and the
manager's bookkeeping are written once, as plain functions. The asyncio API
runs them the way SQLAlchemy's own asyncio extension runs its ORM: inside a
greenlet (``greenlet_spawn``) on the event loop, with every wait handed to the
loop as a coroutine (``await_only``). Four kinds of wait exist, and each has
its asyncio form here:

- a transaction's attempt (:meth:`LoopRunner.attempt`): the statements go
  through the asyncio driver (asyncmy, aiosqlite), each awaited by the
  request's own task, under a timer that ends the attempt by its deadline, as
  the socket timeouts of :mod:`pathlock._deadlines` do for PyMySQL; a
  cancellation of the request waits for the attempt's end
  (:meth:`LoopRunner.cancel`); or, on an engine of a synchronous driver
  (SQLite's, see :attr:`Dialect.async_on_threads`), the whole attempt runs on
  the loop's own thread, in turns (:meth:`LoopRunner._take_turns`), unless it
  would have to wait for the file's write lock: then on a worker thread,
  bounded as in the synchronous API, and the loop awaits its end;
- the pause between two attempts (:meth:`LoopRunner.sleep`): ``asyncio.sleep``;
- a waiting request's sleep (:class:`LoopWaker`): an ``asyncio.Event`` that a
  release of another task (or thread) sets.
- a waiting request's check that joins another task's read of their customer
  (:attr:`LoopRunner.waits`, see :mod:`pathlock._polls`): an
  ``asyncio.Event`` that the task making the read sets.

So a waiting task holds no thread and never blocks the loop, and a task that
is cancelled is cancelled inside whichever wait it is in: the cancellation
unwinds the same code an interrupt unwinds in the synchronous API.

Renewals are tasks of the loop (:class:`TaskHeartbeat`), driven by the same
schedule as the synchronous API's heartbeat thread. The manager's other
background threads (the settling of leases in doubt, renewals that wait for
a customer's row, the reaper) keep their schedules; their database calls are
handed to the loop (``run_coroutine_threadsafe``) and wait there for the
answer, or, on an engine of a synchronous driver, run on the thread itself.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from pathlock import _batch as batch
from pathlock import _deadlines as deadlines
from pathlock._core.schedule import Schedule
from pathlock._heartbeat import declare_lost, renew_round, run_callback
from pathlock._polls import Waits
from pathlock._routing import Node
from pathlock._transactions import THREAD, AttemptFailed, NoAnswerInTime
from pathlock.clock import Clock
from pathlock.dialects.base import is_async
from pathlock.errors import BackendError
from pathlock.lease import Lease, LostCallback

T = TypeVar("T")
log = logging.getLogger("pathlock")

_WORKERS = 8
"""Worker threads of a manager whose database is reached through a
synchronous driver (SQLite): attempts beyond it queue for a thread, as they
would for a connection of the pool."""

ON_LOOP_WAIT = 0.001
"""Seconds an attempt on the loop's own thread (SQLite) may wait for the
file's write lock or for a connection of the pool before it goes to a worker
thread instead (:meth:`LoopRunner._on_loop`)."""

ON_LOOP_TURN = 0.002
"""Seconds of attempts on the loop's own thread after which the loop takes a
turn (its timers, its I/O) before the next one (:meth:`LoopRunner._take_turns`)."""

_SPARE = 5.0
"""Seconds a background thread waits for the loop beyond the call's own
deadline before it gives up on an answer (a loop that stopped running)."""


def in_greenlet() -> bool:
    """Whether this code runs inside SQLAlchemy's ``greenlet_spawn``."""
    try:
        from greenlet import getcurrent  # noqa: PLC0415 - the async extra
    except ImportError:  # pragma: no cover - the async API needs it
        return False
    return bool(getattr(getcurrent(), "__sqlalchemy_greenlet_provider__", False))


async def spawn(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``function`` (plain code that may wait through :func:`wait`) in a
    greenlet on the running loop."""
    from sqlalchemy.util import greenlet_spawn  # noqa: PLC0415 - the async extra

    result: T = await greenlet_spawn(function, *args, **kwargs)
    return result


def wait(
    loop: asyncio.AbstractEventLoop | None,
    coroutine: Coroutine[Any, Any, T],
    *,
    seconds: float | None,
) -> T:
    """Run ``coroutine`` on ``loop`` and return its result: from a greenlet
    of :func:`spawn`, by handing it to the loop; from another thread, by
    waiting up to ``seconds`` (``None``: no limit) plus a margin for it."""
    if in_greenlet():
        from sqlalchemy.util import await_only  # noqa: PLC0415

        return await_only(coroutine)
    if loop is None or loop.is_closed() or _running_loop() is loop:
        coroutine.close()
        why = (
            "the AsyncPathLockManager's event loop is closed"
            if loop is None or loop.is_closed()
            else "a database call on the event loop outside pathlock's greenlet (a bug)"
        )
        raise BackendError("reaching the event loop", RuntimeError(why))
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    try:
        return future.result(None if seconds is None else seconds + _SPARE)
    except concurrent.futures.TimeoutError as error:
        future.cancel()
        raise BackendError(
            "reaching the event loop", RuntimeError("the event loop did not answer in time")
        ) from error
    except concurrent.futures.CancelledError as error:
        raise BackendError(
            "reaching the event loop", RuntimeError("the event loop shut down")
        ) from error


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _pool_timed_out(seconds: float) -> PoolTimeout:
    """The error of an attempt whose time ran out while it waited for a
    connection of a full pool: the one the pool raises when its own wait
    ends."""
    return PoolTimeout(
        f"no connection of the pool came free within the attempt's time ({seconds:.3g} s)"
    )


def _timed_out(seconds: float) -> OperationalError:
    return OperationalError(
        "(an attempt under an asyncio timeout)",
        None,
        NoAnswerInTime(f"no answer from the server (timed out after {seconds:.3g} s)"),
        connection_invalidated=True,
    )


class LoopRunner:
    """Carries out a transaction's attempts and pauses on an event loop
    (:class:`pathlock._transactions.Runner`). Bound to its loop when the
    asyncio manager opens (:meth:`bind`).

    An attempt on an engine of an asyncio driver runs on the loop, each
    driver call awaited. An attempt on an engine of a synchronous driver (the
    embedded SQLite file, see ``Dialect.async_on_threads``) runs whole on the
    loop's own thread when it need not wait (:meth:`_on_loop`), and else on
    a worker thread, the loop awaiting its end: one hand-off per transaction
    instead of one per driver call."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._workers: concurrent.futures.ThreadPoolExecutor | None = None
        self._workers_lock = threading.Lock()
        self._attempting: dict[asyncio.Task[Any], _Attempting] = {}
        # Attempts on the loop's own thread (see _take_turns): when those of
        # this turn of the loop began, whether its end is scheduled, and the
        # attempts waiting for a turn of their own.
        self._turn_began: float | None = None
        self._turn_ending = False
        self._turns: collections.deque[asyncio.Future[None]] = collections.deque()
        # The tasks of the loop share their reads of a customer while they
        # wait (pathlock._polls), waiting for one another on the loop.
        self.waits = Waits(functools.partial(_LoopEvent, self), self.sleep)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def attempt(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        *,
        read_only: bool,
    ) -> tuple[T, bool]:
        in_task = in_greenlet()
        if not is_async(node.engine):
            if not in_task:
                # A background thread of the manager: nothing to hand over.
                return THREAD.attempt(node, operation, number, ends, read_only=read_only)
            self._take_turns()
            made = self._on_loop(node, operation, number, ends, read_only)
            if made is not None:
                return made
            coroutine = self._on_thread(node, operation, number, ends, read_only)
        elif in_task:
            return self._in_task(node, operation, number, ends, read_only)
        else:
            coroutine = self._for_thread(node, operation, number, ends, read_only)
        # The attempt runs on a worker thread or on the loop, whose limits
        # are not this caller's: it could not mark them when it gets its
        # connection, so it counts as reaching the database from the start
        # (Limit.connected: a request cancelled meanwhile undoes what the
        # attempt may still commit).
        deadlines.note_connected()
        return wait(self.loop, coroutine, seconds=max(0.0, ends - time.monotonic()))

    def _take_turns(self) -> None:
        """Before an attempt on the loop's own thread: once such attempts have
        run for :data:`ON_LOOP_TURN` in one turn of the loop (a hundred
        tasks that ask at once), or while others wait for theirs, wait for
        a turn of its own, first come, first served: the loop runs its
        timers and its I/O between two turns (a turn ends when the callbacks
        scheduled before it have run)."""
        loop = self.loop
        if loop is None:  # pragma: no cover - in_greenlet() said it runs
            return
        began, now = self._turn_began, time.monotonic()
        if not self._turns and (began is None or now - began < ON_LOOP_TURN):
            if began is None:
                self._begin_turn(loop, now)
            return
        turn: asyncio.Future[None] = loop.create_future()
        self._turns.append(turn)
        try:
            wait(loop, _given(turn), seconds=None)
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._end_turn_soon(loop)  # given a turn it will not take
            raise
        self._begin_turn(loop, time.monotonic())

    def _begin_turn(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        self._turn_began = now
        self._end_turn_soon(loop)

    def _end_turn_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._turn_ending:
            self._turn_ending = True
            loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        """The loop took a turn: the next attempt waiting for one may go."""
        self._turn_ending = False
        self._turn_began = None
        while self._turns:
            turn = self._turns.popleft()
            if not turn.done():  # not cancelled meanwhile
                turn.set_result(None)
                return

    def _on_loop(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        read_only: bool,
    ) -> tuple[T, bool] | None:
        """An attempt on an engine of a synchronous driver (the embedded
        SQLite file), made on the loop's own thread: its driver calls are
        local and take microseconds, unless it must wait for the file's
        write lock or for a connection of the pool. Those waits last
        :data:`ON_LOOP_WAIT` at most here; ``None`` if that was not enough:
        then the transaction was rolled back before it wrote anything, and
        the attempt goes to a worker thread, which may wait as long as the
        call allows. The loop is blocked for the attempt's statements and
        its COMMIT (the file's sync: see docs/ASYNCIO.md), never for another
        process's transaction."""
        try:
            with deadlines.brief_waits(ON_LOOP_WAIT):
                # The pool is a thread pool's (worker threads, the renewals'
                # thread): interrupts are held back around it, as on a thread.
                return THREAD.attempt(node, operation, number, ends, read_only=read_only)
        except AttemptFailed as failed:
            error = failed.error
            busy = isinstance(error, PoolTimeout) or (
                isinstance(error, DBAPIError) and node.dialect.is_busy(error)
            )
            if failed.unanswered or not busy:
                raise
            return None

    def cancel(self, task: asyncio.Task[Any]) -> None:
        """Cancel ``task`` (a request's): at once, or, while it is in the
        middle of an attempt on the loop, as soon as that attempt is over.
        Cut short, the attempt would drop its connection with a query on its
        way (a COMMIT, or a release's statements with theirs) that could land
        after whatever the task does next to undo the attempt (delete its
        rows by lease id). The attempt ends within its own time: done, or
        never to be. An attempt without a connection yet is cut short at
        once, as its timer would."""
        attempting = self._attempting.get(task)
        if attempting is None or not attempting.connected:
            # Still waiting for a connection (of the pool, or a new one that
            # the server may never answer): nothing can be on its way yet.
            task.cancel()
        else:
            attempting.cancelled = True

    def run_blocking(self, function: Callable[[], T]) -> Coroutine[Any, Any, T]:
        """``function`` (which may use a synchronous driver's engine
        directly) on a worker thread, awaited. A cancelled caller does not
        wait for it; it runs to its end."""
        return self._on_worker(contextvars.copy_context().run, function)

    def shutdown(self) -> None:
        """Let the worker threads end once their attempts have (the manager
        closes)."""
        with self._workers_lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=False)

    async def _on_thread(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        read_only: bool,
    ) -> tuple[T, bool]:
        made = _Made()
        # The caller's context (its time limits) goes with the attempt.
        context = contextvars.copy_context()
        try:
            attempt = functools.partial(
                THREAD.attempt, node, operation, number, ends, read_only=read_only
            )
            return await self._on_worker(context.run, made.run, attempt)
        except asyncio.CancelledError:
            # The attempt's thread may be waiting for the file's write lock
            # (up to its busy timeout): the caller does not wait for it. From
            # now on its statements and its COMMIT are refused
            # (watch_cancellations). A COMMIT already under way holds the
            # write lock, so whatever the caller does next in a transaction
            # of its own (delete what the attempt may have granted) comes
            # after it.
            made.cancelled = True
            raise

    async def _on_worker(self, function: Callable[..., T], /, *args: Any) -> T:
        future = asyncio.get_running_loop().run_in_executor(self._executor(), function, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_retrieved)
            raise

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._workers_lock:
            if self._workers is None:
                self._workers = concurrent.futures.ThreadPoolExecutor(
                    max_workers=_WORKERS, thread_name_prefix="pathlock-db"
                )
            return self._workers

    def sleep(self, seconds: float) -> None:
        wait(self.loop, asyncio.sleep(seconds), seconds=seconds)

    def waker(self) -> LoopWaker:
        """A waiting request's sleep (:class:`pathlock.waiting.Waker`)."""
        return LoopWaker(self)

    def _in_task(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        read_only: bool,
    ) -> tuple[T, bool]:
        """An attempt on an engine of an asyncio driver, in the greenlet of
        the calling task: every driver call is awaited by the task itself,
        under a timer that cancels the task by ``ends`` (as socket timeouts
        end an attempt in the synchronous API; the connection is dropped).
        A cancellation asked for meanwhile (:meth:`cancel`) waits for the
        attempt's end."""
        task = asyncio.current_task()
        if task is None or self.loop is None:  # pragma: no cover - in_greenlet() said so
            raise RuntimeError("an attempt in a greenlet outside a task")
        attempting = self._attempting[task] = _Attempting(task)
        cancelling = task.cancelling()  # cancellations asked for before this attempt
        seconds = ends - time.monotonic()
        timer = (
            None
            if math.isinf(seconds)
            else self.loop.call_later(max(seconds, 0.0), attempting.expire)
        )

        def cut_off(error: BaseException) -> SQLAlchemyError | None:
            if not (attempting.expired and isinstance(error, asyncio.CancelledError)):
                return None
            # The timer's cancellation, unless another one came meanwhile (as
            # asyncio.timeout decides): that one stands.
            if task.uncancel() > cancelling:
                return None
            if attempting.waiting_for_pool:
                # Still waiting for a connection of a full pool: the wait the
                # pool would have ended at the same moment (bounded_pool).
                return _pool_timed_out(max(seconds, 0.0))
            return _timed_out(max(seconds, 0.0))

        try:
            return THREAD.attempt(
                node,
                operation,
                number,
                ends,
                read_only=read_only,
                # Tasks interleave on one thread: nothing to hold back.
                guard=contextlib.nullcontext,
                cut_off=cut_off,
                connected=attempting.got_connection,
            )
        finally:
            if timer is not None:
                timer.cancel()
            del self._attempting[task]
            if attempting.cancelled:
                raise asyncio.CancelledError  # the caller's cancellation wins over any outcome

    async def _for_thread(
        self,
        node: Node,
        operation: Callable[[Connection, int], T],
        number: int,
        ends: float,
        read_only: bool,
    ) -> tuple[T, bool]:
        """An attempt on an engine of an asyncio driver for a background
        thread of the manager: in a task of its own, which runs to its end
        even if the thread stops waiting."""
        attempt = asyncio.ensure_future(
            spawn(self._in_task, node, operation, number, ends, read_only)
        )
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            attempt.add_done_callback(_retrieved)
            await asyncio.wait([attempt])
            raise


async def _given(turn: asyncio.Future[None]) -> None:
    await turn


class _Attempting:
    """An attempt under way in a task's greenlet (:meth:`LoopRunner._in_task`)."""

    __slots__ = ("cancelled", "connected", "expired", "task", "waiting_for_pool")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.expired = False  # its time ran out: the timer cancelled the task
        self.cancelled = False  # the task is to be cancelled once it is over
        # Until the pool gives it a connection, or opens a new one for it.
        self.waiting_for_pool = True
        self.connected = False  # the pool gave it a connection

    def stop_waiting_for_pool(self) -> None:
        self.waiting_for_pool = False

    def got_connection(self) -> None:
        self.waiting_for_pool = False
        self.connected = True

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


_MADE: contextvars.ContextVar[_Made] = contextvars.ContextVar("pathlock_attempt_on_a_thread")


class _Made:
    """An attempt made on a worker thread for a task, which may be cancelled
    while the attempt goes on."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def run(self, attempt: Callable[[], T]) -> T:
        _MADE.set(self)  # in the attempt's own context
        return attempt()


class AttemptCancelled(Exception):
    """The task an attempt on a worker thread was made for was cancelled: the
    attempt's next statement (or its COMMIT) is refused."""


def watch_cancellations(engine: Engine) -> None:
    """Refuse the statements and the COMMIT of an attempt on a worker thread
    once its task was cancelled (see :meth:`LoopRunner._on_thread`)."""

    def refuse_if_cancelled(*_args: Any) -> None:
        made = _MADE.get(None)
        if made is not None and made.cancelled:
            raise AttemptCancelled("the task this attempt was made for was cancelled")

    event.listen(engine, "before_cursor_execute", refuse_if_cancelled)
    event.listen(engine, "commit", refuse_if_cancelled)


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A worker's result nobody awaits any more: read, so that its failure
    is not reported as never retrieved."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("an attempt of a cancelled task failed", exc_info=future.exception())


def watch_connects(engine: Engine, runner: LoopRunner) -> None:
    """Note on the attempt under way in a task when ``engine``'s pool opens a
    new connection for it, rather than wait for one to come free: if its time
    runs out now, the database did not answer, the pool was not full."""

    def connecting(*_args: Any) -> None:
        task = asyncio.current_task() if _running_loop() is not None else None
        attempting = None if task is None else runner._attempting.get(task)
        if attempting is not None:
            attempting.stop_waiting_for_pool()

    event.listen(engine, "do_connect", connecting)


def watch_commits(engine: Engine) -> None:
    """Mark the attempt's limit while a COMMIT of ``engine`` is on its way,
    as :class:`pathlock.dialects._pymysql.BoundedConnection` does for PyMySQL: an
    attempt cut short then is known to be in doubt. The mark is cleared when
    the connection's next transaction begins (the COMMIT was answered)."""

    # A batch that ends with its COMMIT marks the limit itself (_batch.run).
    @batch.done_in_batches
    def committing(_connection: Connection) -> None:
        current = deadlines.current()
        if current is not None:
            current.commit_unanswered = True

    @batch.done_in_batches
    def beginning(_connection: Connection) -> None:
        current = deadlines.current()
        if current is not None:
            current.commit_unanswered = False

    event.listen(engine, "commit", committing)
    event.listen(engine, "begin", beginning)


class LoopWaker:
    """A waiting request's sleep on the loop (:class:`pathlock.waiting.Waker`):
    an event that :meth:`wake`, from any thread, sets."""

    __slots__ = ("_event", "_runner")

    def __init__(self, runner: LoopRunner) -> None:
        self._runner = runner
        self._event = asyncio.Event()

    def wake(self) -> None:
        loop = self._runner.loop
        if loop is None or _running_loop() is loop:
            self._event.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody sleeps
            loop.call_soon_threadsafe(self._event.set)

    def sleep(self, seconds: float) -> None:
        wait(self._runner.loop, self._sleep(seconds), seconds=seconds)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._event.wait()


class _LoopEvent:
    """What a task waits on for another task's read of their customer
    (:class:`pathlock._polls.Event`): an event set and awaited on the loop,
    by tasks of the loop."""

    __slots__ = ("_event", "_runner")

    def __init__(self, runner: LoopRunner) -> None:
        self._runner = runner
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._event.is_set():
            return True
        return wait(self._runner.loop, self._wait(timeout), seconds=timeout)

    async def _wait(self, timeout: float | None) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()
        return self._event.is_set()


class TaskHeartbeat:
    """The asyncio API's renewals (the interface of
    :class:`pathlock._heartbeat.Heartbeat`): the same
    :class:`~pathlock._core.schedule.Schedule`, carried out by a task of the loop
    that sleeps until its next entry, with each round of renewals in a task
    of its own, so that a renewal stuck in the network never delays a loss
    being declared. ``on_lost`` callbacks run on the loop, one at a time.

    Everything happens on the loop's thread; calls from other threads (a
    renewal that waited for its customer's row, the settling of leases in
    doubt) are handed to it."""

    def __init__(
        self,
        runner: LoopRunner,
        renew: Callable[[list[Lease]], None],
        *,
        retry_after: float,
        clock: Clock,
    ) -> None:
        self._runner = runner
        self._renew = renew
        self._clock = clock
        self._schedule = Schedule(retry_after=retry_after)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._rounds: set[asyncio.Task[None]] = set()
        self._callbacks: asyncio.Task[None] | None = None
        self._queue: collections.deque[tuple[Lease, LostCallback]] = collections.deque()
        self._stopping = False

    def add(self, lease: Lease) -> None:
        """Renew ``lease`` from now on: O(log n) in the leases held."""
        if self._stopping or self._handed_over(self.add, lease):
            return
        earliest = self._schedule.add(lease)
        if self._task is None:
            self._wake = wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(wake))
        elif earliest:
            self._wake_up()

    def run_callbacks(self, lease: Lease, callbacks: Sequence[LostCallback]) -> None:
        """Call ``callbacks`` with ``lease``, in order, on the loop."""
        if self._handed_over(self.run_callbacks, lease, callbacks):
            return
        self._queue.extend((lease, callback) for callback in callbacks)
        if self._callbacks is None or self._callbacks.done():
            self._callbacks = asyncio.get_running_loop().create_task(self._run_callbacks())

    def stop(self, _timeout: float = 0.0) -> None:
        """Schedule and start nothing more (:meth:`aclose` ends the tasks)."""
        self._stopping = True

    async def aclose(self, timeout: float) -> None:
        """Stop, and end the tasks: a round in flight gets up to ``timeout``
        seconds to finish; callbacks already due still run (as long)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        pending = [*self._rounds, *([self._callbacks] if self._callbacks else [])]
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout)
            for task in late:
                task.cancel()
        tasks = [task for task in (self._task, *self._rounds) if task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _handed_over(self, method: Callable[..., None], *args: Any) -> bool:
        """Whether the call was handed to the loop's thread (or dropped: the
        loop is gone, and with it whatever would renew or report)."""
        loop = self._runner.loop
        if loop is not None and _running_loop() is loop:
            return False
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed
                loop.call_soon_threadsafe(method, *args)
        return True

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self, wake: asyncio.Event) -> None:
        schedule, clock = self._schedule, self._clock
        loop = asyncio.get_running_loop()
        while not self._stopping:
            wake.clear()
            lost, batch = schedule.due(clock.now())
            for lease in lost:
                declare_lost(lease)
            if batch:
                task = loop.create_task(self._round(batch))
                self._rounds.add(task)
                task.add_done_callback(self._rounds.discard)
            next_at = schedule.next_at()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(
                    None if next_at is None else max(0.0, next_at - clock.now())
                ):
                    await wake.wait()

    async def _round(self, batch: list[Lease]) -> None:
        failed_at = None
        try:
            failed_at = await spawn(renew_round, self._renew, batch, self._clock)
        finally:
            self._schedule.round_over(batch, failed_at)
            self._wake_up()

    async def _run_callbacks(self) -> None:
        while self._queue:
            lease, callback = self._queue.popleft()
            run_callback(lease, callback)
            await asyncio.sleep(0)  # a long run of losses never holds the loop

"""A manager's life in a real process: close() while others work, fork(),
interrupts at any moment, and the interpreter's exit.

Invariant under attack: after any call returns or raises, every row in the
database belongs to a lease that a live manager knows about (or expires within
its ttl), and no two holders ever believe they hold conflicting locks.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, event

from pathlock import (
    CustomerLocks,
    LeaseLost,
    LockTimeout,
    ManagerClosed,
    PathLockManager,
    Settings,
    _polls,
    waiting,
)
from pathlock import _batch as batch
from pathlock import _deadlines as deadlines
from pathlock.dialects.base import ServerSession
from tests.row_counts import rows_of

T = TypeVar("T")
HANG = 60.0  # seconds: only reached when something is broken


# -- close() ------------------------------------------------------------------------


def test_close_wakes_waiters_and_grants_nothing_after(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    manager = PathLockManager(database_url)
    locks = manager.for_customer(customer_id)
    holder = locks.lock_paths("/Shared/a")
    errors: list[BaseException] = []
    waiting = threading.Event()

    def wait_for_it() -> None:
        waiting.set()
        try:
            locks.lock_paths("/Shared/a/b", timeout=HANG)
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            errors.append(error)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    waiting.wait(HANG)
    time.sleep(0.3)  # queued and watching
    manager.close()  # releases /Shared/a: the waiter must not get it
    waiter.join(HANG)
    assert not waiter.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], ManagerClosed)
    assert holder.released
    assert rows_of(raw_engine, customer_id) == (0, 0)


def test_a_with_block_whose_lease_close_released_raises_lease_lost(
    database_url: str, customer_id: int
) -> None:
    manager = PathLockManager(database_url)
    locks = manager.for_customer(customer_id)
    seen: list[BaseException] = []

    def hold_while_closed() -> None:
        with locks.lock_paths("/Shared/a") as lease:
            manager.close()
            try:
                lease.ensure_held()
            except LeaseLost as error:
                seen.append(error)

    with pytest.raises(LeaseLost, match="closed"):
        hold_while_closed()
    assert len(seen) == 1


def test_every_call_after_close_raises_manager_closed(database_url: str, customer_id: int) -> None:
    manager = PathLockManager(database_url)
    locks = manager.for_customer(customer_id)
    manager.close()
    calls: list[Callable[[], Any]] = [
        lambda: manager.for_customer(customer_id),
        manager.list_locks,
        manager.list_waiters,
        manager.database_time,
        manager.reap_expired,
        manager.create_schema,
        manager.start_reaper,
        lambda: manager.release_lease("0" * 32),
        lambda: manager.release_node("web-1"),
        lambda: locks.lock_paths("/a"),
        lambda: locks.try_lock_paths("/a"),
        locks.release_locks,
        locks.list_locks,
    ]
    for call in calls:
        with pytest.raises(ManagerClosed):
            call()
    manager.close()  # idempotent


# -- fork() -------------------------------------------------------------------------


def _in_child(work: Callable[[], int]) -> int:
    """Fork; run ``work`` in the child and exit with its status (1 on any
    exception); return the child's exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            status = work()
        except BaseException:  # noqa: BLE001 - reported through the status
            import traceback  # noqa: PLC0415

            traceback.print_exc()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@contextmanager
def _held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread while the block runs (a fork() in it
    copies the lock held)."""
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            done.wait(HANG)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(HANG)
    try:
        yield
    finally:
        done.set()
        thread.join(HANG)


@pytest.fixture
def used_manager(database_url: str) -> Iterator[PathLockManager]:
    """A manager that has already used its pool before the fork."""
    with PathLockManager(database_url, ttl=3.0) as manager:
        manager.list_locks(customer_id=1)
        yield manager


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_forked_child_cannot_release_the_parents_leases(
    used_manager: PathLockManager, customer_id: int, raw_engine: Engine, database_url: str
) -> None:
    locks = used_manager.for_customer(customer_id)
    lease = locks.lock_paths("/Shared/a")

    def child() -> int:
        inherited_held = True
        try:
            lease.ensure_held()
        except LeaseLost:
            inherited_held = False
        lease.release()
        locks.release_locks()
        used_manager.close()
        return 0 if not inherited_held else 3

    assert _in_child(child) == 0
    lease.ensure_held()
    assert rows_of(raw_engine, customer_id) == (1, 0)
    with PathLockManager(database_url) as other:
        assert other.for_customer(customer_id).try_lock_paths("/Shared/a") is None
    lease.release()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_forked_children_and_their_parent_share_no_connection(
    used_manager: PathLockManager, customer_id: int, raw_engine: Engine
) -> None:
    locks = used_manager.for_customer(customer_id)
    children = []
    for n in range(4):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            status = 1
            try:
                for _ in range(30):
                    with locks.lock_paths(f"/child-{n}", timeout=HANG):
                        pass
                status = 0
            finally:
                os._exit(status)
        children.append(pid)
    for _ in range(30):  # the parent keeps using its own pool meanwhile
        with locks.lock_paths("/parent", timeout=HANG):
            pass
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert rows_of(raw_engine, customer_id) == (0, 0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_that_drops_the_parents_pool_leaves_its_sessions_open(
    used_manager: PathLockManager, customer_id: int
) -> None:
    # The child drops the pool it inherited, unclosed, and the collector
    # frees its connections: nothing of that may reach the server on the
    # sockets the child shares with its parent. On PostgreSQL it sent a
    # Terminate, which ended the parent's sessions.
    engines = {node.engine for node in used_manager._store.router.nodes}
    engines |= {node.engine for node in used_manager._renewals.router.nodes}
    locks = used_manager.for_customer(customer_id)
    for _ in range(3):  # a connection or two in each pool
        with locks.lock_paths("/parent", timeout=HANG):
            pass
    connected: list[object] = []
    for engine in engines:
        event.listen(engine, "connect", lambda *_: connected.append(1))

    def child() -> int:
        with locks.lock_paths("/child", timeout=HANG):
            pass
        gc.collect()
        return 0

    assert _in_child(child) == 0
    for _ in range(5):
        with locks.lock_paths("/parent", timeout=HANG):
            pass
    assert connected == []  # the parent's connections still worked


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_lease_taken_in_a_forked_child_is_renewed(
    used_manager: PathLockManager, customer_id: int, raw_engine: Engine
) -> None:
    locks = used_manager.for_customer(customer_id)
    lost: list[object] = []

    def child() -> int:
        with locks.lock_paths("/Shared/a", ttl=1.0, on_lost=lost.append) as lease:
            time.sleep(3.5)  # several ttls: only renewal keeps it
            lease.ensure_held()
        used_manager.close()
        return 0 if not lost else 4

    assert _in_child(child) == 0
    assert rows_of(raw_engine, customer_id) == (0, 0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_while_a_thread_held_the_heartbeats_lock_can_close(
    used_manager: PathLockManager, customer_id: int
) -> None:
    used_manager.for_customer(customer_id).lock_paths("/Shared/a")  # the heartbeat runs
    heartbeat = used_manager._heartbeat
    assert heartbeat is not None

    def child() -> int:
        signal.alarm(20)  # a hang fails the child instead of the whole test run
        used_manager.close()
        return 0

    with _held_by_another_thread(heartbeat._condition):
        assert _in_child(child) == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_child_forked_while_a_thread_held_the_dropped_sessions_lock_can_lock(
    used_manager: PathLockManager, customer_id: int
) -> None:
    # A connection dropped in the middle of an operation leaves its session
    # to be ended before the node's next write; the child's writes neither
    # wait for the parent's lock of that list nor end the parent's sessions.
    (node,) = used_manager._store.router.nodes
    node.dropped.add(ServerSession(2**40, "parent"), 60.0)

    def child() -> int:
        # A hang kills the child instead of hanging the whole test run.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(20)
        used_manager.for_customer(customer_id).lock_paths("/Shared/a").release()
        (forked,) = used_manager._store.router.nodes
        return 0 if not forked.dropped else 1

    with _held_by_another_thread(node.dropped._lock):
        assert _in_child(child) == 0
    assert node.dropped  # the parent's, still to be ended by the parent


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
def test_a_child_forked_while_a_thread_read_for_the_waiters_can_wait(
    used_manager: PathLockManager, customer_id: int
) -> None:
    # The waiting threads of a process read their customer together: a read
    # under way in the parent, and the lock of those reads held, at the fork.
    polls = used_manager._store.queue._polls
    polls._reading[customer_id] = _polls._Reading(time.monotonic(), [])
    locks = used_manager.for_customer(customer_id)
    holder = locks.lock_paths("/Shared/a")

    def child() -> int:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(20)  # a hang kills the child instead of the whole test run
        began = time.monotonic()
        mine = used_manager.for_customer(customer_id)
        # Waits for the parent's lease, checking: its checks must not wait
        # for the parent's read, nor for its lock.
        try:
            mine.lock_paths("/Shared/a", timeout=0.5)
        except LockTimeout:
            return 0 if time.monotonic() - began < 5 else 1
        return 1  # granted: the parent's lease was not in its way

    try:
        with _held_by_another_thread(polls._lock):
            assert _in_child(child) == 0
    finally:
        polls._reading.pop(customer_id, None)
        holder.release()


# -- interrupts ---------------------------------------------------------------------


class _Interrupt:
    """Raises KeyboardInterrupt once, right after (or before) a COMMIT reaches
    the server: the moment at which a grant's outcome is in doubt. A COMMIT
    sent on its own goes through the dialect's do_commit; one at the end of
    a batch (a release's, a grant in one round trip) goes with the batch,
    whose engine's transaction SQLAlchemy may never hear of."""

    def __init__(self, manager: PathLockManager, *, after: bool) -> None:
        self._dialect = manager.engine.dialect
        self._original = self._dialect.do_commit
        self._run_batch = batch.run
        self._after = after
        self._monkeypatch = pytest.MonkeyPatch()

    def _fired(self) -> None:
        self._dialect.do_commit = self._original  # type: ignore[method-assign]
        self._monkeypatch.undo()

    def __enter__(self) -> _Interrupt:
        def do_commit(dbapi_connection: Any) -> None:
            self._fired()
            if self._after:
                self._original(dbapi_connection)
            raise KeyboardInterrupt

        def run_batch(*args: Any, commit: bool = False, **kwargs: Any) -> Any:
            if not commit:
                return self._run_batch(*args, commit=commit, **kwargs)
            self._fired()
            if self._after:
                self._run_batch(*args, commit=commit, **kwargs)
            raise KeyboardInterrupt

        self._dialect.do_commit = do_commit  # type: ignore[method-assign]
        self._monkeypatch.setattr(batch, "run", run_batch)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._fired()


def test_an_interrupt_right_after_the_grants_commit_leaves_nothing(
    manager: PathLockManager, locks: CustomerLocks, customer_id: int, raw_engine: Engine
) -> None:
    with _Interrupt(manager, after=True), pytest.raises(KeyboardInterrupt):
        locks.lock_paths("/Shared/a")
    assert rows_of(raw_engine, customer_id) == (0, 0)
    # The same thread's next request is granted, not told it waits for itself.
    with locks.lock_paths("/Shared/a", timeout=1):
        pass


def test_an_interrupted_release_can_be_finished(
    manager: PathLockManager, locks: CustomerLocks, customer_id: int, raw_engine: Engine
) -> None:
    lease = locks.lock_paths("/Shared/a")
    with _Interrupt(manager, after=False), pytest.raises(KeyboardInterrupt):
        lease.release()
    lease.release()  # again: this time it happens
    assert rows_of(raw_engine, customer_id) == (0, 0)
    assert not lease.lost


def test_the_rows_of_an_interrupted_release_make_their_owner_wait(
    manager: PathLockManager,
    locks: CustomerLocks,
    customer_id: int,
    raw_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Until the manager finishes an interrupted release (here: not yet, as
    when the database does not answer its settler), the rows left make their
    owner's next request wait, not fail as one that waits for itself."""
    lease = locks.lock_paths("/Shared/a")

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt  # before its DELETE went out

    monkeypatch.setattr(manager._in_doubt, "settle_soon", lambda: None)
    with monkeypatch.context() as patch:
        patch.setattr(manager._store.releases, "release", interrupted)
        with pytest.raises(KeyboardInterrupt):
            lease.release()
    assert rows_of(raw_engine, customer_id) == (1, 0)
    with pytest.raises(LockTimeout):  # not DeadlockDetected
        locks.lock_paths("/Shared/a", timeout=0.3)
    monkeypatch.undo()
    manager._in_doubt.settle()
    with locks.lock_paths("/Shared/a", timeout=5):
        pass
    assert rows_of(raw_engine, customer_id) == (0, 0)


def test_close_finishes_an_interrupted_release(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    manager = PathLockManager(database_url, heartbeat=False)
    lease = manager.for_customer(customer_id).lock_paths("/Shared/a")
    with _Interrupt(manager, after=False), pytest.raises(KeyboardInterrupt):
        lease.release()
    manager.close()
    assert rows_of(raw_engine, customer_id) == (0, 0)


@pytest.mark.parametrize("call", ["lock_paths", "try_lock_paths"])
def test_an_interrupt_after_the_grant_returned_leaves_the_owner_free_to_ask_again(
    manager: PathLockManager,
    locks: CustomerLocks,
    customer_id: int,
    raw_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    call: str,
) -> None:
    """A signal that arrives as the granted call counts itself out raises as
    the call returns: after the grant, before the Lease reaches the caller.
    Its lease stayed registered and renewed, and the same thread's next
    request failed as a deadlock with itself (2 of 250 rounds with random
    SIGALRMs); the caller never had the lease to release."""
    entered = [0]

    class Counted(set[object]):
        def discard(self, token: object) -> None:
            super().discard(token)
            if threading.current_thread() is threading.main_thread():
                entered[0] += 1
                if entered[0] == 1:  # counting the call out: the grant is done
                    os.kill(os.getpid(), signal.SIGINT)  # raises at the next bytecode

    monkeypatch.setattr(manager._calls, "_running", Counted())
    with pytest.raises(KeyboardInterrupt):
        getattr(locks, call)("/Shared/a")
    monkeypatch.undo()
    assert entered[0] >= 1
    with locks.lock_paths("/Shared/a", timeout=5) as lease:  # not DeadlockDetected
        lease.ensure_held()
    assert locks.release_locks() == 0
    assert rows_of(raw_engine, customer_id) == (0, 0)


class _InterruptAfterLimit:
    """Stands in for the context variable that holds a call's time limit and
    raises KeyboardInterrupt once, right after the first finite limit is set:
    where a Ctrl-C lands when it comes between two bytecodes there."""

    def __init__(self, variable: Any) -> None:
        self._variable = variable
        self.fired = False

    def get(self) -> Any:
        return self._variable.get()

    def set(self, value: Any) -> Any:
        token = self._variable.set(value)
        if not self.fired and value is not None and value.ends != float("inf"):
            self.fired = True
            raise KeyboardInterrupt
        return token

    def reset(self, token: Any) -> None:
        self._variable.reset(token)


@pytest.mark.parametrize("call", ["lock_paths", "release_locks"])
def test_an_interrupt_as_a_time_limit_is_set_leaves_no_limit_behind(
    database_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A limit left in force made every later call of the thread fail at once
    with "no answer within 0 s" once its time had passed (the stress run with
    random interrupts found it)."""
    settings = Settings(call_time=0.5)
    with PathLockManager(database_url, heartbeat=False, settings=settings) as manager:
        locks = manager.for_customer(customer_id)
        interrupt = _InterruptAfterLimit(deadlines._current)
        monkeypatch.setattr(deadlines, "_current", interrupt)
        with pytest.raises(KeyboardInterrupt):
            getattr(locks, call)(*(["/Shared/a"] if call == "lock_paths" else []))
        assert interrupt.fired
        assert deadlines.current() is None
        time.sleep(settings.call_time + settings.grace)  # past the limit that was set
        with locks.lock_paths("/Shared/a", timeout=5):
            pass
        assert locks.release_locks() == 0


def _in_thread(call: Callable[[], T]) -> Future[T]:
    """Run ``call`` on a thread of its own (another owner than the test's)."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(call)
    finally:
        pool.shutdown(wait=False)


def test_an_interrupt_as_a_waiter_leaves_does_not_stall_the_waiters_behind_it(
    locks: CustomerLocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C just as a granted request leaves the process's local queue
    (where the next waiter of this process learns it may go) must not leave
    that waiter sleeping behind a request that is gone until its timeout."""
    main = threading.current_thread()
    original = waiting.Watch._set_ticket
    fired = threading.Event()

    def set_ticket(watch: waiting.Watch, entry: Any, ticket: int | None) -> None:
        leaving = sys._getframe(1).f_code.co_name in ("__exit__", "close")
        mine = threading.current_thread() is main
        if ticket is None and leaving and mine and not fired.is_set():
            fired.set()
            raise KeyboardInterrupt
        original(watch, entry, ticket)

    monkeypatch.setattr(waiting.Watch, "_set_ticket", set_ticket)
    holder = _in_thread(lambda: locks.lock_paths("/Shared/a", owner="holder"))
    lease = holder.result(HANG)
    behind: dict[str, float] = {}

    def wait_behind() -> None:
        time.sleep(0.5)  # queued after the main thread's request
        started = time.monotonic()
        with locks.lock_paths("/Shared/a", timeout=20, owner="behind"):
            behind["waited"] = time.monotonic() - started

    second = _in_thread(wait_behind)
    threading.Timer(1.5, lease.release).start()
    with pytest.raises(KeyboardInterrupt):
        locks.lock_paths("/Shared/a", timeout=20)
    assert fired.is_set()
    second.result(HANG)
    # Woken when the interrupted request left, not at its 20 s deadline.
    assert behind["waited"] < 10, behind


def test_an_interrupt_as_a_waiter_falls_asleep_comes_out_as_the_interrupt(
    locks: CustomerLocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C that strikes just as a waiting request goes to sleep (here:
    right after a threading.Condition let go of its lock, where Python runs
    signal handlers) comes out as the KeyboardInterrupt, and the process's
    next request waits and is granted as usual. With a Condition around the
    sleep, the with block that had taken the lock released it a second time:
    "RuntimeError: release unlocked lock" instead of the interrupt (or, had
    another thread taken the lock meanwhile, that thread's lock released)."""
    main = threading.current_thread()
    fired = threading.Event()
    original = threading.Condition._release_save  # type: ignore[attr-defined]

    def release_save(condition: threading.Condition) -> Any:
        saved = original(condition)
        in_pathlock = "pathlock" in sys._getframe(2).f_code.co_filename  # Condition.wait's caller
        if in_pathlock and threading.current_thread() is main and not fired.is_set():
            fired.set()
            raise KeyboardInterrupt
        return saved

    def interrupt(_signum: int, _frame: object) -> None:
        if not fired.is_set():  # wherever it sleeps, if not in a Condition
            fired.set()
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Condition, "_release_save", release_save)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        lease = _in_thread(lambda: locks.lock_paths("/Shared/a", owner="holder")).result(HANG)
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            locks.lock_paths("/Shared/a", timeout=20)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    monkeypatch.undo()
    threading.Timer(0.5, lease.release).start()
    with locks.lock_paths("/Shared/a", timeout=20):
        pass


_RANDOM_INTERRUPTS = textwrap.dedent(
    """
    import random, signal, sys
    from pathlock import PathLockManager
    url, customer, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    manager = PathLockManager(url, ttl=60)
    locks = manager.for_customer(customer)
    interrupted = 0
    for n in range(rounds):
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, random.uniform(0, 0.01))
                with locks.lock_paths("/Shared/a", shared=["/Shared/b"], timeout=30):
                    locks.try_lock_paths("/Shared/c")
                locks.release_locks()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:  # wherever it struck, the timer is off now
            interrupted += 1
            # A lease the interrupt kept from its release is still this
            # owner's, as known to the manager: a handler releases it.
            locks.release_locks()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    # What was left in doubt is settled by now (or at close()).
    with locks.lock_paths("/Shared", timeout=30):
        pass
    manager.close()
    print(interrupted)
    """
)


def _interrupted_often(script: str, database_url: str, customer_id: int, rounds: int) -> None:
    """Run ``script`` (one of the random-interrupt scripts) in a process of
    its own: it must end well, interrupted often."""
    done = subprocess.run(
        [sys.executable, "-c", script, database_url, str(customer_id), str(rounds)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10, "the timer should have struck often"


def test_interrupts_at_random_moments_leave_no_rows(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    _interrupted_often(_RANDOM_INTERRUPTS, database_url, customer_id, 150)
    assert rows_of(raw_engine, customer_id) == (0, 0)


_INTERRUPTED_ROUNDS = textwrap.dedent(
    """
    import random, signal, sys
    from pathlock import PathLockManager
    url, customer, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    manager = PathLockManager(url, ttl=60)
    locks = manager.for_customer(customer)
    interrupted = 0
    for n in range(rounds):
        lease = None
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, random.uniform(0.0001, 0.004))
                # Whatever an interrupt left of the last round, this owner
                # waits for it (DeadlockDetected ends the script).
                lease = locks.lock_paths("/x", timeout=5)
                lease.release()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            interrupted += 1
            if lease is not None:
                lease.release()  # an interrupted release is finished by calling it again
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    manager.close()
    print(interrupted)
    """
)


def test_an_owner_interrupted_at_random_moments_never_deadlocks_with_itself(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    _interrupted_often(_INTERRUPTED_ROUNDS, database_url, customer_id, 120)
    assert rows_of(raw_engine, customer_id) == (0, 0)


_CTRL_C_TWICE_ON_A_LOOP = textwrap.dedent(
    """
    import asyncio, os, random, signal, sys, threading, time
    from pathlock import AsyncPathLockManager
    url, customer = sys.argv[1], int(sys.argv[2])

    async def main():
        manager = AsyncPathLockManager(url, ttl=2)
        locks = manager.for_customer(customer)

        async def requests(n):
            while True:
                async with locks.lock_paths(f"/Shared/a{n % 3}", shared=["/Shared/b"]):
                    await locks.try_lock_paths(f"/Shared/c{n}")

        await locks.list_locks()  # open

        def press():
            # Ctrl-C twice, as an impatient user: the first cancels the
            # main task, the second raises KeyboardInterrupt wherever the
            # loop's thread is (asyncio.run's handling of SIGINT).
            time.sleep(random.uniform(0.05, 0.3))
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(random.uniform(0, 0.003))
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=press, daemon=True).start()
        await asyncio.gather(*(requests(n) for n in range(8)))

    try:
        try:
            asyncio.run(main())
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one after the run
    except (KeyboardInterrupt, asyncio.CancelledError, RuntimeError):
        pass  # how asyncio.run ends, depending on where the second one struck
    print("ended")
    """
)


def test_ctrl_c_twice_during_asyncio_work_on_sqlite_ends_the_program(
    sqlite_url: str, customer_id: int
) -> None:
    """Attempts on SQLite run on the loop's thread and take connections from a
    pool that worker threads share; a second Ctrl-C raises wherever that
    thread is. Whatever it struck, the program ends (a pool lock it left held
    would hang the worker threads, which the interpreter waits for at exit),
    and its leases lapse with their ttl."""
    for _ in range(10):
        done = subprocess.run(
            [sys.executable, "-c", _CTRL_C_TWICE_ON_A_LOOP, sqlite_url, str(customer_id)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stdout.strip() == "ended", done.stderr
    manager = PathLockManager(sqlite_url, heartbeat=False)
    try:
        with manager.for_customer(customer_id).lock_paths("/Shared", timeout=10):
            pass
    finally:
        manager.close()


# -- the interpreter's exit --------------------------------------------------------


def test_a_script_that_ends_without_close_releases_its_locks(
    database_url: str, customer_id: int, raw_engine: Engine
) -> None:
    script = textwrap.dedent(
        """
        import sys
        from pathlock import PathLockManager
        manager = PathLockManager(sys.argv[1], ttl=300)
        manager.for_customer(int(sys.argv[2])).lock_paths("/Shared/a")
        """
    )
    subprocess.run(
        [sys.executable, "-c", script, database_url, str(customer_id)], check=True, timeout=60
    )
    assert rows_of(raw_engine, customer_id) == (0, 0)


def test_an_interrupt_as_a_call_is_counted_leaves_the_manager_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Condition.__enter__ is Python code: a KeyboardInterrupt right after it
    # took the lock left the lock of the manager's call counter held, and
    # every later call of every thread hung (found by the hostile stress run).
    # The count takes no lock now; an interrupt right after a call is counted
    # must still count it out again.
    with PathLockManager(f"sqlite:///{tmp_path / 'locks.sqlite3'}", heartbeat=False) as manager:
        armed = [True]

        class Counted(set[object]):
            def add(self, token: object) -> None:
                super().add(token)
                main = threading.current_thread() is threading.main_thread()
                if armed[0] and main:
                    armed[0] = False
                    os.kill(os.getpid(), signal.SIGINT)  # raises at the next bytecode

        monkeypatch.setattr(manager._calls, "_running", Counted())
        with pytest.raises(KeyboardInterrupt):
            manager.list_locks()
        assert not armed[0]
        assert manager._calls._count == 0
        listed: list[object] = []
        other = threading.Thread(target=lambda: listed.append(manager.list_locks()), daemon=True)
        other.start()
        other.join(10)
        assert not other.is_alive(), "the call counter was left counting"
        assert listed == [[]]
        monkeypatch.undo()
        assert manager._calls._count == 0

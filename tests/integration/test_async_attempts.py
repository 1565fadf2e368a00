"""An attempt through an asyncio driver runs in its request's task, under a
timer (``pathlock._aio.LoopRunner``): the timer's cancellation is a timeout
of the attempt, any other one stays a cancellation."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from sqlalchemy import Connection
from sqlalchemy.util import await_only

from pathlock import AsyncPathLockManager
from pathlock import _aio as aio
from pathlock._aio import spawn
from pathlock._transactions import AttemptFailed

pytestmark = pytest.mark.timeout(60)


def _attempt_that_never_ends(manager: AsyncPathLockManager, seconds: float) -> asyncio.Task[Any]:
    """A task making one attempt whose statement never gets an answer."""
    core = manager._core
    runner, node = core._loop_runner, core._store.router.nodes[0]
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def operation(_connection: Connection, _number: int) -> None:
        await_only(never)

    ends = time.monotonic() + seconds
    return asyncio.create_task(spawn(runner.attempt, node, operation, 1, ends, read_only=True))


def test_the_timer_ends_an_attempt_as_a_timeout(mariadb_url: str) -> None:
    async def main() -> None:
        async with AsyncPathLockManager(mariadb_url, node_id="test-attempts") as manager:
            await manager.list_locks(customer_id=1)  # open
            task = _attempt_that_never_ends(manager, 0.2)
            with pytest.raises(AttemptFailed) as failed:
                await task
            assert "timed out" in str(failed.value.error)
            assert task.cancelling() == 0  # the timer's cancellation is taken back

    asyncio.run(main())


def test_a_cancellation_that_comes_with_the_timeout_stays_a_cancellation(
    mariadb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another cancellation of the task in the same pass of the loop as the
    timer's (its caller's, or the loop shutting down) must not be taken for
    the timeout and swallowed."""
    expire = aio._Attempting.expire

    def expire_and_cancelled(self: aio._Attempting) -> None:
        expire(self)
        self.task.cancel()  # from outside, before the task runs again

    monkeypatch.setattr(aio._Attempting, "expire", expire_and_cancelled)

    async def main() -> None:
        async with AsyncPathLockManager(mariadb_url, node_id="test-attempts") as manager:
            await manager.list_locks(customer_id=1)
            task = _attempt_that_never_ends(manager, 0.2)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled()

    asyncio.run(main())

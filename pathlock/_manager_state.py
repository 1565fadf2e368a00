"""What the parts of a :class:`~pathlock.manager.PathLockManager` share: its
options, its database, its events, and the state of the process it runs in
(leases held, leases in doubt, background threads), declared once for the
modules that each carry one job of the manager (:mod:`pathlock._holding`,
:mod:`pathlock._renewal`, :mod:`pathlock._requesting`,
:mod:`pathlock._detached`, :mod:`pathlock._opening`,
:mod:`pathlock._operating`), and the checks every call makes."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy import Engine

from pathlock import _owners as owners
from pathlock.errors import ManagerClosed

if TYPE_CHECKING:
    from pathlock import events
    from pathlock._aio import LoopRunner, TaskHeartbeat
    from pathlock._calls import Calls
    from pathlock._heartbeat import Heartbeat, Stragglers
    from pathlock._reaper import ReaperJobs
    from pathlock._settling import Expiring, InDoubt
    from pathlock._store import Store
    from pathlock._upkeep import Upkeep
    from pathlock.lease import Keeper, Lease, LostCallback
    from pathlock.settings import Settings
    from pathlock.types import Owner
    from pathlock.waiting import LocalWakeups, WaitPolicy


class ManagerState:
    """The attributes a manager's parts share (set by the manager)."""

    # The asyncio API's manager (pathlock.aio) runs this one's code in
    # greenlets on its loop: engines of asyncio drivers, waits handed to the
    # loop, no database call before it opens (see pathlock._aio).
    _asynchronous: ClassVar[bool] = False

    # The options, read-only after construction.
    _node_id: str
    _ttl: float
    _case_insensitive: bool
    _backoff: WaitPolicy
    _settings: Settings
    _renews: bool  # the heartbeat renews held leases
    _on_lost: tuple[LostCallback, ...]
    _cleanup_on_start: bool

    # The database: the nodes' engines, the operations, and the heartbeat's
    # own pool's.
    engines: tuple[Engine, ...]
    engine: Engine
    _owned: list[Engine]  # disposed by close()
    _store: Store
    _upkeep: Upkeep
    _renewals: Store
    _loop_runner: LoopRunner  # the asyncio API's

    _events: events.Emitter
    _wakeups: LocalWakeups
    _keeper: Keeper
    _closed: bool
    _close_done: bool

    # One process's (made anew in a forked child).
    _pid: int
    _identity: str
    _leases: dict[str, Lease]
    _leases_lock: threading.Lock
    _abandoned: Expiring[str]
    _in_doubt: InDoubt
    _calls: Calls
    _reaper: ReaperJobs
    _heartbeat: Heartbeat | TaskHeartbeat
    _stragglers: Stragglers

    def _after_fork(self) -> None:
        raise NotImplementedError  # the manager's

    def _check_open(self, action: str) -> None:
        if self._closed:
            raise ManagerClosed(action)
        if os.getpid() != self._pid:
            # Forked without os.fork()'s hooks (from C, say): catch up now.
            self._after_fork()

    def _call(self, action: str | None) -> contextlib.AbstractContextManager[None]:
        """One call that may use the database, counted while its block runs;
        ``action`` names it for :class:`ManagerClosed` (``None``: allowed
        after close, such as the release of a lease that close() releases
        anyway)."""
        if action is not None:
            self._check_open(action)
        return self._calls.running()

    def _owner(self, name: object) -> Owner:
        return owners.current(self._identity, self._node_id, name)

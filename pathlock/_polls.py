"""The checks of a process's waiting requests on one customer, read together.

A waiting request checks every few milliseconds whether it can go on (the
customer's version, the paths a release handed to it, whether the requests
ahead of it and the leases in its way are still there: see
:class:`pathlock._core.flow.ReadVersion`). With a hundred of a customer's requests
waiting in each process (the threads of file servers under a burst of uploads
into one folder), each check was a read of its own: with 2 processes the
server and the clients spent more than twice the CPU per grant that a
handful of waiters costs, and the machine's CPU was what bounded the grants.

Here a process reads one customer for all of its checks:

- at most one read of a customer is under way at a time; checks that come
  due meanwhile wait for it to end and go together in the next one, one
  statement for all of them (a group commit's pattern);
- a read for another request than the last one's waits until
  ``Settings.shared_check`` after the last read began, and takes every check
  that comes due until then: while several requests of a process wait, the
  process reads the customer at most that often, whatever their number. A
  request that waits alone in its process (the usual case) is never held
  back: its checks go out when they are due.

A check waits at most as long as its own read would have been allowed to
take, and for a read that stalled at most :data:`STALLED`; then, or when the
read it waited for failed, it reads alone. Threads wait for one another's
reads with :data:`THREADS`; the tasks of the asyncio API, which must not
stop their loop, share the reads of their loop with waits of their own
(:class:`Waits`, given by ``pathlock._aio.LoopRunner``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pathlock._core.records import Watched
from pathlock._interrupts import held_back


class Event(Protocol):
    """What a check waits on for another's read (``threading.Event``'s
    methods)."""

    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True, slots=True)
class Waits:
    """How the checks of one :class:`SharedPolls` wait: for another's read
    (on an ``event()``), and for the checks that come due before a read
    begins (``sleep``)."""

    event: Callable[[], Event]
    sleep: Callable[[float], None]


THREADS = Waits(threading.Event, time.sleep)
"""The waits of threads."""


@dataclass(eq=False, slots=True)
class Ask:
    """One waiting request's check: ``lease_id`` where it asks for the paths
    a release handed to it, the tickets of the requests ``ahead`` of it, the
    leases ``held`` in its way (see :class:`pathlock._core.flow.ReadVersion`);
    ``asker``: the request's lease id."""

    lease_id: str | None
    ahead: tuple[int, ...]
    held: tuple[str, ...]
    asker: str = ""
    # The reply, once a read answered (None with ``settled``: read alone).
    answer: Watched | None = None
    settled: bool = False
    # The read handed to this check, to make for the checks it lists.
    lead: _Reading | None = None
    # Set when the check is answered or handed a read: made when it joins
    # another's read (a check that reads at once never waits).
    event: Event | None = None


Read = Callable[[int, Sequence[Ask], float | None], list[Watched]]
"""Reads the checks of one customer in one transaction: one answer per check,
in their order."""

STALLED = 1.0
"""Seconds after which a read still under way is not waited for: a check
that comes due then reads without it (a read takes milliseconds; a database
that takes longer answers each check as before)."""


@dataclass(eq=False, slots=True)
class _Reading:
    """One read of a customer: since when it is under way, the checks it is
    made for (``batch``: open to more until ``gather_until``, if set), and
    those that wait for the next one."""

    since: float
    batch: list[Ask]
    asks: list[Ask] = field(default_factory=list)
    gather_until: float = 0.0


class SharedPolls:
    """The checks of one process's waiting requests, read together per
    customer (see the module's docstring). ``gather``: the shortest time
    between two reads of a customer for different requests; ``call_time``:
    how long a check without a deadline may wait; ``waits``: how its checks
    wait (those of threads, or of the tasks of one event loop)."""

    def __init__(
        self, read: Read, *, gather: float, call_time: float, waits: Waits = THREADS
    ) -> None:
        self._read = read
        self._gather = gather
        self._call_time = call_time
        self._waits = waits
        self._lock = threading.Lock()
        # Customer id -> the read under way.
        self._reading: dict[int, _Reading] = {}
        # Customer id -> when its last read began, and the request it was
        # made for ("": several).
        self._last: dict[int, tuple[float, str]] = {}

    def check(self, customer_id: int, ask: Ask, deadline: float | None) -> Watched:
        """The answer to ``ask``, from a read made with the other checks of
        the customer that are due. By the monotonic time ``deadline``
        (default: the call's time from now), as a read of its own would be;
        the errors of a read are its reader's, and the checks it was made for
        read again, alone."""
        now = time.monotonic()
        ends = now + self._call_time if deadline is None else deadline
        mine: _Reading | None
        with held_back(), self._lock:
            reading = self._reading.get(customer_id)
            if reading is None or now - reading.since >= STALLED:
                # Nothing under way, or a read that stalled: the checks it
                # has stop waiting for it by themselves.
                mine = self._reading[customer_id] = _Reading(now, [ask])
                last = self._last.get(customer_id)
                if last is not None and now < last[0] + self._gather and last[1] != ask.asker:
                    mine.gather_until = min(last[0] + self._gather, ends)
                else:
                    self._begins(customer_id, mine)
            else:
                ask.event = self._waits.event()
                (reading.batch if reading.gather_until else reading.asks).append(ask)
                mine = None
        if mine is None:
            assert reading is not None  # noqa: S101 - it joined this one
            mine = self._follow(customer_id, ask, min(ends, reading.since + STALLED))
            if mine is None:
                if ask.answer is not None:
                    return ask.answer
                return self._read(customer_id, [ask], deadline)[0]
        return self._lead(customer_id, ask, mine, deadline)

    def _follow(self, customer_id: int, ask: Ask, ends: float) -> _Reading | None:
        """Wait until the monotonic time ``ends`` for a read to answer ``ask``,
        or to be handed the next read (returned). ``None``: answered, or to
        read alone (no answer came in time, or the read failed)."""
        lead: _Reading | None = None
        event = ask.event
        assert event is not None  # noqa: S101 - made as it joined
        try:
            event.wait(max(0.0, ends - time.monotonic()))
            with held_back(), self._lock:
                lead, ask.lead = ask.lead, None
                if lead is None and not ask.settled:
                    self._drop(customer_id, ask)  # no answer in time
        except BaseException:
            # An interrupt: out of the line; a read it was handed goes to
            # the next check.
            with held_back(), self._lock:
                lead, ask.lead = lead or ask.lead, None
                if lead is None:
                    self._drop(customer_id, ask)
                else:
                    lead.batch.remove(ask)
                    if lead.batch:
                        self._give(lead)
                    else:
                        self._hand_on(customer_id, lead)
            raise
        return lead

    def _lead(self, customer_id: int, ask: Ask, mine: _Reading, deadline: float | None) -> Watched:
        """Make the read ``mine`` (for ``ask`` and the checks with it), answer
        the others, and hand the next read to the checks that came meanwhile."""
        answers: list[Watched] | None = None
        try:
            if mine.gather_until:
                self._waits.sleep(max(0.0, mine.gather_until - time.monotonic()))
                with held_back(), self._lock:
                    mine.gather_until = 0.0  # the batch is complete
                    self._begins(customer_id, mine)
            answers = self._read(customer_id, mine.batch, deadline)
        finally:
            with held_back(), self._lock:
                for index, other in enumerate(mine.batch):
                    if other is not ask:
                        other.answer = None if answers is None else answers[index]
                        other.settled = True
                        other.event.set()  # type: ignore[union-attr] # joined: has one
                self._hand_on(customer_id, mine)
        return answers[mine.batch.index(ask)]

    def _hand_on(self, customer_id: int, done: _Reading) -> None:
        """After the read ``done``: the next one, for the checks that waited
        for it, if any (made by the first of them). Under the lock."""
        current = self._reading.get(customer_id) is done
        if current:
            del self._reading[customer_id]
            if len(self._last) > _CUSTOMERS_KEPT:
                self._last.clear()  # customers nobody waits for any more
        if done.asks:
            following = _Reading(time.monotonic(), done.asks)
            if current:
                self._reading[customer_id] = following
            self._begins(customer_id, following)
            self._give(following)

    def _begins(self, customer_id: int, reading: _Reading) -> None:
        """``reading``'s checks are all known: it is the customer's last read
        from now on (see :meth:`check`). Under the lock."""
        asker = reading.batch[0].asker if len(reading.batch) == 1 else ""
        self._last[customer_id] = (time.monotonic(), asker)

    @staticmethod
    def _give(reading: _Reading) -> None:
        """Hand ``reading`` to the first check of its batch. Under the lock."""
        first = reading.batch[0]
        first.lead = reading
        first.event.set()  # type: ignore[union-attr] # joined: has one

    def _drop(self, customer_id: int, ask: Ask) -> None:
        """Take ``ask`` out of the checks waiting for a read that has not
        begun. Under the lock."""
        reading = self._reading.get(customer_id)
        if reading is None:
            return
        if ask in reading.asks:
            reading.asks.remove(ask)
        elif reading.gather_until and ask in reading.batch[1:]:
            reading.batch.remove(ask)


_CUSTOMERS_KEPT = 10_000
"""How many customers' last reads are kept before all are forgotten."""

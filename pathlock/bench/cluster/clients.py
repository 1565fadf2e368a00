"""What runs in a client process: the commands it is sent, the loops that lock
and time, and the count of pathlock's warnings.

The coordinator (:class:`~.experiments.Team`) spawns the processes with
:func:`worker_main` as their target, so this module is what they import (by
its name, ``pathlock.bench.cluster.clients``: multiprocessing gives a spawned
child the parent's ``sys.path``). Keep it free of work at import time.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, text

from pathlock import LockTimeout, PathLockError, PathLockManager
from pathlock.errors import BackendError

from .settings import (
    CUSTOMERS,
    HOLD,
    HOT_CUSTOMER,
    HOT_PATH,
    MULTI_STATEMENTS,
    SETUP_TIMEOUT,
    SOLO_CUSTOMER,
    SOLO_WARMUP,
    TIMEOUT,
    TREE,
    TTL,
    Command,
    Result,
)

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    from pathlock.customer import CustomerLocks

# One variant of experiment 3: its name, its manager, the engine we made for it.
SoloVariant = tuple[str, PathLockManager, Engine | None]


def nodes_for(urls: Sequence[str], client: int, *, same_order: bool = False) -> list[str]:
    """The node list of client ``client``: starting from its nearest node
    (``client % 3``), or in the order given for every client."""
    first = 0 if same_order else client % len(urls)
    return [*urls[first:], *urls[:first]]


_SO_FAR = re.compile(r"\((\d+) so far")
_DONE_AFTER = re.compile(r"done after (\d+) lost races")


class WarningCounter(logging.Handler):
    """Counts pathlock's WARNING records of one worker.

    ``race_lines`` counts the "lost a race" lines of the logger ``pathlock.store`` (one per
    lost certification race or deadlock, except that pathlock logs only the
    first five of one operation and then the 8th, 16th, ...). ``races``
    recovers the count of lost races from the numbers in those lines (and in
    "done after N lost races"): exact for operations that succeeded, a lower
    bound for one that gave up after more than five.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reset()

    def reset(self) -> None:
        self.race_lines = 0
        self.races = 0
        self.other: Counter[str] = Counter()
        self.samples: list[str] = []
        self._current: dict[int, int] = defaultdict(int)  # thread -> races of its operation

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        thread = record.thread or 0
        if record.name == "pathlock.store" and "lost a race" in message:
            self.race_lines += 1
            found = _SO_FAR.search(message)
            count = int(found.group(1)) if found else self._current[thread] + 1
            if count <= self._current[thread]:  # a new operation began
                self.races += self._current[thread]
            self._current[thread] = count
            return
        done = _DONE_AFTER.search(message)
        if done:
            self.races += max(int(done.group(1)), self._current[thread])
            self._current[thread] = 0
            return
        self.other[f"{record.name}: {record.msg}"] += 1
        if len(self.samples) < 3:  # noqa: PLR2004 - a few examples for the report
            self.samples.append(message[:300])

    def total_races(self) -> int:
        return self.races + sum(self._current.values())


def worker_main(
    index: int,
    urls: list[str],
    commands: Queue[Command | None],
    results: Queue[Result],
    barrier: Barrier,
) -> None:
    """One client process: run the commands it is sent until ``None``."""
    counter = WarningCounter()
    logger = logging.getLogger("pathlock")
    logger.addHandler(counter)
    logger.propagate = False  # counted, not printed
    while True:
        command = commands.get()
        if command is None:
            return
        try:
            result = run_command(index, urls, command, barrier, counter)
        except Exception:  # noqa: BLE001 - the traceback goes to the coordinator
            barrier.abort()
            results.put({"client": index, "error": traceback.format_exc()})
            return
        results.put(result)


def run_command(
    index: int, urls: list[str], command: Command, barrier: Barrier, counter: WarningCounter
) -> Result:
    kind = command["kind"]
    if kind == "idle":
        barrier.wait(SETUP_TIMEOUT)
        return {"client": index}
    if kind == "solo":
        barrier.wait(SETUP_TIMEOUT)
        return {"client": index, "solo": solo(command)}
    return contended(index, urls, command, barrier, counter)


def contended(
    index: int, urls: list[str], command: Command, barrier: Barrier, counter: WarningCounter
) -> Result:
    """One round of experiment 1 (``kind`` "hot") or 2 ("many") in this client."""
    kind = command["kind"]
    manager = PathLockManager(
        nodes_for(urls, index, same_order=command["same_order"]),
        node_id=f"bench-{index}",
        affinity=command["affinity"],
        ttl=TTL,
    )
    try:
        rng = random.Random(command["seed"] * 100 + index)  # noqa: S311 - not for security
        customers = [HOT_CUSTOMER] if kind == "hot" else rng.sample(CUSTOMERS, 3)
        for customer in customers:  # open connections to the nodes this client will use
            lease = manager.for_customer(customer).try_lock_paths(f"/warmup/{index}")
            if lease is not None:
                lease.release()
        barrier.wait(SETUP_TIMEOUT)
        counter.reset()
        started = time.monotonic()
        deadline = started + command["seconds"]
        figures = Figures()
        if kind == "hot":
            hot_loop(manager.for_customer(HOT_CUSTOMER), deadline, figures)
        else:
            many_loop(manager, rng, deadline, figures)
        finished = time.monotonic()
    finally:
        manager.close()
    return {
        "client": index,
        "started": started,
        "deadline": deadline,
        "finished": finished,
        "granted_in_window": figures.granted_in_window,
        "latencies": figures.latencies,
        "holds": figures.holds,
        "errors": dict(figures.errors),
        "race_lines": counter.race_lines,
        "races": counter.total_races(),
        "warnings": dict(counter.other),
        "samples": counter.samples,
    }


class Figures:
    """What one client measured in one round."""

    def __init__(self) -> None:
        self.granted_in_window = 0
        self.latencies: list[float] = []  # seconds from the request to the grant
        self.holds: list[tuple[float, float, int]] = []  # (granted, released, token)
        self.errors: Counter[str] = Counter()

    def take(self, locks: CustomerLocks, paths: Sequence[str], deadline: float) -> None:
        """One ``with locks.lock_paths(*paths, timeout=30): sleep 1 ms``."""
        asked = time.monotonic()
        granted: float | None = None
        try:
            with locks.lock_paths(*paths, timeout=TIMEOUT) as lease:
                granted = time.monotonic()
                token = lease.fencing_token
                time.sleep(HOLD)
                released = time.monotonic()
        except PathLockError as error:
            kind = (
                "LockTimeout"
                if isinstance(error, LockTimeout)
                else "BackendError"
                if isinstance(error, BackendError)
                else type(error).__name__
            )
            self.errors[kind if granted is None else f"{kind} (release)"] += 1
            if granted is None:
                return
            released = time.monotonic()
        self.latencies.append(granted - asked)
        self.holds.append((granted, released, token))
        if granted <= deadline:
            self.granted_in_window += 1


def hot_loop(locks: CustomerLocks, deadline: float, figures: Figures) -> None:
    while time.monotonic() < deadline:
        figures.take(locks, (HOT_PATH,), deadline)


def many_loop(
    manager: PathLockManager, rng: random.Random, deadline: float, figures: Figures
) -> None:
    customers = {customer: manager.for_customer(customer) for customer in CUSTOMERS}
    while time.monotonic() < deadline:
        locks = customers[rng.choice(CUSTOMERS)]
        figures.take(locks, rng.sample(TREE, rng.choice((1, 2))), deadline)


def causal_off_engine(url: str) -> Engine:
    """An engine like pathlock's own (READ COMMITTED, batched statements, no
    rollback on return to the pool) but with causal reads off. pathlock uses an
    engine passed in as it is, so its ``wsrep_sync_wait=3`` is not applied."""
    return create_engine(
        url,
        isolation_level="READ COMMITTED",
        pool_reset_on_return=None,
        pool_recycle=3600,
        connect_args={
            "init_command": "SET SESSION wsrep_sync_wait=0",
            "client_flag": MULTI_STATEMENTS,
        },
    )


def solo(command: Command) -> dict[str, Any]:
    """Experiment 3, in one client: acquire + release of a fresh path, the
    variants alternating in rounds (the order rotating each round)."""
    variants: list[SoloVariant] = []
    try:
        for name, url, causal_off in command["variants"]:
            engine = causal_off_engine(url) if causal_off else None
            database = engine if engine is not None else url
            manager = PathLockManager(database, node_id="bench-solo", ttl=TTL)
            variants.append((name, manager, engine))
        fresh = itertools.count(1)  # numbers the paths, warm-up and timed alike
        sync_wait = {name: warm_up(manager, fresh) for name, manager, _ in variants}
        samples = solo_rounds(variants, command["rounds"], command["per_round"], fresh)
    finally:
        for _, manager, engine in variants:
            manager.close()
            if engine is not None:
                engine.dispose()
    return {"samples": samples, "sync_wait": sync_wait}


def warm_up(manager: PathLockManager, fresh: Iterator[int]) -> str:
    """Read the session's ``wsrep_sync_wait``, then acquire and release
    ``SOLO_WARMUP`` fresh paths untimed; return the setting."""
    with manager.engine.connect() as connection:
        row = connection.execute(text("SHOW SESSION VARIABLES LIKE 'wsrep_sync_wait'")).first()
        sync_wait = str(row[1]) if row is not None else "n/a"
    locks = manager.for_customer(SOLO_CUSTOMER)
    for _ in range(SOLO_WARMUP):
        with locks.lock_paths(f"/solo/warmup/{next(fresh)}", timeout=TIMEOUT):
            pass
    return sync_wait


def solo_rounds(
    variants: list[SoloVariant], rounds: int, per_round: int, fresh: Iterator[int]
) -> dict[str, list[float]]:
    """``per_round`` timed acquire + release per variant and round, in seconds."""
    samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for number in range(rounds):
        shift = number % len(variants)
        for name, manager, _ in variants[shift:] + variants[:shift]:
            locks = manager.for_customer(SOLO_CUSTOMER)
            for _ in range(per_round):
                path = f"/solo/{next(fresh)}"
                began = time.monotonic()
                with locks.lock_paths(path, timeout=TIMEOUT):
                    pass
                samples[name].append(time.monotonic() - began)
    return samples

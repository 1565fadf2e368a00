"""A worker of ``test_faults.py``: random requests on a small tree of one
customer while the test injects faults (SIGKILL of workers, killed database
connections, a database restart; in ``test_cluster_faults.py``, cluster nodes
that crash, lose their majority or are cut off, the worker listing every node).

Not a test module: :func:`run` is the target of a ``multiprocessing`` process
started with the "spawn" method, so the child builds its own manager (nothing
crosses a fork) and imports only pathlock, not pytest.

Everything the worker learns is appended to a JSON-lines file the moment it
happens, one line per event, written straight through to the operating system:
a worker killed with SIGKILL leaves every event up to its death (its last line
may be cut short). The grant of a lease is ``t_start`` (``time.monotonic()``
right after the grant returned, one clock for every process on Linux), its
end ``t_end`` (right before the release is called), and a lease the manager
declares lost gets a ``lost`` event at the moment the worker was told
(``on_lost``). Start and stop are signalled with files, not multiprocessing
primitives: a process killed while it holds a multiprocessing lock would
wedge every other process that uses the lock.

Every call into pathlock ends in one of: a grant, ``None`` from a try-lock,
a :class:`~pathlock.PathLockError` (recorded by class), or anything else,
recorded as ``unexpected`` with its traceback for the test to fail on.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathlock import CustomerLocks, Lease, PathLockError, PathLockManager

# A small tree, so requests collide often, with the traps of test_stress.py:
# "/ab" and "/a/b/c%" share a string prefix with "/a" and "/a/b/c" without
# being inside them; "_" and "%" are LIKE wildcards that must match only
# themselves. No "/": a queued request for the root would hold back every
# later request (first come, first served), and the faults below keep some
# requests queued all the time; the test's final probe locks "/".
TREE = (
    "/a",
    "/a/b",
    "/a/b/c",
    "/a/b/c%",
    "/a/e",
    "/a_b",
    "/ab",
    "/x",
    "/x/y",
    "/x/y/z",
)
# Long holds (renewed by the heartbeat, held when faults strike) happen on a
# thread of their own, on paths apart from TREE, so they do not slow the
# short requests down; the lanes' parent is asked for now and then.
LANES = ("/long/0", "/long/1", "/long/2", "/long/3")
LANES_PARENT = "/long"
REASON_PREFIX = "fault-test "

STOP_FILE = "stop"
# Fields the test splits on "|": time, process, thread, logger, level, message.
LOG_FORMAT = "%(asctime)s|%(process)d|%(threadName)s|%(name)s|%(levelname)s|%(message)s"


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """What one spawned worker needs (picklable: no engine, no connection)."""

    database_url: str | list[str]  # one server, or the nodes of a cluster in the order to try
    customer_id: int
    index: int  # unique per process over the whole run (replacements get new ones)
    node_id: str
    out_dir: Path
    seed: int
    ttl: float
    max_seconds: float  # a bound on the run if the test never says stop
    long_hold: tuple[float, float] = (1.1, 5.0)  # seconds of the lane's holds
    affinity: bool = False  # with several nodes: each customer's home node first

    @property
    def events_path(self) -> Path:
        return self.out_dir / f"worker-{self.index}.jsonl"

    @property
    def log_path(self) -> Path:
        return self.out_dir / f"worker-{self.index}.log"

    @property
    def ready_path(self) -> Path:
        return self.out_dir / f"worker-{self.index}.ready"

    @property
    def error_path(self) -> Path:
        return self.out_dir / f"worker-{self.index}.error"

    @property
    def stop_path(self) -> Path:
        return self.out_dir / STOP_FILE


class Events:
    """An append-only JSON-lines file, thread-safe (the heartbeat thread
    reports lost leases), each line handed to the OS as it is written."""

    def __init__(self, path: Path, worker: int) -> None:
        self._file = path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self._worker = worker

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "worker": self._worker, **fields})
        with self._lock:
            if not self._file.closed:  # a renewal left behind by close() may report late
                self._file.write(line + "\n")

    def lost(self, lease: Lease) -> None:
        """The manager's ``on_lost`` callback."""
        t_lost = time.monotonic()
        self.write("lost", lease_id=lease.lease_id, t_lost=t_lost)

    def close(self) -> None:
        with self._lock:
            self._file.close()


# -- requests ----------------------------------------------------------------------


def effective(paths: Iterable[tuple[str, str]]) -> list[list[str]]:
    """What the lease should hold: each path once, exclusive if asked both ways."""
    modes: dict[str, str] = {}
    for path, mode in paths:
        if modes.get(path) != "exclusive":
            modes[path] = mode
    return [[path, modes[path]] for path in sorted(modes)]


def encode_reason(expected: list[list[str]]) -> str:
    """The expected rows, in the lease's reason: a test reading path_locks with
    plain SQL can check any lease's rows, even one whose holder died."""
    return REASON_PREFIX + json.dumps(expected, separators=(",", ":"))


def decode_reason(reason: str) -> list[list[str]] | None:
    if not reason.startswith(REASON_PREFIX):
        return None
    decoded: list[list[str]] = json.loads(reason[len(REASON_PREFIX) :])
    return decoded


def _random_request(rng: random.Random) -> tuple[list[str], list[str]]:
    exclusive: list[str] = []
    shared: list[str] = []
    for path in rng.choices(TREE, k=rng.randint(1, 3)):  # repeats and overlaps allowed
        (exclusive if rng.random() < 0.5 else shared).append(path)
    return exclusive, shared


def _short_hold(rng: random.Random) -> float:
    if rng.random() < 0.85:
        return rng.uniform(0.0, 0.003)
    return rng.uniform(0.005, 0.03)


def _lane_request(rng: random.Random) -> tuple[list[str], list[str]]:
    path = LANES_PARENT if rng.random() < 0.05 else rng.choice(LANES)
    return ([path], []) if rng.random() < 0.7 else ([], [path])


def _hold(lease: Lease, seconds: float, running: Callable[[], bool]) -> float:
    """Use the lock for ``seconds``, stopping early once the lease is lost (or
    the test says stop); return the moment the holder stopped relying on it."""
    until = time.monotonic() + seconds
    while not lease.lost and running():
        left = until - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(left, 0.05))
    return time.monotonic()


def _failed(events: Events, where: str, error: BaseException, **fields: Any) -> None:
    if isinstance(error, PathLockError):
        events.write("error", where=where, cls=type(error).__name__, msg=str(error)[:400], **fields)
    else:
        events.write(
            "unexpected", where=where, cls=type(error).__name__, tb=traceback.format_exc(), **fields
        )


def _acquire(
    locks: CustomerLocks,
    rng: random.Random,
    events: Events,
    request: tuple[list[str], list[str]],
    max_wait: float,
) -> Lease | None:
    exclusive, shared = request
    requested = [[path, "exclusive"] for path in exclusive] + [[path, "shared"] for path in shared]
    expected = effective((path, mode) for path, mode in requested)
    reason = encode_reason(expected)
    blocking = rng.random() < 0.4
    # When the call was made and when it returned (t, or t_start for a grant):
    # how long a call took, even while the database is in trouble.
    t_asked = time.monotonic()
    try:
        if blocking:
            lease = locks.lock_paths(
                *exclusive, shared=shared, timeout=rng.uniform(0.1, max_wait), reason=reason
            )
        else:
            found = locks.try_lock_paths(*exclusive, shared=shared, reason=reason)
            if found is None:
                events.write("try_none", t_asked=t_asked, t=time.monotonic())
                return None
            lease = found
    except Exception as error:  # noqa: BLE001 - every outcome is recorded for the test
        _failed(events, "acquire", error, t_asked=t_asked, t=time.monotonic())
        return None
    t_start = time.monotonic()
    events.write(
        "grant",
        t_start=t_start,
        t_asked=t_asked,
        lease_id=lease.lease_id,
        token=lease.fencing_token,
        paths=requested,
        held=[list(pair) for pair in lease.paths],
        expected=expected,
        ttl=lease.ttl,
        blocking=blocking,
        lost_at_grant=lease.lost,
    )
    return lease


def _operation(
    locks: CustomerLocks,
    rng: random.Random,
    events: Events,
    running: Callable[[], bool],
    *,
    long_hold: tuple[float, float] | None = None,
) -> None:
    if long_hold is not None:
        lease = _acquire(locks, rng, events, _lane_request(rng), max_wait=2.0)
        seconds = rng.uniform(*long_hold)
    else:
        lease = _acquire(locks, rng, events, _random_request(rng), max_wait=1.5)
        seconds = _short_hold(rng)
    if lease is None:
        return
    try:
        if rng.random() < 0.3:
            with lease:
                t_end = _hold(lease, seconds, running)
                events.write("end", lease_id=lease.lease_id, t_end=t_end)
        else:
            t_end = _hold(lease, seconds, running)
            events.write("end", lease_id=lease.lease_id, t_end=t_end)
            lease.release()
    except Exception as error:  # noqa: BLE001 - every outcome is recorded for the test
        _failed(events, "release", error, t=time.monotonic())
    events.write(
        "released",
        lease_id=lease.lease_id,
        lost=lease.lost,
        released=lease.released,
        t=time.monotonic(),
    )


# -- the process -------------------------------------------------------------------


def _lane(
    locks: CustomerLocks, spec: FaultSpec, events: Events, running: Callable[[], bool]
) -> None:
    """The long holds (longer than ttl/3, so renewed; often longer than the
    ttl), on a thread of their own: another owner, the same manager."""
    rng = random.Random(spec.seed * 1000 + spec.index + 500)
    while running():
        _operation(locks, rng, events, running, long_hold=spec.long_hold)
        time.sleep(rng.uniform(0.0, 0.2))


def _thread_failed(events: Events) -> Any:
    def hook(arguments: threading.ExceptHookArgs) -> None:
        formatted = "".join(
            traceback.format_exception(
                arguments.exc_type, arguments.exc_value, arguments.exc_traceback
            )
        )
        events.write(
            "unexpected",
            where=f"thread {arguments.thread.name if arguments.thread else '?'}",
            cls=arguments.exc_type.__name__,
            tb=formatted,
        )

    return hook


def run(spec: FaultSpec) -> None:
    """Spawned: random operations until the stop file appears (or
    ``max_seconds`` pass), then close the manager (which releases anything
    still held)."""
    warnings.simplefilter("error")
    logging.basicConfig(
        filename=spec.log_path,
        level=logging.WARNING,
        format=LOG_FORMAT,
    )
    events = Events(spec.events_path, spec.index)
    threading.excepthook = _thread_failed(events)
    try:
        rng = random.Random(spec.seed * 1000 + spec.index)
        manager = PathLockManager(
            spec.database_url,
            node_id=spec.node_id,
            ttl=spec.ttl,
            on_lost=events.lost,
            affinity=spec.affinity,
        )
        locks = manager.for_customer(spec.customer_id)
        locks.list_locks()  # connect before saying ready
        spec.ready_path.touch()
        events.write("ready", t=time.monotonic())
        deadline = time.monotonic() + spec.max_seconds

        def running() -> bool:
            return not spec.stop_path.exists() and time.monotonic() < deadline

        lane = threading.Thread(target=_lane, args=(locks, spec, events, running), name="lane")
        lane.start()
        operations = 0
        while running():
            _operation(locks, rng, events, running)
            operations += 1
        lane.join()
        manager.close()
        events.write("done", operations=operations)
        events.close()
    except BaseException:
        spec.error_path.write_text(traceback.format_exc(), encoding="utf-8")
        raise

"""Waiters woken by the database's notices, beside waiters that poll
(PostgreSQL).

    python -m pathlock.bench.notices [--url URL] [--rounds N] [--holds S[,S...]]
                                     [--processes N] [--hold SECONDS] [--seconds S]
                                     [--blocks N]

Two worker processes (``spawn``) per way of waiting, one pair with notices
(the default: a release that hands paths over wakes the request next in line
with ``NOTIFY``) and one without (pathlock's releases send none and its
processes do not listen: the next in line looks every millisecond for 50 ms,
then as the wait policy says, as on MySQL), run the same experiments in
alternating rounds:

- **Hand-off**: one process holds a path; the other requests it 20 ms
  later; the holder releases after holding ``--holds`` seconds past that
  request (in turn). Latency: the waiter's grant minus the moment the holder
  called ``release()`` (``time.monotonic()``, one clock for the machine).
  Transactions: the connections both processes took from their pools per
  round (one per transaction).
- **Hot path**: ``--processes`` processes per way of waiting take turns on
  one path for ``--seconds`` per block (``--blocks`` blocks each, the ways
  alternating), holding it ``--hold`` seconds: grants per second, the wait's
  median and maximum, transactions per grant.

The two ways of waiting share the server, and each experiment alternates
them, so their ratio is what counts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from sqlalchemy import event

from pathlock import PathLockManager
from pathlock.bench.stats import median, percentile
from pathlock.bench.workers import _sleep_until

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MODES = ("notices", "polling")
ASK_AFTER = 0.020
STUCK = 60.0


def _without_notices() -> None:
    """This process's releases send no notice and its waiters hear none."""
    from pathlock.dialects import for_name  # noqa: PLC0415 - in the worker only

    family = type(for_name("postgresql"))
    family.notices = False
    family.listen = lambda *_: None  # type: ignore[method-assign]


def _worker(url: str, mode: str, pipe: Connection) -> None:
    """Run the jobs the parent sends until it sends ``None``."""
    if mode == "polling":
        _without_notices()
    manager = PathLockManager(url, node_id=f"notices-{mode}-{os.getpid()}")
    taken = [0]
    event.listen(manager.engine, "checkout", lambda *_: taken.__setitem__(0, taken[0] + 1))
    manager.for_customer(1).lock_paths(f"/warm/{os.getpid()}").release()
    try:
        while True:
            job = pipe.recv()
            if job is None:
                return
            kind, arguments = job
            before = taken[0]
            result = (
                _hand_off(manager, **arguments)
                if kind == "hand_off"
                else _hot(manager, **arguments)
            )
            pipe.send((result, taken[0] - before))
    finally:
        manager.close()


def _hand_off(
    manager: PathLockManager, *, customer_id: int, role: str, start: float, release_at: float
) -> tuple[float, ...]:
    locks = manager.for_customer(customer_id)
    _sleep_until(start if role == "holder" else start + ASK_AFTER)
    lease = locks.lock_paths("/Shared/hot", timeout=STUCK)
    granted = time.monotonic()
    if role == "holder":
        _sleep_until(release_at)
    called = time.monotonic()
    lease.release()
    return (granted, called)


def _hot(
    manager: PathLockManager, *, customer_id: int, start: float, until: float, hold: float
) -> list[float]:
    locks = manager.for_customer(customer_id)
    waits: list[float] = []
    _sleep_until(start)
    while time.monotonic() < until:
        asked = time.monotonic()
        lease = locks.lock_paths("/Shared/hot", timeout=STUCK)
        waits.append(time.monotonic() - asked)
        time.sleep(hold)
        lease.release()
    return waits


@contextmanager
def _workers(url: str, count: int) -> Iterator[dict[str, list[Connection]]]:
    context = multiprocessing.get_context("spawn")
    pipes: dict[str, list[Connection]] = {mode: [] for mode in MODES}
    processes = []
    for mode in MODES:
        for _ in range(count):
            mine, theirs = context.Pipe()
            process = context.Process(target=_worker, args=(url, mode, theirs), daemon=True)
            process.start()
            pipes[mode].append(mine)
            processes.append(process)
    try:
        yield pipes
    finally:
        for each in pipes.values():
            for pipe in each:
                pipe.send(None)
        for process in processes:
            process.join(30)


def _run(pipes: list[Connection], jobs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    for pipe, job in zip(pipes, jobs, strict=False):
        pipe.send(job)
    return [pipe.recv() for pipe in pipes[: len(jobs)]]


def _out(line: str) -> None:
    print(line, flush=True)  # noqa: T201 - the benchmark's output


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def hand_offs(pipes: dict[str, list[Connection]], rounds: int, holds: list[float]) -> None:
    latency: dict[tuple[str, float], list[float]] = {}
    taken: dict[tuple[str, float], int] = {}
    for number in range(rounds):
        for hold in holds:
            for mode in MODES if number % 2 == 0 else reversed(MODES):
                start = time.monotonic() + 0.05
                customer_id = secrets.randbelow(2**62) + 1
                common = {"customer_id": customer_id, "start": start}
                release_at = start + ASK_AFTER + hold
                (held, holder_took), (asked, waiter_took) = _run(
                    pipes[mode],
                    [
                        ("hand_off", {**common, "role": "holder", "release_at": release_at}),
                        ("hand_off", {**common, "role": "waiter", "release_at": 0.0}),
                    ],
                )
                latency.setdefault((mode, hold), []).append(asked[0] - held[1])
                taken[mode, hold] = taken.get((mode, hold), 0) + holder_took + waiter_took
    _out("\n### Hand-off: the waiter's grant after the holder called release()\n")
    _out(f"{rounds} rounds per way of waiting and hold, the two ways alternating.\n")
    _out("| waiting | hold | p50 | p90 | max | transactions per round |")
    _out("|---|---|---|---|---|---|")
    for hold in holds:
        for mode in MODES:
            values = latency[mode, hold]
            _out(
                f"| {mode} | {hold * 1000:g} ms | {_ms(median(values))} |"
                f" {_ms(percentile(values, 0.9))} | {_ms(max(values))} |"
                f" {taken[mode, hold] / rounds:.1f} |"
            )


def hot_path(
    pipes: dict[str, list[Connection]], processes: int, hold: float, seconds: float, blocks: int
) -> None:
    waits: dict[str, list[float]] = {mode: [] for mode in MODES}
    taken = dict.fromkeys(MODES, 0)
    spent = dict.fromkeys(MODES, 0.0)
    for number in range(blocks):
        for mode in MODES if number % 2 == 0 else reversed(MODES):
            start = time.monotonic() + 0.1
            job = {
                "customer_id": secrets.randbelow(2**62) + 1,
                "start": start,
                "until": start + seconds,
                "hold": hold,
            }
            results = _run(pipes[mode][:processes], [("hot", job)] * processes)
            spent[mode] += time.monotonic() - start
            for each, took in results:
                waits[mode].extend(each)
                taken[mode] += took
    _out(f"\n### Hot path: {processes} processes on one path, each holding it {_ms(hold)}\n")
    _out(f"{blocks} blocks of {seconds:g} s per way of waiting, the two ways alternating.\n")
    _out("| waiting | grants/s | wait p50 | wait max | transactions per grant |")
    _out("|---|---|---|---|---|")
    for mode in MODES:
        values = waits[mode]
        _out(
            f"| {mode} | {len(values) / spent[mode]:.0f} | {_ms(median(values))} |"
            f" {_ms(max(values))} | {taken[mode] / len(values):.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pathlock.bench.notices", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"a PostgreSQL URL (default {DEFAULT_URL})"
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--holds", default="0.005,0.2")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--hold", type=float, default=0.001)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--blocks", type=int, default=4)
    options = parser.parse_args(argv)
    if not options.url.startswith("postgresql"):
        parser.error("notices are PostgreSQL's: give a postgresql+psycopg:// URL")
    holds = [float(each) for each in options.holds.split(",")]
    PathLockManager(options.url).close()  # the schema is there (run `pathlock db upgrade`)
    with _workers(options.url, max(2, options.processes)) as pipes:
        hand_offs(pipes, options.rounds, holds)
        hot_path(pipes, options.processes, options.hold, options.seconds, options.blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())

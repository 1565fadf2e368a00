"""A team of worker processes, started once and shared by the experiments.

Spawning a worker (a fresh interpreter that imports SQLAlchemy and pathlock
and connects) costs about half a second of CPU on the benchmark machine:
starting the team once keeps that out of every figure and keeps the suite
short. Workers run the jobs of :mod:`pathlock.bench.workers`; the parent sends
each worker its job, then collects the results.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from types import TracebackType
from typing import Any

from pathlock.bench import BenchError
from pathlock.bench.workers import Job, serve

# How long the parent waits for a worker to start, or to finish a job, before
# it calls the run failed. Jobs last seconds; this only catches a hung worker.
START_TIMEOUT = 120.0
JOB_TIMEOUT = 900.0
# How far ahead of now a job's agreed start time lies, so every worker has
# received its job before the first one starts.
LEAD = 0.2


class Team:
    """``size`` worker processes, each with its own connections to ``url``."""

    def __init__(self, url: str, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        # Jobs that run "until stopped" watch this event; the parent sets it.
        self.stop = context.Event()
        self._outbox: multiprocessing.Queue[Any] = context.Queue()
        self._inboxes = [context.SimpleQueue() for _ in range(size)]
        self._processes = [
            context.Process(
                target=serve,
                args=(index, url, inbox, self._outbox, self.stop),
                name=f"pathlock-bench-{index}",
                daemon=True,
            )
            for index, inbox in enumerate(self._inboxes)
        ]
        for process in self._processes:
            process.start()
        try:
            self._collect(range(size), START_TIMEOUT, "starting")
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        return len(self._processes)

    def start_at(self) -> float:
        """A ``time.monotonic()`` instant for the next jobs to start at."""
        return time.monotonic() + LEAD

    def send(self, jobs: dict[int, Job]) -> None:
        """Send worker ``index`` its job, for every index of ``jobs``."""
        for index, job in jobs.items():
            self._inboxes[index].put(job)

    def collect(self, indexes: list[int]) -> dict[int, Any]:
        """The results of the jobs sent to ``indexes``; raises
        :class:`BenchError` if one failed."""
        return self._collect(indexes, JOB_TIMEOUT, "running a job")

    def run(self, jobs: dict[int, Job]) -> dict[int, Any]:
        """Send the jobs and wait for their results."""
        self.send(jobs)
        return self.collect(list(jobs))

    def close(self) -> None:
        self.stop.set()  # a job that runs until stopped ends, after a failure too
        for inbox, process in zip(self._inboxes, self._processes, strict=True):
            if process.is_alive():
                inbox.put(None)
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():  # pragma: no cover - a hung worker
                process.kill()
                process.join()

    def __enter__(self) -> Team:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _collect(self, indexes: range | list[int], timeout: float, doing: str) -> dict[int, Any]:
        waiting = set(indexes)
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            try:
                index, ok, result = self._outbox.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i in waiting if not self._processes[i].is_alive()]
                if dead:
                    raise BenchError(f"worker {dead[0]} died while {doing}") from None
                if time.monotonic() > deadline:
                    raise BenchError(f"workers {sorted(waiting)} hung while {doing}") from None
                continue
            if not ok:
                raise BenchError(f"worker {index} failed while {doing}:\n{result}")
            waiting.discard(index)
            results[index] = result
        return results

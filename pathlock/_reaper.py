"""Scheduling the reaper with APScheduler 3.

:meth:`PathLockManager.reap_expired` does the work (batched deletes in
:mod:`pathlock._store`); this module runs it periodically, either on a
background scheduler the manager owns or as a job in an application's own
scheduler, and takes both down when the manager closes. The cron way is
``pathlock reap``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pathlock._core import validation
from pathlock.errors import ArgumentTypeError, InvalidArgument, ManagerClosed, PathLockError

if TYPE_CHECKING:
    from apscheduler.job import Job
    from apscheduler.schedulers.base import BaseScheduler

log = logging.getLogger("pathlock.reaper")

INTERVAL = 60.0
BATCH_SIZE = 1000
JOB_ID = "pathlock-reaper"


class ReaperJobs:
    """The reaper jobs of one manager: at most one scheduler of its own and any
    number of jobs in applications' schedulers."""

    def __init__(self, reap: Callable[[int], int], *, name: str) -> None:
        self._reap = reap
        self._name = name
        # Guards everything below; runs in progress are counted so stop() can
        # wait for them (a run stops between batches once the manager closes).
        self._condition = threading.Condition()
        self._own: BaseScheduler | None = None
        self._jobs: list[tuple[BaseScheduler, str]] = []
        self._running = 0
        self._stopped = False

    def start(self, interval: float, batch_size: int) -> None:
        """Run the reaper on a background scheduler of our own."""
        from apscheduler.schedulers.background import BackgroundScheduler  # noqa: PLC0415

        with self._condition:
            self._check_not_stopped()
            if self._own is not None:
                raise PathLockError("this manager's reaper is already running")
            scheduler = BackgroundScheduler(daemon=True)
            self._add(scheduler, interval, batch_size, JOB_ID)
            scheduler.start()
            self._own = scheduler

    def add(self, scheduler: BaseScheduler, interval: float, batch_size: int, job_id: str) -> Job:
        """Add the reaper to an application's scheduler."""
        with self._condition:
            self._check_not_stopped()
            return self._add(scheduler, interval, batch_size, job_id)

    def _check_not_stopped(self) -> None:
        if self._stopped:
            raise ManagerClosed("schedule the reaper")

    def _add(self, scheduler: BaseScheduler, interval: float, batch_size: int, job_id: str) -> Job:
        from apscheduler.triggers.interval import IntervalTrigger  # noqa: PLC0415

        interval = validation.interval(interval)
        batch_size = validation.positive_int("batch_size", batch_size)
        if not isinstance(job_id, str):
            raise ArgumentTypeError(f"job_id must be a str, got {type(job_id).__name__}")
        if not job_id:
            raise InvalidArgument("job_id must not be empty")
        job = scheduler.add_job(
            self._run,
            # Jitter spreads the nodes' runs; they would be harmless together.
            IntervalTrigger(seconds=interval, jitter=interval / 10),
            kwargs={"batch_size": batch_size},
            id=job_id,
            name=self._name,
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(UTC),
        )
        self._jobs.append((scheduler, job_id))
        return job

    def _run(self, batch_size: int) -> None:
        with self._condition:
            if self._stopped:
                return
            self._running += 1
        try:
            self._reap(batch_size)
        except PathLockError as error:
            log.warning("reaper run failed (the next run will try again): %s", error)
        except Exception:  # never into the scheduler, which would log an ERROR
            log.warning(
                "reaper run failed unexpectedly (the next run will try again)", exc_info=True
            )
        finally:
            with self._condition:
                self._running -= 1
                self._condition.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Remove our jobs from applications' schedulers, shut our own
        scheduler down, and wait up to ``timeout`` seconds for a run in progress
        (it stops after its current batch). Later start() and add() refuse."""
        from apscheduler.jobstores.base import JobLookupError  # noqa: PLC0415

        with self._condition:
            self._stopped = True
            own, self._own = self._own, None
            jobs, self._jobs = self._jobs, []
        for scheduler, job_id in jobs:
            if scheduler is own:
                continue
            job = scheduler.get_job(job_id)
            # Only our own job: another manager may have replaced it since.
            if job is not None and job.func == self._run:
                with contextlib.suppress(JobLookupError):  # the application removed it
                    scheduler.remove_job(job_id)
        if own is not None:
            own.shutdown(wait=True)
        with self._condition:
            if not self._condition.wait_for(lambda: self._running == 0, timeout):
                log.warning("a reaper run did not stop within %.0f s of close()", timeout)

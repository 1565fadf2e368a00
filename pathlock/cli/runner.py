"""Run a command while holding a lease, like flock(1): ``pathlock lock ... -- CMD``.

The lease is held (and renewed by the manager's heartbeat) while the command
runs, and released whatever happens, but only once the command exited and no
process it started is left (:mod:`pathlock.cli.keeper` runs the command in a
process group of its own and stops what it leaves behind, also if pathlock is
killed). Its exit status is the command's,
or one of the codes below, chosen to stay clear of the conventions around it:

- :data:`EXIT_TIMEOUT` (124), :data:`EXIT_FAILURE` (125),
  :data:`EXIT_NOT_EXECUTABLE` (126) and :data:`EXIT_NOT_FOUND` (127) mean what
  they mean for ``timeout(1)`` and ``env(1)``, so scripts written for those
  read them right;
- :data:`EXIT_LEASE_LOST` (122) is the one code of pathlock's own: below the
  123-127 that ``xargs``, ``timeout`` and ``env`` use, above the ``sysexits.h``
  range (64-78) and below the 128+N of a death by signal N.

A command may exit with any of these codes itself; scripts that must tell
them apart read pathlock's one-line message on stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from pathlock.cli.keeper import Keeper, KeeperDied
from pathlock.customer import CustomerLocks
from pathlock.errors import LeaseLost, LockCancelled, LockTimeout
from pathlock.lease import Lease

log = logging.getLogger(__name__)

EXIT_LEASE_LOST = 122
EXIT_TIMEOUT = 124
EXIT_FAILURE = 125
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128

LEASE_ID_VAR = "PATHLOCK_LEASE_ID"
FENCING_TOKEN_VAR = "PATHLOCK_FENCING_TOKEN"  # noqa: S105 - a variable name, not a secret

# The signals that mean "stop": caught while waiting (nothing is held yet, so
# pathlock just stops) and forwarded to the command's process group while it
# runs (so it can clean up before the lease is released).
STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)

# How often the supervisor looks at the command, the lease and the signals.
_POLL = 0.05


@dataclass(frozen=True, slots=True)
class LockRequest:
    """What ``pathlock lock`` was asked to do."""

    exclusive: Sequence[str]
    shared: Sequence[str]
    shallow: Sequence[str]
    timeout: float | None
    deadline: float | None
    """When --timeout runs out (``time.monotonic()``): it counts from
    pathlock's start, so opening the database takes from it too."""
    ttl: float | None
    reason: str
    command: Sequence[str]
    kill_grace: float


class Interrupted(BaseException):
    """A stop signal arrived while waiting for the locks.

    A ``BaseException``, like ``KeyboardInterrupt``: it can strike in the middle
    of a statement, and SQLAlchemy invalidates a connection interrupted that
    way instead of returning it to the pool half-read.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Signals:
    """The stop signals, caught for one run, and whether the loss of the
    lease was reported already.

    While :attr:`waiting`, the first one sets :attr:`cancel`, which ends the
    wait for the locks within 50 ms (once a database call under way
    returns); a second one raises :class:`Interrupted` in the main thread at
    once, for a database that does not answer. Otherwise signals are only
    recorded, for the supervisor to forward. Signals that were ignored when
    pathlock started stay ignored, for pathlock and, through ``exec``, for
    the command (``nohup``, background jobs).
    """

    def __init__(self) -> None:
        self.waiting = False
        self.cancel = threading.Event()
        self.received: list[int] = []
        self.lost_reported = False

    @contextlib.contextmanager
    def caught(self) -> Iterator[_Signals]:
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(signum, self._handle)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if not self.waiting:
            return
        if not self.cancel.is_set():
            self.cancel.set()
            return
        self.waiting = False  # one Interrupted: the clean-up must not be interrupted
        raise Interrupted(signum)


def run_locked(locks: CustomerLocks, request: LockRequest) -> int:
    """Lock, run the command, release once none of its processes is left;
    return pathlock's exit status."""
    signals = _Signals()
    with signals.caught():
        try:
            lease = _acquire(locks, request, signals)
        except (Interrupted, LockCancelled) as stopped:
            signum = stopped.signum if isinstance(stopped, Interrupted) else signals.received[-1]
            log.warning(
                "stopped waiting for the locks on %s; nothing is held",
                signal.Signals(signum).name,
            )
            return EXIT_SIGNAL_BASE + signum
        except LockTimeout as error:
            return _timed_out(error, request)
        try:
            status = _run(lease, request, signals)
        finally:
            lease.release()
        if lease.lost:
            # Lost while the command ran, or found gone at release: some of
            # its work may have been done without the lock.
            if not signals.lost_reported:
                log.error("%s", _lost_message(lease))
            return EXIT_LEASE_LOST
        return status


def _timed_out(error: LockTimeout, request: LockRequest) -> int:
    """Say why the locks were not granted in time, as the whole --timeout
    (the request had what opening the database left of it); and exit 124
    only when they were busy: a database that did not answer is pathlock's
    failure, 125, as an unreachable one is, whatever it answered before."""
    told = LockTimeout(
        error.paths,
        error.timeout if request.timeout is None else request.timeout,
        error.held_by,
        error.queued_behind,
        error.contended,
        error.unanswered,
        error.shallow,
    )
    log.error("%s", told)
    return EXIT_FAILURE if error.unanswered else EXIT_TIMEOUT


def _acquire(locks: CustomerLocks, request: LockRequest, signals: _Signals) -> Lease:
    log.info(
        "locking %s for customer %d",
        ", ".join(
            [f"{path} (exclusive)" for path in request.exclusive]
            + [f"{path} (shared)" for path in request.shared]
            + [f"{path} (depth 0)" for path in request.shallow]
        ),
        locks.customer_id,
    )
    # A signal that strikes after the grant committed but before the lease
    # was handed back is no concern here: the manager deletes such a grant by
    # its lease id before Interrupted reaches us.
    signals.waiting = True
    try:
        lease = locks.lock_paths(
            *request.exclusive,
            shared=request.shared,
            shallow=request.shallow,
            timeout=(
                None if request.deadline is None else max(0.0, request.deadline - time.monotonic())
            ),
            reason=request.reason,
            ttl=request.ttl,
            cancel=signals.cancel,
        )
    finally:
        signals.waiting = False
    log.info(
        "locked %s: lease %s, fencing token %d",
        lease.describe_paths(),
        lease.lease_id,
        lease.fencing_token,
    )
    return lease


def _run(lease: Lease, request: LockRequest, signals: _Signals) -> int:
    """Start the command unless told to stop already, and supervise it; return
    only once no process of the command is left."""
    if signals.received:
        return EXIT_SIGNAL_BASE + signals.received[-1]
    try:
        lease.ensure_held()
    except LeaseLost:
        return EXIT_LEASE_LOST  # reported by the caller, which sees lease.lost
    environment = {
        **os.environ,
        LEASE_ID_VAR: lease.lease_id,
        FENCING_TOKEN_VAR: str(lease.fencing_token),
    }
    with _terminal() as (terminal, restore_ttou):
        keeper = Keeper(
            request.command,
            environment=environment,
            grace=request.kill_grace,
            terminal=terminal,
            restore_ttou=restore_ttou,
        )
        try:
            return _started(keeper, lease, request, signals)
        finally:
            # Whatever went wrong here, the lease is released only after this:
            # the keeper stops what is left of the command and waits for it.
            keeper.close()


def _started(keeper: Keeper, lease: Lease, request: LockRequest, signals: _Signals) -> int:
    pid = 0
    try:
        pid = keeper.started()
        log.info("started %s (pid %d, in a process group of its own)", request.command[0], pid)
        return _exit_status(_supervise(keeper, pid, lease, request, signals))
    except FileNotFoundError as error:
        log.error("cannot run %s: %s", request.command[0], error.strerror)  # noqa: TRY400
        return EXIT_NOT_FOUND
    except OSError as error:
        log.error("cannot run %s: %s", request.command[0], error.strerror or error)  # noqa: TRY400
        return EXIT_NOT_EXECUTABLE
    except KeeperDied as error:
        log.error("%s; stopping the command's process group with SIGKILL", error)  # noqa: TRY400
        if pid:
            _kill_group(pid)
        return EXIT_FAILURE


def _supervise(
    keeper: Keeper, pid: int, lease: Lease, request: LockRequest, signals: _Signals
) -> int:
    """Wait until the command exited and nothing it started is left; forward
    stop signals to its process group, and stop everything of it if the lease
    is lost (SIGTERM, then SIGKILL after the grace period). The command's
    status, as ``Popen.returncode``."""
    forwarded = 0
    stopping = False
    while True:
        report = keeper.report(_POLL)
        if report is not None:
            kind, value = report
            if kind == "gone":
                return value
            if kind == "leftovers" and not stopping:
                log.warning(
                    "%s exited but left processes running; stopping them: "
                    "SIGTERM now, SIGKILL in %g s",
                    request.command[0],
                    request.kill_grace,
                )
                stopping = True
        for signum in signals.received[forwarded:]:
            forwarded += 1
            keeper.send(f"signal {signum}")
        if not stopping and lease.lost:
            log.error(
                "%s; stopping %s (pid %d) and every process it started: "
                "SIGTERM now, SIGKILL in %g s",
                _lost_message(lease),
                request.command[0],
                pid,
                request.kill_grace,
            )
            signals.lost_reported = True
            keeper.send("stop")
            stopping = True


@contextlib.contextmanager
def _terminal() -> Iterator[tuple[int | None, bool]]:
    """The terminal to hand to the command, as a shell hands it to a foreground
    job: pathlock's controlling terminal, if pathlock's process group has its
    foreground, whatever stdin is (the command may open ``/dev/tty``, as ssh
    and sudo do to ask for a password). Yields a descriptor of it (or None)
    and whether the command must get SIGTTOU back to its default. Gives the
    foreground back to pathlock's group afterwards.

    The command runs in a process group of its own, so without the foreground
    it would no longer get the terminal's Ctrl-C, and reading the terminal
    would stop it (SIGTTIN). pathlock ignores SIGTTOU meanwhile: it may still
    write to the terminal (with ``stty tostop``) and must take it back."""
    terminal = _foreground_terminal()
    if terminal is None:
        yield None, False
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        yield terminal, previous is not signal.SIG_IGN
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, os.getpgrp())
        signal.signal(signal.SIGTTOU, previous)
        os.close(terminal)


def _foreground_terminal() -> int | None:
    """A descriptor of pathlock's controlling terminal if pathlock's process
    group has its foreground; None otherwise (no terminal: a service, cron)."""
    try:
        terminal = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        if os.tcgetpgrp(terminal) == os.getpgrp():
            return terminal
    os.close(terminal)
    return None


def _kill_group(pgid: int) -> None:
    """SIGKILL to a process group, and wait until it is empty: the last resort
    when the keeper itself was killed (its orphans then go to init)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        while True:
            os.killpg(pgid, signal.SIGKILL)
            time.sleep(_POLL)


def _exit_status(returncode: int) -> int:
    """The shell's convention: a death by signal N is 128 + N."""
    return EXIT_SIGNAL_BASE - returncode if returncode < 0 else returncode


def _lost_message(lease: Lease) -> str:
    try:
        lease.ensure_held()
    except LeaseLost as error:
        return f"lease {lease.lease_id} lost: {error.reason}"
    return f"lease {lease.lease_id} lost"

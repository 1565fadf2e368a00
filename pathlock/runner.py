"""Run a command while holding a lease, like flock(1): ``pathlock lock ... -- CMD``.

The lease is held (and renewed by the manager's heartbeat) exactly while the
command runs and released whatever happens. Its exit status is the command's,
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
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from pathlock.customer import CustomerLocks
from pathlock.errors import LeaseLost, LockTimeout, PathLockError
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
# pathlock just stops) and forwarded to the command while it runs (so it can
# clean up before the lease is released).
STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)

# How often the supervisor looks at the command, the lease and the signals.
_POLL = 0.05


@dataclass(frozen=True, slots=True)
class LockRequest:
    """What ``pathlock lock`` was asked to do."""

    exclusive: Sequence[str]
    shared: Sequence[str]
    timeout: float | None
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

    While :attr:`waiting`, the first one raises :class:`Interrupted` in the
    main thread (the manager's wait loop has no other way to be cancelled);
    otherwise signals are only recorded, for the supervisor to forward.
    Signals that were ignored when pathlock started stay ignored, for pathlock
    and, through ``exec``, for the command (``nohup``, background jobs).
    """

    def __init__(self) -> None:
        self.waiting = False
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
        if self.waiting:
            self.waiting = False  # one Interrupted: the clean-up must not be interrupted
            raise Interrupted(signum)


def run_locked(locks: CustomerLocks, request: LockRequest) -> int:
    """Lock, run the command, release; return pathlock's exit status."""
    signals = _Signals()
    with signals.caught():
        try:
            lease = _acquire(locks, request, signals)
        except Interrupted as interrupt:
            log.warning(
                "stopped waiting for the locks on %s; nothing is held",
                signal.Signals(interrupt.signum).name,
            )
            return EXIT_SIGNAL_BASE + interrupt.signum
        except LockTimeout as error:
            log.error("%s", error)  # noqa: TRY400 - the message is the whole story
            return EXIT_TIMEOUT
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


def _acquire(locks: CustomerLocks, request: LockRequest, signals: _Signals) -> Lease:
    log.info(
        "locking %s for customer %d",
        ", ".join(
            [f"{path} (exclusive)" for path in request.exclusive]
            + [f"{path} (shared)" for path in request.shared]
        ),
        locks.customer_id,
    )
    signals.waiting = True
    try:
        lease = locks.lock_paths(
            *request.exclusive,
            shared=request.shared,
            timeout=request.timeout,
            reason=request.reason,
            ttl=request.ttl,
        )
    except Interrupted:
        # The signal may have struck after the grant committed but before the
        # lease was handed back: delete whatever this owner holds.
        try:
            locks.release_locks()
        except PathLockError as error:
            log.warning("could not undo a grant the signal may have cut short: %s", error)
        raise
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
    """Start the command unless told to stop already, and supervise it."""
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
    try:
        child = subprocess.Popen(request.command, env=environment)  # noqa: S603 - the user's command, no shell
    except FileNotFoundError as error:
        log.error("cannot run %s: %s", request.command[0], error.strerror)  # noqa: TRY400
        return EXIT_NOT_FOUND
    except OSError as error:
        log.error("cannot run %s: %s", request.command[0], error.strerror or error)  # noqa: TRY400
        return EXIT_NOT_EXECUTABLE
    log.info("started %s (pid %d)", request.command[0], child.pid)
    return _exit_status(_supervise(child, lease, request, signals))


def _supervise(
    child: subprocess.Popen[bytes], lease: Lease, request: LockRequest, signals: _Signals
) -> int:
    """Wait for the command; forward stop signals to it, and stop it if the
    lease is lost (SIGTERM, then SIGKILL after the grace period)."""
    forwarded = 0
    kill_at: float | None = None
    while True:
        try:
            return child.wait(_POLL)
        except subprocess.TimeoutExpired:
            pass
        for signum in signals.received[forwarded:]:
            forwarded += 1
            if not _terminal_sent(signum):
                child.send_signal(signum)
        if kill_at is None and lease.lost:
            log.error(
                "%s; stopping %s (pid %d): SIGTERM now, SIGKILL in %g s",
                _lost_message(lease),
                request.command[0],
                child.pid,
                request.kill_grace,
            )
            signals.lost_reported = True
            child.terminate()
            kill_at = time.monotonic() + request.kill_grace
        elif kill_at is not None and time.monotonic() >= kill_at:
            child.kill()
            kill_at = math.inf


def _terminal_sent(signum: int) -> bool:
    """Whether ``signum`` most likely came from the terminal (Ctrl-C): the
    terminal signals its whole foreground process group, so the command, which
    shares pathlock's group, has it already, and a second SIGINT would strike
    its clean-up. ``kill -INT`` from elsewhere is forwarded as usual."""
    if signum != signal.SIGINT:
        return False
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError):  # no terminal, or stdin closed
        return False


def _exit_status(returncode: int) -> int:
    """The shell's convention: a death by signal N is 128 + N."""
    return EXIT_SIGNAL_BASE - returncode if returncode < 0 else returncode


def _lost_message(lease: Lease) -> str:
    try:
        lease.ensure_held()
    except LeaseLost as error:
        return f"lease {lease.lease_id} lost: {error.reason}"
    return f"lease {lease.lease_id} lost"

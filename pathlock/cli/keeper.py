"""The keeper: a small process between ``pathlock lock`` and its command that
makes sure nothing the command started outlives the lock.

``pathlock lock`` starts the keeper (:class:`Keeper`), and the keeper starts
the command in a process group of its own. The keeper then answers for the
whole group: it forwards signals to it, stops it (SIGTERM, then SIGKILL after
the grace period) when told to, when the command exits but leaves processes
behind, and when ``pathlock lock`` dies, and it reports ``gone`` only once no
process of the command is left. ``pathlock lock`` releases the lease only
after that report. The keeper is a process of its own, outside pathlock's
process group, because the command must be stopped even when pathlock is
killed with SIGKILL: the keeper notices pathlock's death at once (its order
pipe reaches end of file; on Linux also a parent-death signal).

On Linux the keeper is also a *child subreaper*: a descendant whose parent
exits (a daemon's double fork, ``setsid``) becomes the keeper's child instead
of init's, so the keeper still sees it, stops it and waits for it. Elsewhere
only the command's process group is stopped.

This module runs as a script (``python -I -S keeper.py``), so it imports the
standard library only: the keeper starts in milliseconds and keeps no database
connection, thread or lease of pathlock's.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

# How often the keeper looks at the command's processes and its orders.
_POLL = 0.05

# The stops of job control: the terminal's (Ctrl-Z) and a background read or write.
_JOB_STOPS = frozenset({signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class KeeperDied(Exception):
    """The keeper exited without saying that the command's processes are gone."""


@dataclass(frozen=True, slots=True)
class _Config:
    orders: int  # the keeper reads pathlock's orders from this descriptor
    reports: int  # and writes its reports to this one
    parent: int  # pathlock's process id
    grace: float  # seconds between SIGTERM and SIGKILL
    terminal: int | None  # hand this terminal's foreground to the command ...
    foreground: int  # ... if this process group (pathlock's) has it
    restore_ttou: bool  # SIGTTOU was ignored for the hand-over only: SIG_DFL for the command


class Keeper:
    """pathlock's end of the keeper: start it, give it orders, read its reports.

    Orders are ``signal N`` (forward signal N to the command's group) and
    ``stop`` (SIGTERM to every process of the command, SIGKILL after the
    grace period). Closing the orders (:meth:`close`, or pathlock's death) is
    ``stop`` too. Reports are ``started PID``, ``failed ERRNO`` (the command
    could not be run), ``leftovers`` (the command exited, its processes are
    being stopped) and ``gone STATUS`` (the last one: no process of the
    command is left; STATUS is the command's, as ``Popen.returncode``).
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        environment: dict[str, str],
        grace: float,
        terminal: int | None,
        restore_ttou: bool,
    ) -> None:
        orders_in, self._orders = os.pipe()
        self._reports, reports_out = os.pipe()
        config = {
            "orders": orders_in,
            "reports": reports_out,
            "parent": os.getpid(),
            "grace": grace,
            "terminal": terminal,
            "foreground": os.getpgrp(),
            "restore_ttou": restore_ttou,
        }
        try:
            # Its own process group: a signal to pathlock's group (a shell's
            # `kill -9 %1`) does not take the keeper with it.
            self.process = subprocess.Popen(  # noqa: S603 - our own script, no shell
                [sys.executable, "-I", "-S", __file__, json.dumps(config), *command],
                env=environment,
                pass_fds=(orders_in, reports_out, *([] if terminal is None else [terminal])),
                process_group=0,
            )
        finally:
            os.close(orders_in)
            os.close(reports_out)
        self._buffer = b""
        self.finished = False

    def started(self) -> int:
        """The command's process id, once it runs. Raises the ``OSError`` of
        its ``exec`` if it could not be run (the keeper has exited then)."""
        report = None
        while report is None:  # without a timeout, only a report or KeeperDied ends it
            report = self.report(None)
        kind, value = report
        if kind == "failed":
            self.process.wait()
            self.finished = True
            raise OSError(value, os.strerror(value) if value else "could not be started")
        return value

    def send(self, order: str) -> None:
        """Give an order; one to a keeper that is gone already is dropped."""
        with contextlib.suppress(BrokenPipeError):
            os.write(self._orders, order.encode() + b"\n")

    def report(self, timeout: float | None) -> tuple[str, int] | None:
        """The keeper's next report, or None if none came within ``timeout``.
        Raises :class:`KeeperDied` if it exited without reporting ``gone``."""
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._reports], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._reports, 4096)
            if not chunk:
                self.process.wait()
                self.finished = True
                raise KeeperDied(f"the keeper exited with status {self.process.returncode}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        kind, _, value = line.decode().partition(" ")
        if kind == "gone":
            self.process.wait()
            self.finished = True
        return kind, int(value or 0)

    def close(self) -> None:
        """Stop the command's processes unless they are gone already, and wait
        until they are: whatever happens, nothing of the command runs after
        this returns (except a keeper killed from outside: see :meth:`report`)."""
        os.close(self._orders)
        with contextlib.suppress(KeeperDied):
            while not self.finished:
                self.report(None)
        os.close(self._reports)


# -- the keeper process ------------------------------------------------------------------


class _Watch:
    """The keeper's state: the command, its process group, and the stop."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.leader = 0  # the command's pid, which is also its process group id
        self.status: int | None = None  # the command's, once it exited
        self.abandoned = False  # pathlock died, or closed its orders
        self.kill_at: float | None = None  # set once SIGTERM went to everything
        self.reported_leftovers = False
        self.buffer = b""
        self.sigterm: signal.Handlers = signal.SIG_DFL  # SIGTERM's as pathlock left it
        self.sigchld: signal.Handlers = signal.SIG_DFL  # and SIGCHLD's

    def report(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError):  # pathlock is gone: carry on alone
            os.write(self.config.reports, line.encode() + b"\n")

    def start(self, command: Sequence[str]) -> bool:
        try:
            child = subprocess.Popen(command, preexec_fn=self._in_child)  # noqa: S603, PLW1509 - the keeper has one thread
        except OSError as error:
            self.report(f"failed {error.errno or 0}")
            return False
        except subprocess.SubprocessError:
            self.report("failed 0")
            return False
        self.leader = child.pid
        child.returncode = 0  # reaped by the keeper itself, never through Popen
        self.report(f"started {self.leader}")
        return True

    def _in_child(self) -> None:
        """In the command's process, before ``exec``: its own process group,
        and the terminal's foreground if pathlock has it (as a shell does for
        a foreground job), so that Ctrl-C reaches it and it may read input."""
        os.setpgid(0, 0)
        # What the keeper changed for itself goes back to what pathlock had:
        # an ignored SIGTERM (an exec resets a handler, not SIG_IGN) stays ignored.
        signal.signal(signal.SIGTERM, self.sigterm)
        signal.signal(signal.SIGCHLD, self.sigchld)
        terminal = self.config.terminal
        if terminal is not None:
            with contextlib.suppress(OSError):  # the terminal went away: run without it
                if os.tcgetpgrp(terminal) == self.config.foreground:
                    os.tcsetpgrp(terminal, os.getpid())  # SIGTTOU is ignored here
            if self.config.restore_ttou:
                signal.signal(signal.SIGTTOU, signal.SIG_DFL)

    def read_orders(self) -> None:
        if self.abandoned:
            time.sleep(_POLL)
            return
        ready, _, _ = select.select([self.config.orders], [], [], _POLL)
        if not ready:
            return
        chunk = os.read(self.config.orders, 4096)
        if not chunk:
            self.abandoned = True
            self.stop()
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            kind, _, value = line.decode().partition(" ")
            if kind == "signal" and self.status is None:
                _signal_group(self.leader, int(value))
                # A stopped process (job control, a background read of the
                # terminal) acts on a signal only once continued, as a
                # shell's kill of a stopped job knows.
                _signal_group(self.leader, signal.SIGCONT)
            elif kind == "stop":
                self.stop()

    def stop(self) -> None:
        """SIGTERM to every process of the command; SIGKILL after the grace."""
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.config.grace
            self.signal_all(signal.SIGTERM)
            self.signal_all(signal.SIGCONT)  # a stopped process would wait for SIGKILL

    def signal_all(self, signum: int) -> None:
        _signal_group(self.leader, signum)
        for pid in _children() or ():
            # A child of the keeper: unreaped, so its pid cannot be anyone else's.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def gone(self) -> bool:
        """Reap what exited; whether the command exited and nothing of it is left.

        The command's own process is only peeked at (``WNOWAIT``) until then:
        unreaped, its pid stays reserved, so its process group id cannot be
        reused by an unrelated process that the keeper would then signal."""
        # The order matters. A process's children become the keeper's before
        # the process can be seen to have exited, so the children are listed
        # after the command's exit was looked for, and a turn that reaps
        # anything is never the last: the next one lists what it left behind.
        if self.status is None and sys.platform == "linux":
            self._peek_leader()
        children = _children()
        if children is None:  # no /proc: reap everything and ask the group
            return self._gone_without_proc()
        others = [pid for pid in children if pid != self.leader]
        for pid in others:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if self.status is not None and not others:
            os.waitpid(self.leader, 0)
            return True
        return False

    def _peek_leader(self) -> None:
        if self.config.terminal is not None:
            self._resume_if_suspended()
        info = os.waitid(os.P_PID, self.leader, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None and info.si_pid == self.leader:
            code = info.si_status
            self.status = code if info.si_code == os.CLD_EXITED else -code

    def _resume_if_suspended(self) -> None:
        """Ctrl-Z (or reading the terminal without its foreground) stopped the
        command: resume it. The shell waits for pathlock, which runs on, so it
        would never take the terminal back, nor could the user resume the
        command; and a suspended command keeps its locks held, doing nothing."""
        try:
            info = os.waitid(os.P_PID, self.leader, os.WSTOPPED | os.WNOHANG)
        except ChildProcessError:  # it exited: Linux has no stop to report then
            return
        if info is not None and info.si_pid == self.leader and info.si_status in _JOB_STOPS:
            _signal_group(self.leader, signal.SIGCONT)

    def _gone_without_proc(self) -> bool:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.leader:
                self.status = os.waitstatus_to_exitcode(wait_status)
        if self.status is None:
            return False
        try:
            os.killpg(self.leader, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _children() -> list[int] | None:
    """The keeper's children, zombies included; None where Linux's
    ``/proc/PID/task/TID/children`` is missing."""
    if sys.platform != "linux":
        return None
    pid = os.getpid()
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return None
    return [int(child) for child in listed.split()]


def _prctl(option: int, value: int) -> bool:
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0)) == 0


def _watch(config: _Config, command: Sequence[str]) -> int:
    state = _Watch(config)

    def abandon(_signum: int, _frame: FrameType | None) -> None:
        state.abandoned = True

    # pathlock's death: the end of its orders, and on Linux also this signal
    # (even if another process inherited the orders' descriptor by mistake).
    sigterm = signal.signal(signal.SIGTERM, abandon)
    state.sigterm = signal.SIG_IGN if sigterm is signal.SIG_IGN else signal.SIG_DFL
    # An ignored SIGCHLD (inherited from whoever started pathlock) makes the
    # kernel reap exited children at once: the command's status, its
    # reserved group id and the keeper's view of what is left would be lost,
    # and the keeper waited forever. The command gets it back as it was.
    sigchld = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    state.sigchld = signal.SIG_IGN if sigchld is signal.SIG_IGN else signal.SIG_DFL
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != config.parent:
        return 1  # pathlock died before the command could start: run nothing
    if not state.start(command):
        return 0
    while not state.gone():
        if state.abandoned:
            state.stop()
        elif state.status is not None:
            if not state.reported_leftovers:
                state.reported_leftovers = True
                state.report("leftovers")
            state.stop()
        if state.kill_at is not None and time.monotonic() >= state.kill_at:
            state.signal_all(signal.SIGKILL)  # again each turn: also any late fork
        state.read_orders()
    state.report(f"gone {state.status}")
    return 0


def main(argv: Sequence[str]) -> int:
    """The keeper process: ``keeper.py CONFIG COMMAND [ARG ...]``."""
    config = _Config(**json.loads(argv[1]))
    for descriptor in (config.orders, config.reports, config.terminal):
        if descriptor is not None:
            os.set_inheritable(descriptor, False)  # never the command's
    return _watch(config, argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""``pathlock lock`` stops every process its command started, not the command alone.

The command here is a small Python program that starts a *grandchild*: a
process that ignores SIGTERM (only SIGKILL stops it), writes its pid to a
file and then keeps working. Each test ends the lock a different way (SIGTERM
to pathlock, a lost lease, SIGKILL of pathlock, the command exiting) and
checks, through ``/proc``, that the grandchild is gone before the paths are
free again or pathlock exits; a second ``pathlock lock`` waiting on the same
path records whether the grandchild still existed when its own command started.
On the old runner, which signalled the command's process alone, each of these
grandchildren outlived the lock.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.integration.test_cli import PATHLOCK, WAIT, Running, pathlock, python

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

# The grandchild: only SIGKILL stops it. argv: PIDFILE
GRANDCHILD = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
Path(sys.argv[1] + ".tmp").write_text(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(0.01)
"""

# The command: starts the grandchild (in its own session with "escape", as a
# daemon would), records its lease, then stays ("stay") or exits at once,
# leaving the grandchild behind. argv: PIDFILE LEASEFILE MODE
COMMAND = f"""
import os, subprocess, sys, time
from pathlib import Path
pidfile, leasefile, mode = sys.argv[1:]
escape = mode == "escape"
subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}, pidfile], start_new_session=escape)
while not Path(pidfile).exists():
    time.sleep(0.01)
Path(leasefile + ".tmp").write_text(os.environ["PATHLOCK_LEASE_ID"])
os.replace(leasefile + ".tmp", leasefile)
if mode == "stay":
    time.sleep(300)
"""

# The second holder's command: does the grandchild still exist? argv: PIDFILE OUTFILE
CHECK = """
import sys
from pathlib import Path
pid = Path(sys.argv[1]).read_text()
Path(sys.argv[2]).write_text("alive" if Path("/proc", pid).exists() else "gone")
"""


def _exists(pid: int) -> bool:
    """Whether the process exists at all (a zombie counts: it is not reaped)."""
    return Path("/proc", str(pid)).exists()


def _wait_until(condition: Callable[[], bool], what: str, running: Running) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"no {what} within {WAIT:g} s; pathlock said:\n{running.stderr}")
        time.sleep(0.02)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Running]]:
    """Start pathlock processes in the background; kill any left running, and
    any grandchild a test recorded in ``pids``."""
    started: list[Running] = []

    def start(*args: str, wrapper: Sequence[str] = ()) -> Running:
        started.append(Running(*args, wrapper=wrapper))
        return started[-1]

    yield start
    for running in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, signal.SIGKILL)
        running.process.wait()


@pytest.fixture
def grandchild(tmp_path: Path) -> Iterator[Path]:
    """The grandchild's pid file; the grandchild is killed after the test
    if the code under test left it running."""
    pidfile = tmp_path / "grandchild.pid"
    yield pidfile
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _start_holder(
    spawn: Callable[..., Running],
    database_url: str,
    customer_id: int,
    grandchild: Path,
    mode: str,
    *options: str,
    wrapper: Sequence[str] = (),
) -> tuple[Running, int, str]:
    leasefile = grandchild.with_name("lease")
    running = spawn(
        "lock", "--database-url", database_url, "--customer", str(customer_id),
        "--kill-grace", "0.5", *options, "/work",
        "--", *python(COMMAND, grandchild, leasefile, mode), wrapper=wrapper,
    )  # fmt: skip
    _wait_until(leasefile.exists, "lease seen by the command", running)
    return running, int(grandchild.read_text()), leasefile.read_text()


def _start_second(
    spawn: Callable[..., Running], database_url: str, customer_id: int, grandchild: Path
) -> tuple[Running, Path]:
    seen = grandchild.with_name("seen-by-second")
    second = spawn(
        "lock", "-v", "--database-url", database_url, "--customer", str(customer_id),
        "/work", "--", *python(CHECK, grandchild, seen),
    )  # fmt: skip
    second.wait_for_line("locking /work")
    return second, seen


def test_sigterm_stops_the_grandchild_before_the_next_holder_starts(
    database_url: str, customer_id: int, grandchild: Path, spawn: Callable[..., Running]
) -> None:
    first, pid, _ = _start_holder(spawn, database_url, customer_id, grandchild, "stay")
    second, seen = _start_second(spawn, database_url, customer_id, grandchild)
    time.sleep(0.3)  # let the second one queue (earlier is fine: it waits either way)
    assert not seen.exists()

    first.process.send_signal(signal.SIGTERM)
    assert first.finish() == 128 + signal.SIGTERM, first.stderr
    assert not _exists(pid)
    assert second.finish() == 0, second.stderr
    assert seen.read_text() == "gone"


def test_sigterm_reaches_a_command_stopped_by_job_control(
    database_url: str, customer_id: int, grandchild: Path, spawn: Callable[..., Running]
) -> None:
    # A stopped command (SIGSTOP here; in a shell, reading the terminal from
    # the background) kept the forwarded SIGTERM pending: pathlock waited
    # with the lock held until someone continued the command.
    first, pid, _ = _start_holder(spawn, database_url, customer_id, grandchild, "stay")
    command = int(Path("/proc", str(pid), "stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(command, signal.SIGSTOP)

    first.process.send_signal(signal.SIGTERM)
    assert first.finish() == 128 + signal.SIGTERM, first.stderr
    assert not _exists(pid)


def test_lost_lease_stops_the_grandchild(
    database_url: str, customer_id: int, grandchild: Path, spawn: Callable[..., Running]
) -> None:
    first, pid, lease_id = _start_holder(
        spawn, database_url, customer_id, grandchild, "stay", "--ttl", "1.5"
    )
    released = pathlock("release", "--database-url", database_url, lease_id)
    assert released.returncode == 0, released.stderr

    assert first.finish() == 122, first.stderr
    assert f"lease {lease_id} lost" in first.stderr
    assert not _exists(pid)


def test_sigkill_of_pathlock_stops_the_grandchild(
    database_url: str, customer_id: int, grandchild: Path, spawn: Callable[..., Running]
) -> None:
    first, pid, _ = _start_holder(spawn, database_url, customer_id, grandchild, "stay")
    first.process.kill()  # pathlock alone: its process, not its group
    first.process.wait()
    _wait_until(lambda: not _exists(pid), "end of the grandchild", first)


@pytest.mark.parametrize("mode", ["exit", "escape"], ids=["same-group", "own-session"])
def test_processes_left_behind_are_stopped_before_pathlock_exits(
    database_url: str,
    customer_id: int,
    grandchild: Path,
    spawn: Callable[..., Running],
    mode: str,
) -> None:
    # With own-session the grandchild left the command's process group and
    # session, as a daemon does; it is stopped all the same (a subreaper catches it).
    first, pid, _ = _start_holder(spawn, database_url, customer_id, grandchild, mode)
    second, seen = _start_second(spawn, database_url, customer_id, grandchild)

    assert first.finish() == 0, first.stderr
    assert not _exists(pid)
    assert "exited but left processes running; stopping them" in first.stderr
    assert second.finish() == 0, second.stderr
    assert seen.read_text() == "gone"


def _strace_works() -> bool:
    """Whether strace is installed and may trace here (containers may forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    probe = ["strace", "-f", "-o", os.devnull, "-e", "inject=waitid:delay_enter=1", "true"]
    return subprocess.run(probe, capture_output=True, timeout=WAIT, check=False).returncode == 0


@pytest.mark.skipif(not _strace_works(), reason="needs strace, allowed to trace")
def test_a_command_exiting_while_its_children_are_counted_leaves_none_behind(
    database_url: str, customer_id: int, grandchild: Path, spawn: Callable[..., Running]
) -> None:
    # The helper looked at its children, then saw the command's exit, and took
    # the grandchild (handed to it in between) for nothing left. strace makes
    # that moment last: each check for the command's exit starts 1 s late.
    delayed = ["strace", "-f", "-o", os.devnull, "-e", "trace=waitid",
               "-e", "inject=waitid:delay_enter=1000000"]  # fmt: skip
    first, pid, _ = _start_holder(
        spawn, database_url, customer_id, grandchild, "exit", wrapper=delayed
    )
    second, seen = _start_second(spawn, database_url, customer_id, grandchild)

    assert second.finish() == 0, second.stderr
    assert seen.read_text() == "gone", first.stderr
    assert first.finish() == 0, first.stderr
    assert not _exists(pid)


# Runs its arguments with SIGCHLD ignored, as some parents leave it for their children.
SIGCHLD_IGNORED = """
import os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_processes_left_behind_are_stopped_also_with_sigchld_ignored(
    database_url: str, customer_id: int, grandchild: Path, spawn: Callable[..., Running]
) -> None:
    # With SIGCHLD ignored, the kernel reaped the command at once, and the
    # helper, which never saw it exit, waited for it forever with the lock held.
    first, pid, _ = _start_holder(
        spawn, database_url, customer_id, grandchild, "exit", wrapper=python(SIGCHLD_IGNORED)
    )
    assert first.finish() == 0, first.stderr
    assert not _exists(pid)


# -- the terminal ------------------------------------------------------------------------

# The command in a terminal: says whether its process group has the
# terminal's foreground, reads two lines (a background group would be stopped
# by SIGTTIN here), then waits for Ctrl-C.
INTERACTIVE = """
import os, time
print("foreground", os.tcgetpgrp(0) == os.getpgrp() == os.getpid(), flush=True)
print("read", input(), flush=True)
print("read", input(), flush=True)
time.sleep(60)
"""

# After pathlock exits, in the same (non-interactive) shell: is the
# foreground back with the shell's process group, which pathlock shared?
FOREGROUND_BACK = "import os; print('back', os.tcgetpgrp(0) == os.getpgrp(), flush=True)"


def _read_until(fd: int, pattern: str, seen: list[str]) -> None:
    """Read the terminal into ``seen`` until what it showed matches ``pattern``."""
    deadline = time.monotonic() + WAIT
    while not re.search(pattern, "".join(seen)):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            pytest.fail(f"no {pattern!r} on the terminal within {WAIT:g} s:\n{''.join(seen)}")
        try:
            seen.append(os.read(fd, 4096).decode(errors="replace"))
        except OSError:  # EIO: the terminal's last process exited
            pytest.fail(f"the terminal closed before {pattern!r}:\n{''.join(seen)}")


@contextlib.contextmanager
def _in_a_terminal(script: str) -> Iterator[int]:
    """Run ``sh -c SCRIPT`` in a new session whose controlling terminal is a
    pseudo-terminal; yield the terminal's other end. Every process left in
    the session afterwards is killed (a failed test leaves no stopped command
    holding its locks)."""
    pid, terminal = pty.fork()
    if pid == 0:  # a new session, with the terminal as its controlling terminal
        try:
            os.execv("/bin/sh", ["sh", "-c", script])  # noqa: S606 - the shell is the point
        finally:
            os._exit(127)
    try:
        yield terminal
    finally:
        for process in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                # Field 6 of stat is the session; the command name before it may hold spaces.
                if int((process / "stat").read_text().rsplit(")", 1)[1].split()[3]) == pid:
                    os.kill(int(process.name), signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(terminal)


def test_the_command_gets_the_terminal_its_ctrl_c_and_not_its_ctrl_z(
    sqlite_url: str, customer_id: int
) -> None:
    lock = [
        *PATHLOCK, "lock", "--database-url", sqlite_url, "--customer", str(customer_id),
        "/tty", "--", *python(INTERACTIVE),
    ]  # fmt: skip
    script = f"{shlex.join(lock)}; echo status=$?; {shlex.join(python(FOREGROUND_BACK))}"
    with _in_a_terminal(script) as terminal:
        seen: list[str] = []
        _read_until(terminal, r"foreground \w+\s", seen)
        os.write(terminal, b"typed\n")
        _read_until(terminal, r"read typed\s", seen)
        # Ctrl-Z does not leave the command suspended (the shell, waiting for
        # pathlock, would never resume it): it reads on.
        os.write(terminal, b"\x1a")
        time.sleep(0.3)
        os.write(terminal, b"again\n")
        _read_until(terminal, r"read again\s", seen)
        os.write(terminal, b"\x03")  # Ctrl-C
        _read_until(terminal, r"back \w+\s", seen)
    output = "".join(seen)
    assert "foreground True" in output
    assert f"status={128 + signal.SIGINT}" in output
    assert "back True" in output


# The command asks the terminal itself, as ssh and sudo ask for a password.
READS_DEV_TTY = """
with open("/dev/tty") as terminal:
    print("read", terminal.readline().strip(), flush=True)
"""


def test_the_command_gets_the_terminal_also_when_stdin_is_not_a_terminal(
    sqlite_url: str, customer_id: int
) -> None:
    # The terminal went to the command only when stdin was the terminal: with
    # stdin from elsewhere, the command stopped at its first read of /dev/tty
    # (SIGTTIN) and pathlock waited for it with the lock held.
    lock = [
        *PATHLOCK, "lock", "--database-url", sqlite_url, "--customer", str(customer_id),
        "/tty", "--", *python(READS_DEV_TTY),
    ]  # fmt: skip
    with _in_a_terminal(f"{shlex.join(lock)} </dev/null; echo status=$?") as terminal:
        seen: list[str] = []
        os.write(terminal, b"typed\n")  # waits in the terminal until read
        _read_until(terminal, r"status=\d+", seen)
    output = "".join(seen)
    assert "read typed" in output
    assert "status=0" in output


# The command reports which of SIGHUP, SIGTERM and SIGINT it finds ignored. argv: OUTFILE
IGNORED = """
import signal, sys
from pathlib import Path
stop = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
ignored = [signal.getsignal(signum) is signal.SIG_IGN for signum in stop]
Path(sys.argv[1]).write_text(" ".join(map(str, ignored)))
"""


def test_signals_ignored_when_pathlock_starts_stay_ignored_for_the_command(
    sqlite_url: str, customer_id: int, tmp_path: Path
) -> None:
    seen = tmp_path / "ignored"
    lock = [
        *PATHLOCK, "lock", "--database-url", sqlite_url, "--customer", str(customer_id),
        "/ignored", "--", *python(IGNORED, seen),
    ]  # fmt: skip
    result = subprocess.run(
        ["/bin/sh", "-c", f"trap '' HUP TERM; exec {shlex.join(lock)}"],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert seen.read_text() == "True True False"

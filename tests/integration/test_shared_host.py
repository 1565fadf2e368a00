"""Processes of different users on one host share one embedded SQLite file.

An app server runs as one user and a cron job as another: with no database
given, each would use its own file under its home and exclude nothing. The
configuration file names one file for all of them; the directory the
administrator makes for it (group-writable, set-group-ID) is all the
permissions it needs. These tests run real processes under other user ids,
so they need root (CI runs as root); elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pathlock import BackendError, PathLockManager
from pathlock._backends import CONFIG_ENV_VAR, URL_ENV_VAR

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="switching users needs root"
)

GROUP = 64_999  # the group of the shared directory (it need not have a name)
APP, CRON, STRANGER = 64_998, 64_997, 64_996  # user ids; STRANGER is not in GROUP
WAIT = 30.0


class Child:
    """A forked process running as another user: it runs ``work`` and sends
    back what it returned (or raised), pickled. ``work`` may wait for the
    parent's go-ahead with ``resume()``."""

    def __init__(self, uid: int, gid: int, work: Callable[[Callable[[], None]], object]) -> None:
        results_r, results_w = os.pipe()
        resume_r, self._resume_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the child
            status = 1
            try:
                os.close(results_r)
                os.close(self._resume_w)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                os.umask(0o022)

                def resume() -> None:
                    os.write(results_w, b"w")  # "waiting": the parent may go on
                    os.read(resume_r, 1)

                try:
                    outcome: object = ("ok", work(resume))
                except Exception as error:  # noqa: BLE001 - sent to the parent
                    outcome = ("error", error)
                data = pickle.dumps(outcome)
                os.write(results_w, b"r" + len(data).to_bytes(8, "big"))
                with os.fdopen(results_w, "wb") as stream:
                    stream.write(data)
                status = 0
            finally:
                os._exit(status)
        os.close(results_w)
        os.close(resume_r)
        self._results = os.fdopen(results_r, "rb")

    def waiting(self) -> None:
        """Until the child calls ``resume()``."""
        assert self._results.read(1) == b"w", "the child ended before it waited"

    def resume(self) -> None:
        os.write(self._resume_w, b"g")

    def result(self) -> object:
        kind = self._results.read(1)
        assert kind == b"r", f"the child sent {kind!r}"
        data = self._results.read(int.from_bytes(self._results.read(8), "big"))
        _, status = os.waitpid(self.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        outcome, value = pickle.loads(data)  # noqa: S301 - our own child's data
        if outcome == "error":
            raise value
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._resume_w)
        self._results.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


@pytest.fixture
def shared_directory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``/tmp/...`` (other users cannot reach pytest's own temporary
    directories) with a directory for the database, made as the docs say, and
    a configuration file that names a file in it."""
    top = Path(tempfile.mkdtemp(prefix="pathlock-shared-"))
    try:
        top.chmod(0o755)
        directory = top / "lib"
        directory.mkdir()
        os.chown(directory, 0, GROUP)
        directory.chmod(0o2770)
        config = top / "pathlock.toml"
        config.write_text(f'database_url = "sqlite:///{directory}/locks.sqlite3"\n')
        config.chmod(0o644)
        monkeypatch.delenv(URL_ENV_VAR, raising=False)
        monkeypatch.setenv(CONFIG_ENV_VAR, str(config))
        _warm_up(top / "warm-up.sqlite3")
        yield directory
    finally:
        shutil.rmtree(top)


def _warm_up(path: Path) -> None:
    # The children cannot read the interpreter's own directory (/root is
    # private): everything they run must be imported before they fork.
    with PathLockManager(f"sqlite:///{path}", heartbeat=False) as manager:
        manager.for_customer(1).lock_paths("/a").release()
        manager.list_locks()


def _hold(resume: Callable[[], None]) -> str:
    """As the app server: hold /Shared/a until the parent says go."""
    with PathLockManager(heartbeat=False, node_id="app") as manager:
        with manager.for_customer(7).lock_paths("/Shared/a", reason="app"):
            resume()
        return str(manager.engine.url.database)


def _try_while_held(_resume: Callable[[], None]) -> tuple[bool, list[str], bool]:
    """As the cron job, while the app server holds /Shared/a."""
    with PathLockManager(heartbeat=False, node_id="cron") as manager:
        locks = manager.for_customer(7)
        excluded = locks.try_lock_paths("/Shared/a/report") is None
        held = [info.reason for info in manager.list_locks(7)]
        with locks.lock_paths("/Shared/b"):  # the cron job writes too
            sibling = True
        return excluded, held, sibling


def _lock_after_release(_resume: Callable[[], None]) -> int:
    with (
        PathLockManager(heartbeat=False) as manager,
        manager.for_customer(7).lock_paths("/Shared/a/report") as lease,
    ):
        return lease.fencing_token


def _open(_resume: Callable[[], None]) -> None:
    PathLockManager(heartbeat=False).close()


def test_users_of_one_group_share_the_configured_file(shared_directory: Path) -> None:
    database = shared_directory / "locks.sqlite3"
    app = Child(APP, GROUP, _hold)
    try:
        app.waiting()  # it created the file, and holds /Shared/a
        cron = Child(CRON, GROUP, _try_while_held)
        try:
            assert cron.result() == (True, ["app"], True)
        finally:
            cron.close()
        # root (an operator, or a cron job of root's) sees the same locks.
        with PathLockManager(heartbeat=False) as manager:
            assert [info.owner.node_id for info in manager.list_locks(7)] == ["app"]
        app.resume()
        assert app.result() == str(database)
    finally:
        app.close()
    after = Child(CRON, GROUP, _lock_after_release)
    try:
        assert isinstance(after.result(), int)
    finally:
        after.close()
    # Made by the app server's user, in the directory's group, writable by it
    # whatever the umask (022 here); SQLite's own files follow the database's.
    info = database.stat()
    assert (info.st_uid, info.st_gid) == (APP, GROUP)
    assert stat.S_IMODE(info.st_mode) == 0o664
    for suffix in ("-wal", "-shm"):
        extra = database.with_name(database.name + suffix)
        if extra.exists():
            assert stat.S_IMODE(extra.stat().st_mode) & 0o060 == 0o060


def test_a_user_who_cannot_write_the_file_is_told_what_to_fix(shared_directory: Path) -> None:
    creator = Child(APP, GROUP, _open)
    try:
        creator.result()
    finally:
        creator.close()
    database = shared_directory / "locks.sqlite3"
    # Outside the group: cannot even reach the file.
    stranger = Child(STRANGER, STRANGER, _open)
    try:
        with pytest.raises(
            BackendError, match=r"user (uid )?\S+ cannot write .*locks\.sqlite3"
        ) as caught:
            stranger.result()
    finally:
        stranger.close()
    assert "Several users, one host" in str(caught.value)
    # In the group, but the file was made read-only for it (a umask applied
    # by hand, say): SQLite would open it read-only and fail at the first lock.
    database.chmod(0o644)
    cron = Child(CRON, GROUP, _open)
    try:
        with pytest.raises(BackendError, match=r"user (uid )?\S+ cannot write .*locks\.sqlite3"):
            cron.result()
    finally:
        cron.close()


def test_a_file_in_a_private_directory_stays_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The group bit is only added where the directory is meant to be shared.
    monkeypatch.delenv(URL_ENV_VAR, raising=False)
    directory = tmp_path / "own"
    directory.mkdir(mode=0o755)
    previous = os.umask(0o022)
    try:
        PathLockManager(f"sqlite:///{directory / 'locks.sqlite3'}", heartbeat=False).close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((directory / "locks.sqlite3").stat().st_mode) == 0o644

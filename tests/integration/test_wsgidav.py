"""pathlock as WsgiDAV's lock storage (``pathlock.wsgidav``): WebDAV locks
shared by every worker.

In process, two WsgiDAV lock managers over two storages stand for two
workers; over HTTP, WsgiDAV runs under gunicorn with two workers and is
driven by litmus (``apt-get install litmus``) and by the checks that found
WsgiDAV's own storage wanting: two simultaneous exclusive LOCKs of one file,
a lock kept across a worker recycle, a lock kept alive by refreshes while a
rival keeps asking."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("wsgidav")

from wsgidav.dav_error import HTTP_LOCKED, DAVError
from wsgidav.lock_man.lock_manager import LockManager

from pathlock import PathLockManager
from pathlock.wsgidav import LOCK_TIME_OUT_MAX, LockStorage

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
HANG = 60.0  # seconds: only reached when something is broken

_OWNER = b"<?xml version='1.0' encoding='UTF-8'?>\n<owner xmlns=\"DAV:\">pathlock test</owner>\n"


def _at_once(calls: list[Callable[[], T]]) -> list[T]:
    """What each of ``calls`` returned, all made at once, each in a thread."""
    barrier = threading.Barrier(len(calls))
    results: list[T] = []

    def call(function: Callable[[], T]) -> None:
        barrier.wait(HANG)
        results.append(function())

    threads = [threading.Thread(target=call, args=(function,)) for function in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
    return results


def _created(storage: LockStorage, path: str) -> object:
    """The token of an exclusive lock created on ``path``, or the HTTP status
    it was refused with."""
    lock = {
        "type": "write",
        "scope": "exclusive",
        "depth": "infinity",
        "owner": _OWNER,
        "timeout": 60,
        "principal": "p",
    }
    try:
        return storage.create(path, lock)["token"]
    except DAVError as error:
        return error.value


def _acquire(manager: LockManager, url: str, scope: str = "exclusive", **options: Any) -> Any:
    settings = {
        "lock_type": "write",
        "lock_scope": scope,
        "lock_depth": "infinity",
        "lock_owner": _OWNER,
        "timeout": 60,
        "principal": "kpatel",
        "token_list": [],
    }
    return manager.acquire(url=url, **(settings | options))


@pytest.fixture
def workers(database_url: str, customer_id: int) -> Iterator[tuple[LockManager, LockManager]]:
    """Two workers' WsgiDAV lock managers, each over a storage of its own."""
    storages = [LockStorage(database_url, customer_id=customer_id) for _ in range(2)]
    managers = (LockManager(storages[0]), LockManager(storages[1]))
    yield managers
    for storage in storages:
        storage.close()


def test_a_lock_of_one_worker_is_every_workers(
    workers: tuple[LockManager, LockManager],
) -> None:
    first, second = workers
    lock = _acquire(first, "/docs/report.docx")
    token = lock["token"]
    assert token.startswith("opaquelocktoken:pathlock-")
    with pytest.raises(DAVError) as refused:
        _acquire(second, "/docs/report.docx")
    assert refused.value.value == HTTP_LOCKED
    with pytest.raises(DAVError):
        _acquire(second, "/docs", lock_depth="infinity")  # a folder above it
    seen = second.get_lock(token)
    assert seen is not None
    assert seen["owner"] == _OWNER
    assert (seen["root"], seen["scope"], seen["depth"], seen["principal"]) == (
        "/docs/report.docx",
        "exclusive",
        "infinity",
        "kpatel",
    )
    assert 0 < seen["timeout"] <= 60
    assert [found["token"] for found in second.get_url_lock_list("/docs/report.docx")] == [token]
    assert second.get_url_lock_list("/docs", recursive=True)[0]["token"] == token
    assert second.get_url_lock_list("/docs") == []
    assert [found["token"] for found in second.get_indirect_url_lock_list("/docs/report.docx")] == [
        token
    ]
    refreshed = second.refresh(token, timeout=3600)
    assert 3500 < refreshed["timeout"] <= 3600
    second.release(token)
    assert first.get_lock(token) is None
    assert _acquire(second, "/docs/report.docx")["token"] != token


def test_shared_locks_share_and_exclude_the_exclusive(
    workers: tuple[LockManager, LockManager],
) -> None:
    first, second = workers
    one = _acquire(first, "/shared.txt", "shared")
    two = _acquire(second, "/shared.txt", "shared")
    with pytest.raises(DAVError):
        _acquire(first, "/shared.txt")
    assert {lock["token"] for lock in first.get_url_lock_list("/shared.txt")} == {
        one["token"],
        two["token"],
    }
    first.release(one["token"])
    second.release(two["token"])


def test_a_depth_0_lock_of_a_folder_leaves_its_members_free(
    workers: tuple[LockManager, LockManager], database_url: str, customer_id: int
) -> None:
    first, second = workers
    folder = _acquire(first, "/folder", lock_depth="0")
    assert second.get_lock(folder["token"])["depth"] == "0"
    # A member of the folder: free, from the other worker too.
    member = _acquire(second, "/folder/member.txt")
    # The folder itself, or its subtree: refused.
    with pytest.raises(DAVError) as refused:
        _acquire(second, "/folder", lock_depth="0")
    assert refused.value.value == HTTP_LOCKED
    with pytest.raises(DAVError):
        _acquire(second, "/", lock_depth="infinity")
    # pathlock holds it at depth 0: an application's own lock below is free.
    with PathLockManager(database_url, heartbeat=False) as manager:
        locks = manager.for_customer(customer_id)
        (held,) = [lock for lock in locks.locks_on("/folder") if lock.path == "/folder"]
        assert held.shallow
        below = locks.try_lock_paths("/folder/other.txt")
        assert below is not None
        below.release()
    second.release(member["token"])
    first.release(folder["token"])


def test_the_database_refuses_what_each_workers_own_check_let_through(
    database_url: str, customer_id: int
) -> None:
    """Both workers' checks pass before either creates its lock (each checks
    only what it sees): the storage's create, one transaction of the
    database, grants one and refuses the other, every round."""
    storages = [LockStorage(database_url, customer_id=customer_id) for _ in range(2)]
    try:
        for round_ in range(20):
            outcomes = _at_once(
                [partial(_created, storage, f"/race/{round_}") for storage in storages]
            )
            assert outcomes.count(HTTP_LOCKED) == 1, outcomes
            (token,) = [outcome for outcome in outcomes if outcome != HTTP_LOCKED]
            assert storages[1].delete(str(token))
    finally:
        for storage in storages:
            storage.close()


def test_a_lock_ends_at_its_timeout_and_malformed_ones_are_refused(
    workers: tuple[LockManager, LockManager],
) -> None:
    first, second = workers
    lock = _acquire(first, "/brief", timeout=1)
    assert second.get_lock(lock["token"]) is not None
    time.sleep(1.5)  # by the database's clock too
    assert second.get_lock(lock["token"]) is None
    assert second.get_url_lock_list("/brief") == []
    assert _acquire(second, "/brief")["token"] != lock["token"]
    for bad in ({"lock_scope": "exclusiveX"}, {"lock_depth": "1"}, {"lock_owner": "text"}):
        with pytest.raises(AssertionError):
            first._generate_lock(  # skips the manager's own checks
                "p",
                "write",
                bad.get("lock_scope", "exclusive"),
                bad.get("lock_depth", "infinity"),
                bad.get("lock_owner", _OWNER),
                "/malformed",
                60,
            )
    assert first.get_url_lock_list("/malformed") == []


def test_tokens_of_other_storages_and_gone_locks(
    workers: tuple[LockManager, LockManager],
) -> None:
    first, _ = workers
    storage = first.storage
    assert storage.get("opaquelocktoken:0x1d7b86") is None
    assert storage.delete("opaquelocktoken:0x1d7b86") is False
    with pytest.raises(ValueError, match="no such lock"):
        storage.refresh("opaquelocktoken:pathlock-1-" + "0" * 32, timeout=60)
    lock = _acquire(first, "/gone", timeout=-1)  # infinite: capped
    assert lock["timeout"] == LOCK_TIME_OUT_MAX
    first.release(lock["token"])
    assert storage.delete(lock["token"]) is False
    assert storage.get(lock["token"]) is None
    with pytest.raises(ValueError, match="no such lock"):
        storage.refresh(lock["token"], timeout=60)
    with pytest.raises(DAVError):
        _acquire(first, "/a/../b")  # a path pathlock refuses
    assert (
        storage.get_lock_list("/a/../b", include_root=True, include_children=True, token_only=False)
        == []
    )


def test_customers_keep_their_locks_apart(database_url: str, customer_id: int) -> None:
    """Each share its own customer: the same path in two shares is two
    resources."""
    storage = LockStorage(
        database_url, customer_for=lambda path: customer_id + int(path.startswith("/b/"))
    )
    try:
        manager = LockManager(storage)
        one = _acquire(manager, "/a/x")
        two = _acquire(manager, "/b/x")
        assert one["token"].split("-")[1] != two["token"].split("-")[1]
        for lock in (one, two):
            manager.release(lock["token"])
    finally:
        storage.close()


def test_a_manager_given_is_not_closed(database_url: str, customer_id: int) -> None:
    with PathLockManager(database_url, heartbeat=False) as manager:
        storage = LockStorage(manager, customer_id=customer_id)
        storage.close()
        assert manager.for_customer(customer_id).list_locks() == []
        with pytest.raises(TypeError, match="node_id"):
            LockStorage(manager, node_id="x")


# -- over HTTP, under gunicorn --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def server(
    tmp_path: Path, mariadb_url: str, customer_id: int
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """WsgiDAV over pathlock under gunicorn, 2 sync workers, on 127.0.0.1."""
    if shutil.which("gunicorn") is None and not (Path(sys.executable).parent / "gunicorn").exists():
        pytest.skip("gunicorn is not installed")
    root = tmp_path / "dav"
    root.mkdir()
    port = _free_port()
    environment = os.environ | {
        "PATHLOCK_DAV_ROOT": str(root),
        "PATHLOCK_DAV_DATABASE": mariadb_url,
        "PATHLOCK_DAV_CUSTOMER": str(customer_id),
        "PYTHONPATH": str(ROOT),
    }
    process = subprocess.Popen(
        [
            sys.executable, "-m", "gunicorn", "-w", "2", "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "5", "tests.integration.webdav_app:app",
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("gunicorn did not start")
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(HANG)


def _request(
    address: str, method: str, path: str, body: bytes = b"", **headers: str
) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(address, timeout=HANG)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


_LOCK_BODY = (
    b'<?xml version="1.0" encoding="utf-8"?><D:lockinfo xmlns:D="DAV:">'
    b"<D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype>"
    b"<D:owner>test</D:owner></D:lockinfo>"
)


def _lock(address: str, path: str, timeout: str = "Second-60") -> tuple[int, str]:
    response = _request(address, "LOCK", path, _LOCK_BODY, Timeout=timeout, Depth="0")
    return response.status, response.getheader("Lock-Token", "").strip("<>")


def test_two_simultaneous_exclusive_locks_are_never_both_granted(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    address, _ = server
    for round_ in range(20):
        path = f"/race{round_}.txt"
        assert _request(address, "PUT", path, b"x").status in (201, 204)
        outcomes = _at_once([partial(_lock, address, path)] * 2)
        statuses = sorted(status for status, _ in outcomes)
        assert statuses == [200, 423], outcomes


def test_a_lock_outlives_a_worker_recycle(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    address, process = server
    assert _request(address, "PUT", "/kept.txt", b"x").status in (201, 204)
    status, token = _lock(address, "/kept.txt")
    assert status == 200
    process.send_signal(signal.SIGHUP)  # gunicorn replaces every worker
    time.sleep(3)
    assert _lock(address, "/kept.txt")[0] == 423
    assert _request(address, "PUT", "/kept.txt", b"y").status == 423  # no token: refused
    unlocked = _request(address, "UNLOCK", "/kept.txt", **{"Lock-Token": f"<{token}>"})
    assert unlocked.status == 204
    assert _lock(address, "/kept.txt")[0] == 200


def test_refreshes_keep_a_lock_past_its_first_timeout(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    address, _ = server
    assert _request(address, "PUT", "/refreshed.txt", b"x").status in (201, 204)
    status, token = _lock(address, "/refreshed.txt", "Second-2")
    assert status == 200
    ends = time.monotonic() + 5  # well past its first 2 seconds
    while time.monotonic() < ends:
        refreshed = _request(
            address, "LOCK", "/refreshed.txt", If=f"(<{token}>)", Timeout="Second-2"
        )
        assert refreshed.status == 200
        assert _lock(address, "/refreshed.txt")[0] == 423  # the rival keeps asking
        time.sleep(0.5)
    unlocked = _request(address, "UNLOCK", "/refreshed.txt", **{"Lock-Token": f"<{token}>"})
    assert unlocked.status == 204


@pytest.mark.skipif(shutil.which("litmus") is None, reason="litmus is not installed")
def test_litmus_passes_against_two_workers(
    server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    address, _ = server
    done = subprocess.run(
        ["litmus", "--keep-going", f"http://{address}/"],
        env=os.environ | {"TESTS": "basic copymove locks"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summaries = re.findall(r"<- summary for `(\w+)': of (\d+) tests run: (\d+) passed", done.stdout)
    assert [name for name, _, _ in summaries] == ["basic", "copymove", "locks"], done.stdout
    for name, run, passed in summaries:
        assert run == passed, f"{name}: {passed} of {run} passed\n{done.stdout}"

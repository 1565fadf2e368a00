"""WsgiDAV's own tests of a lock storage, run against pathlock's.

Ported from WsgiDAV 4.3.3's ``tests/test_lock_manager.py`` (``BasicTest``,
which its maintainers run against each storage they ship: a dictionary, a
shelve file and Redis), (c) 2009-2024 Martin Wendt and contributors, MIT
license. Its cases are kept as they were, assertion by assertion (the checks of a
lock as created and as found by its token in one loop), with the
storage replaced by :class:`pathlock.wsgidav.LockStorage` over the real
database, one customer per test; the depth-0 cases at the end are ours.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("wsgidav")

from wsgidav.dav_error import DAVError
from wsgidav.lock_man.lock_manager import LockManager

from pathlock.wsgidav import LockStorage

PRINCIPAL = "Joe Tester"
OWNER = b"joe.tester@example.com"
ROOT = "/dav/res"
TIMEOUT = 10 * 60


@pytest.fixture
def lm(database_url: str, customer_id: int) -> Iterator[LockManager]:
    storage = LockStorage(database_url, customer_id=customer_id)
    yield LockManager(storage)
    storage.close()


def _acquire(lm: LockManager, url: str, depth: str, principal: str, tokens: list[str]) -> Any:
    """``lm.acquire``, with ``None`` instead of a raised DAVError."""
    try:
        return lm.acquire(
            url=url,
            lock_type="write",
            lock_scope="exclusive",
            lock_depth=depth,
            lock_owner=OWNER,
            timeout=TIMEOUT,
            principal=principal,
            token_list=tokens,
        )
    except DAVError:
        return None


@pytest.mark.parametrize(
    ("lock_type", "scope", "depth", "owner", "root"),
    [
        ("writeX", "exclusive", "infinity", OWNER, ROOT),
        ("write", "exclusiveX", "infinity", OWNER, ROOT),
        ("write", "exclusive", "infinityX", OWNER, ROOT),
        ("write", "exclusive", "infinity", None, ROOT),
        ("write", "exclusive", "infinity", OWNER, None),
    ],
)
def test_validation(
    lm: LockManager, lock_type: str, scope: str, depth: str, owner: Any, root: Any
) -> None:
    """Lock manager should raise errors on bad args."""
    with pytest.raises(AssertionError):
        lm._generate_lock(lm, lock_type, scope, depth, owner, root, TIMEOUT)


def test_lock(lm: LockManager) -> None:
    """Lock manager should create and find locks."""
    url = "/dav/res"
    created = lm._generate_lock(PRINCIPAL, "write", "exclusive", "infinity", OWNER, url, TIMEOUT)
    tok = created.get("token")
    assert lm.get_lock(tok, key="root") == url
    # The lock as created, and as found by its token.
    for lock_dict in (created, lm.get_lock(tok)):
        assert lock_dict is not None
        assert lock_dict["root"] == url
        assert lock_dict["type"] == "write"
        assert lock_dict["scope"] == "exclusive"
        assert lock_dict["depth"] == "infinity"
        assert lock_dict["owner"] == OWNER
        assert lock_dict["principal"] == PRINCIPAL

    assert lm.is_token_locked_by_user(tok, PRINCIPAL)
    assert len(lm.get_url_lock_list(url)) == 1
    assert lm.is_url_locked_by_token("/dav/res", tok), "url not directly locked by lock_token."
    assert lm.is_url_locked_by_token("/dav/res/", tok), "url not directly locked by lock_token."
    assert lm.is_url_locked_by_token("/dav/res/sub", tok), "child url not indirectly locked"
    assert not lm.is_url_locked_by_token("/dav/ressub", tok), "non-child url reported as locked"
    assert not lm.is_url_locked_by_token("/dav", tok), "parent url reported as locked"
    assert not lm.is_url_locked_by_token("/dav/", tok), "parent url reported as locked"


def test_timeout(lm: LockManager) -> None:
    """Locks should be purged after expiration date."""
    timeout = 1
    lock_dict = lm._generate_lock(PRINCIPAL, "write", "exclusive", "infinity", OWNER, ROOT, timeout)
    assert lock_dict is not None
    tok = lock_dict.get("token")
    assert lm.get_lock(tok, key="root") == ROOT
    time.sleep(timeout - 0.5)
    assert lm.get_lock(tok) is not None, "Lock expired too early"
    time.sleep(1)
    assert lm.get_lock(tok) is None, "Lock has not expired"


def test_conflict(lm: LockManager) -> None:
    """Locks should prevent conflicts."""
    tokens: list[str] = []
    assert _acquire(lm, "/dav/res/", "infinity", PRINCIPAL, tokens), "Could not acquire lock"
    assert _acquire(lm, "/dav/res", "infinity", "another principal", tokens) is None
    assert _acquire(lm, "/dav/res/", "infinity", "another principal", tokens) is None
    assert _acquire(lm, "/dav/res/sub", "infinity", "another principal", tokens) is None
    assert _acquire(lm, "/dav/", "infinity", PRINCIPAL, tokens) is None
    assert _acquire(lm, "/dav/res/sub", "infinity", PRINCIPAL, tokens) is None


def test_depth_0_conflicts_as_webdav_says(lm: LockManager) -> None:
    """Not WsgiDAV's: a depth-0 lock of a collection leaves its members free,
    and is refused under a depth-infinity lock of its parent."""
    tokens: list[str] = []
    folder = _acquire(lm, "/dav/col/", "0", PRINCIPAL, tokens)
    assert folder is not None
    assert folder["depth"] == "0"
    assert _acquire(lm, "/dav/col/member", "infinity", "another principal", tokens)
    assert _acquire(lm, "/dav/col", "0", "another principal", tokens) is None
    assert _acquire(lm, "/dav", "infinity", "another principal", tokens) is None
    assert [lock["token"] for lock in lm.get_indirect_url_lock_list("/dav/col")] == [
        folder["token"]
    ]
    assert lm.get_indirect_url_lock_list("/dav/col/other") == []
    lm.release(folder["token"])
    parent = _acquire(lm, "/dav/", "infinity", PRINCIPAL, tokens)
    assert parent is None  # /dav/col/member is below it

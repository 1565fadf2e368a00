"""pathlock as the lock storage of WsgiDAV 4: WebDAV locks shared by every
worker of every server, checked and granted by the database.

WsgiDAV keeps its locks in the memory of one process and checks conflicts
under a lock of that process: with several workers (gunicorn, several
hosts), two clients can both be granted an exclusive lock of one file, and a
lock is gone when its worker is recycled. Its lock manager cannot be
replaced, only its storage (``lock_storage`` in its configuration); this is
one over pathlock::

    from pathlock.wsgidav import LockStorage
    from wsgidav.wsgidav_app import WsgiDAVApp

    app = WsgiDAVApp({
        "provider_mapping": {"/": "/srv/dav"},
        "lock_storage": LockStorage("mysql+pymysql://dav@db/dav", node_id="web-1"),
        ...
    })

Each WebDAV lock is a detached lease of pathlock
(:meth:`~pathlock.CustomerLocks.lock_detached`) on the lock's root, exclusive
or shared as the lock's scope, at the lock's depth (``0``: the root alone,
``shallow=``; ``infinity``: its subtree), lasting the lock's timeout by the
database's clock: granted with the conflict check in one transaction (:meth:`create`
refuses a conflicting lock with ``423 Locked`` even when WsgiDAV's own check,
made per process, let it through), refreshed atomically, released by any
worker, and kept through a worker's recycle and restart. The rest of the
lock (owner, principal, depth, timeout) is the lease's data. Tokens are
``opaquelocktoken:pathlock-<customer>-<lease id>``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

from wsgidav.dav_error import (
    HTTP_BAD_REQUEST,
    HTTP_LOCKED,
    DAVError,
    DAVErrorCondition,
    PRECONDITION_CODE_LockConflict,
)
from wsgidav.lock_man.lock_manager import validate_lock

from pathlock.customer import CustomerLocks
from pathlock.errors import InvalidPath, LeaseLost
from pathlock.manager import PathLockManager
from pathlock.paths import normalize
from pathlock.types import LeaseInfo

LOCK_TIME_OUT_DEFAULT = 604800
"""Seconds a lock lasts when its request names no timeout: a week, as
WsgiDAV's own storages."""
LOCK_TIME_OUT_MAX = 4 * 604800
"""The longest a lock lasts, and what an infinite timeout becomes: four
weeks, as WsgiDAV's own storages."""

_TOKEN = re.compile(r"opaquelocktoken:pathlock-(\d+)-([0-9a-f]{32})")
_FIELDS = ("root", "type", "scope", "depth", "principal")
_VERSION = 1  # of the lock's data


class LockStorage:
    """A WsgiDAV lock storage over pathlock.

    ``url_or_manager``: a :class:`~pathlock.PathLockManager`, used as it is
    (and not closed), or the database to open one on (a URL, or ``None``
    for pathlock's default database), closed by :meth:`close`; ``options``
    go to that manager (``node_id``, ``settings``, ...).

    ``customer_for(path)`` says whose locks a resource's are (a share, a
    user): locks of different customers never meet. By default every path is
    ``customer_id``'s.
    """

    def __init__(
        self,
        url_or_manager: PathLockManager | str | None = None,
        *,
        customer_id: int = 0,
        customer_for: Callable[[str], int] | None = None,
        **options: Any,
    ) -> None:
        if isinstance(url_or_manager, PathLockManager):
            if options:
                raise TypeError(
                    "manager options are for a manager the storage opens, not one given: "
                    + ", ".join(sorted(options))
                )
            self.manager = url_or_manager
            self._owned = False
        else:
            self.manager = PathLockManager(url_or_manager, **options)
            self._owned = True
        self._customer_id = customer_id
        self._customer_for = customer_for

    def __repr__(self) -> str:
        return f"LockStorage({self.manager!r})"

    # -- WsgiDAV's storage interface ---------------------------------------------

    def open(self) -> None:
        """Called by WsgiDAV's lock manager before first use: nothing to do."""

    def close(self) -> None:
        """Called by WsgiDAV on shutdown: closes the manager the storage
        opened (its locks stay: they are the clients')."""
        if self._owned:
            self.manager.close()

    def cleanup(self) -> None:
        """Delete expired locks' rows (they block nobody already)."""
        self.manager.reap_expired()

    def clear(self) -> None:
        """Not offered: it would delete every client's locks."""
        raise NotImplementedError("LockStorage.clear(): release locks one by one")

    def get(self, token: str) -> dict[str, Any] | None:
        """The lock of ``token``, or ``None`` if it does not exist or expired."""
        found = self._lease(token)
        if found is None:
            return None
        locks, lease_id = found
        return _lock(locks.customer_id, locks.get_lease(lease_id))

    def create(self, path: str, lock: dict[str, Any]) -> dict[str, Any]:
        """Grant ``lock`` (a lock dictionary without token) on ``path``, or
        raise ``423 Locked`` if a lock in the way is held: the check and the
        grant are one transaction of the database. Adds ``root``,
        ``timeout`` (capped), ``expire`` and ``token`` to ``lock``."""
        root = "/" + str(path).strip("/")
        timeout = _capped(lock.get("timeout"))
        # As WsgiDAV's own storages: AssertionError for a malformed lock.
        validate_lock(lock | {"root": root, "timeout": timeout})
        owner = lock.get("owner", b"")
        data = {
            "v": _VERSION,
            **{name: lock.get(name) for name in _FIELDS},
            "root": root,
            "owner": owner.decode("latin-1") if isinstance(owner, bytes) else str(owner),
        }
        locks = self._locks(root)
        exclusive = lock.get("scope") != "shared"
        infinite = lock.get("depth") != "0"
        try:
            lease = locks.try_lock_detached(
                *([root] if exclusive else []),
                shared=[] if exclusive else [root],
                shallow=[] if infinite else [root],
                ttl=timeout,
                reason=f"WebDAV lock of {lock.get('principal') or 'anonymous'}",
                data=json.dumps(data).encode(),
            )
        except InvalidPath as error:
            raise DAVError(HTTP_BAD_REQUEST, context_info=str(error)) from error
        if lease is None:
            conflict = DAVErrorCondition(PRECONDITION_CODE_LockConflict)
            for held in locks.locks_on(root, descendants=infinite):
                conflict.add_href(held.path)
            raise DAVError(HTTP_LOCKED, err_condition=conflict)
        lock.update(
            root=root,
            timeout=timeout,
            expire=time.time() + timeout,
            token=_token(locks.customer_id, lease.lease_id),
        )
        return lock

    def refresh(self, token: str, *, timeout: float) -> dict[str, Any]:
        """Make the lock of ``token`` last ``timeout`` seconds (capped) from
        now; raises ``ValueError`` if it no longer exists (as WsgiDAV's own
        storages)."""
        found = self._lease(token)
        if found is None:
            raise ValueError(f"no such lock: {token}")
        locks, lease_id = found
        try:
            renewed = locks.renew_detached(lease_id, ttl=_capped(timeout))
        except LeaseLost as error:
            raise ValueError(f"no such lock: {token}") from error
        refreshed = _lock(locks.customer_id, renewed)
        if refreshed is None:  # pragma: no cover - a renewed lease is live
            raise ValueError(f"no such lock: {token}")
        return refreshed

    def delete(self, token: str) -> bool:
        """Release the lock of ``token``; ``False`` if it did not exist or
        had expired."""
        found = self._lease(token)
        if found is None:
            return False
        locks, lease_id = found
        return locks.release_detached(lease_id) > 0

    def get_lock_list(
        self, path: str, *, include_root: bool, include_children: bool, token_only: bool
    ) -> list[Any]:
        """The live locks on ``path`` (``include_root``) and below it
        (``include_children``): their dictionaries, or their tokens
        (``token_only``). One indexed query, and one read per lock found."""
        root = "/" + str(path).strip("/")
        locks = self._locks(root)
        try:
            rows = locks.locks_on(root, ancestors=False, descendants=include_children)
            at = normalize(root, case_insensitive=self.manager.case_insensitive)
        except InvalidPath:
            return []  # no lock can be held on a path pathlock refuses
        found: list[Any] = []
        for row in rows:
            if not row.owner.detached or (row.path == at and not include_root):
                continue  # not a WebDAV lock (a lease of the application's own)
            token = _token(locks.customer_id, row.lease_id)
            if token_only:
                found.append(token)
                continue
            lock = _lock(locks.customer_id, locks.get_lease(row.lease_id))
            if lock is not None:
                found.append(lock)
        return found

    # -- helpers -----------------------------------------------------------------------

    def _locks(self, path: str) -> CustomerLocks:
        customer = self._customer_id if self._customer_for is None else self._customer_for(path)
        return self.manager.for_customer(customer)

    def _lease(self, token: str) -> tuple[CustomerLocks, str] | None:
        """The customer and lease id of one of this storage's tokens."""
        matched = _TOKEN.fullmatch(str(token))
        if matched is None:
            return None
        return self.manager.for_customer(int(matched[1])), matched[2]


def _token(customer_id: int, lease_id: str) -> str:
    return f"opaquelocktoken:pathlock-{customer_id}-{lease_id}"


def _capped(timeout: object) -> float:
    """A lock's lifetime: WsgiDAV's default for none, its maximum for an
    infinite (negative) or longer one."""
    if timeout is None:
        return float(LOCK_TIME_OUT_DEFAULT)
    seconds = float(timeout)  # type: ignore[arg-type]
    if seconds < 0 or seconds > LOCK_TIME_OUT_MAX:
        return float(LOCK_TIME_OUT_MAX)
    return max(seconds, 1.0)


def _lock(customer_id: int, lease: LeaseInfo | None) -> dict[str, Any] | None:
    """The lock dictionary of ``lease``, if it is a lock of this storage."""
    if lease is None or not lease.detached or not isinstance(lease.data, bytes):
        return None
    try:
        data = json.loads(lease.data)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        return None
    expire = lease.expires_at.timestamp()
    return {
        **{name: data.get(name) for name in _FIELDS},
        "owner": str(data.get("owner", "")).encode("latin-1"),
        # What is left of it, as WsgiDAV reports a lock's timeout.
        "timeout": max(1, math.ceil(expire - time.time())),
        "expire": expire,
        "token": _token(customer_id, lease.lease_id),
    }

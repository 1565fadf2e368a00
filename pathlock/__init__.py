"""pathlock: hierarchical, all-or-nothing path locks shared by many app servers
through the MySQL/MariaDB database they already trust.

    manager = PathLockManager("mysql+pymysql://root@127.0.0.1/test", node_id="web-1")
    locks = manager.for_customer(42)
    with locks.lock_paths("/Shared/source", "/Shared/target", reason="move") as lease:
        ...  # nobody else edits those folders, their parents or anything inside them
"""

from pathlock.aio import AsyncCustomerLocks, AsyncLease, AsyncPathLockManager
from pathlock.customer import CustomerLocks
from pathlock.errors import (
    ArgumentTypeError,
    BackendError,
    CaseRuleMismatch,
    ContentionTimeout,
    DatabaseTimeout,
    DeadlockDetected,
    InvalidArgument,
    InvalidPath,
    InvalidPathType,
    LeaseLost,
    LockCancelled,
    LockTimeout,
    ManagerClosed,
    PathLockError,
    RequestTooLarge,
    SchemaMismatch,
)
from pathlock.events import Hooks
from pathlock.lease import Lease
from pathlock.manager import PathLockManager
from pathlock.settings import Settings
from pathlock.types import Cancel, DetachedLease, LeaseInfo, LockInfo, Mode, Owner, WaiterInfo
from pathlock.waiting import ExponentialBackoff, ReverseExponentialBackoff, WaitPolicy

__all__ = [
    "ArgumentTypeError",
    "AsyncCustomerLocks",
    "AsyncLease",
    "AsyncPathLockManager",
    "BackendError",
    "Cancel",
    "CaseRuleMismatch",
    "ContentionTimeout",
    "CustomerLocks",
    "DatabaseTimeout",
    "DeadlockDetected",
    "DetachedLease",
    "ExponentialBackoff",
    "Hooks",
    "InvalidArgument",
    "InvalidPath",
    "InvalidPathType",
    "Lease",
    "LeaseInfo",
    "LeaseLost",
    "LockCancelled",
    "LockInfo",
    "LockTimeout",
    "ManagerClosed",
    "Mode",
    "Owner",
    "PathLockError",
    "PathLockManager",
    "RequestTooLarge",
    "ReverseExponentialBackoff",
    "SchemaMismatch",
    "Settings",
    "WaitPolicy",
    "WaiterInfo",
]

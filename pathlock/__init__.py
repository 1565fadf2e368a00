"""pathlock: hierarchical, all-or-nothing path locks shared by many app servers
through the MySQL/MariaDB database they already trust.

    manager = PathLockManager("mysql+pymysql://root@127.0.0.1/test", node_id="web-1")
    locks = manager.for_customer(42)
    with locks.lock_paths("/Shared/source", "/Shared/target", reason="move") as lease:
        ...  # nobody else edits those folders, their parents or anything inside them
"""

from pathlock.customer import CustomerLocks
from pathlock.errors import (
    ArgumentTypeError,
    BackendError,
    ContentionTimeout,
    DatabaseTimeout,
    DeadlockDetected,
    InvalidArgument,
    InvalidPath,
    InvalidPathType,
    LeaseLost,
    LockTimeout,
    ManagerClosed,
    PathLockError,
    RequestTooLarge,
    SchemaMismatch,
)
from pathlock.lease import Lease
from pathlock.manager import PathLockManager
from pathlock.types import LockInfo, Mode, Owner, WaiterInfo
from pathlock.waiting import ExponentialBackoff, ReverseExponentialBackoff, WaitPolicy

__all__ = [
    "ArgumentTypeError",
    "BackendError",
    "ContentionTimeout",
    "CustomerLocks",
    "DatabaseTimeout",
    "DeadlockDetected",
    "ExponentialBackoff",
    "InvalidArgument",
    "InvalidPath",
    "InvalidPathType",
    "Lease",
    "LeaseLost",
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
    "WaitPolicy",
    "WaiterInfo",
]

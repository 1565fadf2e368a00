"""A lease as a context manager, entered every way Python enters one, and
entered without running Python code (an interrupt at the start of a Python
``__enter__`` would leave the lease held outside its ``with`` block)."""

from __future__ import annotations

import contextlib
import sys
from types import FrameType
from typing import Any

from pathlock import Owner, Settings
from pathlock.lease import Lease


class _Keeper:
    def __init__(self) -> None:
        self.settings = Settings()
        self.released: list[str] = []

    def release(self, lease: Lease) -> int:
        self.released.append(lease.lease_id)
        return 1

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the lease called its keeper's {name}")


def _lease(keeper: _Keeper) -> Lease:
    return Lease(
        keeper,
        customer_id=1,
        lease_id="l" * 32,
        paths=(("/a", "exclusive"),),
        fencing_token=7,
        owner=Owner("n", 1, "t", "k"),
        reason="",
        ttl=30.0,
        attempt_started=Settings().clock.now(),
    )


def test_every_way_of_entering_a_lease_returns_it() -> None:
    keeper = _Keeper()
    lease = _lease(keeper)
    with lease as entered:
        assert entered is lease
    assert lease.__enter__() is lease
    assert Lease.__enter__(lease) is lease
    other = _lease(keeper)
    with contextlib.ExitStack() as stack:
        assert stack.enter_context(other) is other
    assert keeper.released == [lease.lease_id, other.lease_id]


def test_entering_a_lease_runs_no_python_code() -> None:
    lease = _lease(_Keeper())
    started: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            started.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        with lease:
            sys.setprofile(None)
    finally:
        sys.setprofile(None)
    assert started == []

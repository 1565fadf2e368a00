"""Leases in doubt: one pass tries the caller's own lease first and stops at
the first database error, which it logs once (a cancelled request under load
once logged thousands of warnings, one per lease of the backlog)."""

from __future__ import annotations

import logging

import pytest

from pathlock import DatabaseTimeout
from pathlock._settling import InDoubt


class Database:
    def __init__(self, *, answers: int) -> None:
        self.answers = answers  # how many releases succeed before it stops answering
        self.released: list[str] = []

    def release(self, _customer_id: int, lease_id: str) -> None:
        if self.answers <= 0:
            raise DatabaseTimeout("releasing a lease left in doubt", TimeoutError(), "no answer")
        self.answers -= 1
        self.released.append(lease_id)


def test_the_own_lease_goes_first_and_the_first_error_ends_the_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    database = Database(answers=1)
    in_doubt = InDoubt(database.release, lambda: False, name="test")
    for number in range(100):
        in_doubt.add(7, f"lease-{number}", ttl=30.0)
    with caplog.at_level(logging.WARNING, "pathlock"):
        assert not in_doubt.settle(first="lease-99")
    assert database.released == ["lease-99"]
    assert "lease-99" not in in_doubt
    assert "lease-0" in in_doubt
    (record,) = caplog.records
    assert "could not yet release 99 lease(s) left in doubt" in record.getMessage()
    database.answers = 1000
    assert in_doubt.settle()
    assert len(database.released) == 100


def test_a_later_record_never_shortens_an_earlier_one() -> None:
    database = Database(answers=0)
    in_doubt = InDoubt(database.release, lambda: False, name="test")
    in_doubt.add(7, "lease", ttl=30.0)  # a grant in doubt: kept for 60 s
    in_doubt.add(7, "lease", ttl=0.0)  # its queue row left behind: would be dropped at once
    assert not in_doubt.settle()
    assert "lease" in in_doubt

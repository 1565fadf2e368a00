"""The rows and queued paths decoded from a read's JSON (``pathlock._core.records``):
what a crowd's waiters decode again and again is kept, and each caller still
gets a row of its own."""

from __future__ import annotations

import json

import pytest

from pathlock._core import records

NAMES = ("ticket", "paths", "created_at", "expires_at")


def _item(ticket: int, expires: str = "2026-11-29 12:00:00.000001") -> str:
    paths = records.queued_json((("/a", "exclusive"), ("/b", "shared")), frozenset({"/b"}))
    return json.dumps([ticket, paths, "2026-11-29 11:00:00.5", expires])


def test_a_row_read_again_is_equal_and_its_own() -> None:
    item = _item(7)
    first = records.item_row(NAMES, item)
    second = records.item_row(NAMES, item)
    assert first is not second
    assert vars(first) == vars(second)
    assert first.created_at.isoformat() == "2026-11-29T11:00:00.500000"
    first.ticket = 8  # one caller's row changed: the next read's is not
    assert records.item_row(NAMES, item).ticket == 7
    # Another text: its own values, not the kept ones.
    later = records.item_row(NAMES, _item(7, "2026-11-29 12:00:01"))
    assert later.expires_at.isoformat() == "2026-11-29T12:00:01"


def test_rows_read_as_bytes_or_text_agree() -> None:
    item = _item(9)
    assert vars(records.item_row(NAMES, item.encode())) == vars(records.item_row(NAMES, item))


def test_queued_paths_read_again_are_the_same() -> None:
    text = records.queued_json((("/a", "exclusive"), ("/b", "shared")), frozenset({"/b"}))
    expected = ((("/a", "exclusive"), ("/b", "shared")), frozenset({"/b"}))
    assert records.queued_paths(text) == expected
    assert records.queued_paths(text) == expected


@pytest.mark.parametrize("text", ['[["/a", "exclusive", 3]]', "not json", "[1]"])
def test_what_is_not_queued_paths_raises_every_time(text: str) -> None:
    for _ in range(2):
        with pytest.raises((ValueError, TypeError)):
            records.queued_paths(text)


def test_the_rows_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_DECODED", {})
    monkeypatch.setattr(records, "_KEPT", 3)
    for ticket in range(10):
        records.item_row(NAMES, _item(ticket))
        assert len(records._DECODED) <= 3
    # A text longer than the bound is decoded, not kept.
    long = json.dumps([1, "x" * (records._KEPT_LENGTH + 1), None, None])
    records._DECODED.clear()
    assert records.item_row(NAMES, long).paths == "x" * (records._KEPT_LENGTH + 1)
    assert records._DECODED == {}

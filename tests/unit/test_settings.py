"""The settings object: its defaults, its checks, and that it cannot change."""

from __future__ import annotations

import dataclasses
import math
import pydoc
import re

import pytest

from pathlock import ArgumentTypeError, InvalidArgument, Settings
from pathlock.settings import checked


def test_the_defaults_are_the_documented_bounds() -> None:
    settings = Settings()
    # README "Failures": a try-lock and any call without a timeout end within
    # 10.5 s, close() within 10.5 s; a dead waiter stops blocking within 5 s.
    assert settings.try_time + settings.grace == 10.5
    assert settings.call_time + settings.grace == 10.5
    assert settings.close_time == 10.5
    assert settings.waiter_ttl == 5.0
    assert settings.waiter_refresh == pytest.approx(5.0 / 3)


# One entry of the Settings docstring: "- ``name`` (unit, default value): meaning".
_ENTRY = re.compile(r"- ``(?P<name>\w+)`` \((?P<unit>[^,()]+), default (?P<default>[^()]+?)\): ")


def test_help_lists_every_field_with_its_unit_and_default() -> None:
    # help(Settings) shows the class docstring, not the fields' own: the
    # docstring's list must name every field, with the default the code has.
    shown = " ".join(pydoc.render_doc(Settings, renderer=pydoc.plaintext).split())
    entries = {entry["name"]: entry for entry in _ENTRY.finditer(shown)}
    fields = {field.name: field.default for field in dataclasses.fields(Settings)}
    assert sorted(entries) == sorted(fields)
    for name, default in fields.items():
        listed = entries[name]["default"]
        if isinstance(default, (int, float)):
            assert float(listed) == default, f"{name}: listed {listed}, is {default!r}"
        else:
            assert type(default).__name__ in listed, f"{name}: listed {listed!r}"


def test_integers_become_seconds() -> None:
    settings = Settings(call_time=3, try_time=2)
    assert (settings.call_time, settings.try_time) == (3.0, 2.0)
    assert isinstance(settings.call_time, float)


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("call_time", "10", ArgumentTypeError, "call_time must be a number, got str"),
        ("call_time", True, ArgumentTypeError, "call_time must be a number, got bool"),
        ("call_time", None, ArgumentTypeError, "got NoneType"),
        ("call_time", 0, InvalidArgument, "call_time must be more than 0"),
        ("grace", -1.0, InvalidArgument, "grace must be more than 0"),
        ("recheck", math.nan, InvalidArgument, "recheck must be more than 0"),
        ("set_aside", math.inf, InvalidArgument, "at most 86400"),
        ("socket_timeout", 10**400, InvalidArgument, "at most 86400"),
        ("stragglers", 2.5, ArgumentTypeError, "stragglers must be an int"),
        ("stragglers", 0, InvalidArgument, "stragglers must be at least 1"),
        ("lock_wait_timeout", 10**6, InvalidArgument, "at most 86400"),
        ("lease_margin", 1.0, InvalidArgument, "lease_margin is a fraction"),
        ("contention_delay", 0.5, InvalidArgument, "must not be more than contention_delay_cap"),
        ("shortest_ping", 2.0, InvalidArgument, "must not be more than ping_time"),
        ("try_patience", 20.0, InvalidArgument, "must not be more than try_time"),
    ],
)
def test_bad_values_are_refused_when_built(
    field: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_settings_cannot_change_and_copies_are_checked() -> None:
    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.call_time = 1.0  # type: ignore[misc]
    assert dataclasses.replace(settings, call_time=1.0).call_time == 1.0
    with pytest.raises(InvalidArgument):
        dataclasses.replace(settings, call_time=-1.0)


def test_only_settings_objects_are_accepted() -> None:
    assert checked(None) == Settings()
    with pytest.raises(ArgumentTypeError, match=r"settings must be a pathlock\.Settings, got dict"):
        checked({"call_time": 1.0})

"""Who the process runs as, for messages and the log of an operator's release."""

from __future__ import annotations

import os
import pwd

import pytest

from pathlock._owners import process_user


def test_the_account_of_the_uid_and_not_what_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    monkeypatch.delenv("SUDO_USER", raising=False)
    assert process_user() == pwd.getpwuid(os.getuid()).pw_name


def test_a_uid_without_an_account_is_named_by_its_number(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(os, "getuid", lambda: 4242)
    monkeypatch.setattr(pwd, "getpwuid", missing)
    monkeypatch.delenv("SUDO_USER", raising=False)
    assert process_user() == "uid 4242"


def test_root_through_sudo_names_who_ran_sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 0)
    monkeypatch.setenv("SUDO_USER", "alice")
    root = pwd.getpwuid(0).pw_name
    assert process_user() == f"{root} (through sudo, by alice)"
    # Only root's SUDO_USER counts: anyone else could set it.
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    monkeypatch.setattr(pwd, "getpwuid", lambda _uid: pwd.struct_passwd(("bob",) + (0,) * 6))
    assert process_user() == "bob"

"""The TLS context of PyMySQL connections pathlock opens: given no TLS
option, PyMySQL builds a context per connection (loading the system's
certificates, some 16 ms of CPU); pathlock's connections build it once per
process and share it (pathlock.__pymysql.BoundedConnection)."""

from __future__ import annotations

import os
import ssl

import pymysql
import pytest

from pathlock.dialects import _pymysql


def _unconnected(cls: type[pymysql.connections.Connection], **options: object) -> object:
    # defer_connect: PyMySQL builds the context in __init__, before connecting.
    return cls(host="127.0.0.1", defer_connect=True, **options)


@pytest.mark.parametrize("cls", [_pymysql.BoundedConnection, _pymysql.Connection])
def test_connections_given_no_tls_option_share_one_context(
    cls: type[pymysql.connections.Connection],
) -> None:
    first, second = _unconnected(cls), _unconnected(cls)
    if not getattr(first, "ssl", False):
        pytest.skip("this PyMySQL builds no context without TLS options")
    assert first.ctx is second.ctx  # type: ignore[attr-defined]
    # The one PyMySQL would have built: TLS if the server offers it, unverified.
    plain = _unconnected(pymysql.connections.Connection)
    for attribute in ("verify_mode", "check_hostname", "options", "verify_flags"):
        assert getattr(first.ctx, attribute) == getattr(plain.ctx, attribute)  # type: ignore[attr-defined]
    assert first._ssl_required is plain._ssl_required is False  # type: ignore[attr-defined]


def test_tls_options_given_build_a_context_of_their_own() -> None:
    shared = _unconnected(_pymysql.BoundedConnection)
    verified = _unconnected(_pymysql.BoundedConnection, ssl_verify_cert=True)
    assert verified.ctx is not getattr(shared, "ctx", None)  # type: ignore[attr-defined]
    assert verified.ctx.verify_mode == ssl.CERT_REQUIRED  # type: ignore[attr-defined]
    assert verified._ssl_required  # type: ignore[attr-defined]
    given = ssl.create_default_context()
    assert _unconnected(_pymysql.BoundedConnection, ssl=given).ctx is given  # type: ignore[attr-defined]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_builds_its_own_context() -> None:
    inherited = getattr(_unconnected(_pymysql.BoundedConnection), "ctx", None)
    if inherited is None:
        pytest.skip("this PyMySQL builds no context without TLS options")
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 if it built a context of its own
        try:
            child = _unconnected(_pymysql.BoundedConnection)
            again = _unconnected(_pymysql.BoundedConnection)
            ok = child.ctx is not inherited and again.ctx is child.ctx  # type: ignore[attr-defined]
            os._exit(0 if ok else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _unconnected(_pymysql.BoundedConnection).ctx is inherited  # type: ignore[attr-defined]

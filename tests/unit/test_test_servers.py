"""The test servers' helpers that need no server: the port picker and the
error report of a server that would not start."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from servers import private_mariadb


def test_a_free_port_is_never_one_the_kernel_gives_outgoing_connections() -> None:
    # A Galera joiner's rsync daemon told to listen on a port that some
    # client's connection holds as its local end exits, and the join fails:
    # ports in the ephemeral range can be taken so at any moment.
    low, high = private_mariadb._ephemeral_range()
    ports = [private_mariadb.free_port() for _ in range(50)]
    assert all(not low <= port <= high for port in ports)
    assert all(port >= private_mariadb._LOWEST_PORT for port in ports)
    assert len(set(ports)) == len(ports)  # never the same twice in a process
    for port in ports[:5]:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    with taken:
        port = taken.getsockname()[1]
        # The taken port is the only candidate.
        monkeypatch.setattr(private_mariadb, "_ephemeral_range", lambda: (0, 0))
        monkeypatch.setattr(private_mariadb, "_LOWEST_PORT", port)
        monkeypatch.setattr(private_mariadb, "_handed_out", set(range(port + 1, 65536)))
        with pytest.raises(RuntimeError, match="no free loopback port"):
            private_mariadb.free_port()


def test_a_failed_start_reports_the_errors_logged_before_the_shutdown(tmp_path: Path) -> None:
    server = private_mariadb.PrivateMariaDB(tmp_path)
    server.error_log.parent.mkdir(parents=True, exist_ok=True)
    failure = "WSREP_SST: [ERROR] the rsync or stunnel daemon (PID: 7) terminated unexpectedly."
    server.error_log.write_text(f"starting\n{failure}\n" + "shutting down\n" * 500)
    report = server.error_log_tail(characters=200)
    assert report.startswith("errors logged before:\nWSREP_SST: [ERROR] the rsync")
    assert report.endswith("shutting down\n")
    assert "starting" not in report

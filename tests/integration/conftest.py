"""Fixtures of the integration tests that need more than the shared server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pathlock import migrate
from tests import private_mariadb

PRIVATE_DATABASE = "pathlock_faults"


@pytest.fixture(scope="module")
def private_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[private_mariadb.PrivateMariaDB]:
    """A MariaDB server of this test module alone (see ``tests/private_mariadb.py``),
    which a test may stop, kill and start again, with the pathlock schema migrated
    into ``PRIVATE_DATABASE``."""
    reason = private_mariadb.missing()
    if reason is not None:
        pytest.skip(reason)
    server = private_mariadb.PrivateMariaDB(tmp_path_factory.getbasetemp())
    try:
        server.start()
        server.execute(f"CREATE DATABASE {PRIVATE_DATABASE}")
        migrate.upgrade(server.url(PRIVATE_DATABASE))
        yield server
    finally:
        server.close()

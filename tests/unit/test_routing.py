"""Which node an operation goes to (pathlock/_routing.py): order, affinity by
rendezvous hashing, setting failed nodes aside. Engines are created but never
connected: routing only reads their URLs."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine

from pathlock import events
from pathlock._routing import Router, node_name

URLS = [
    "mysql+pymysql://app:secret@db1.example:3306/locks",
    "mysql+pymysql://app:secret@db2.example:3306/locks",
    "mysql+pymysql://app:secret@db3.example:3306/locks",
]


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made = [create_engine(url) for url in URLS]
    yield made
    for engine in made:
        engine.dispose()


def test_a_node_is_named_by_its_address_without_credentials() -> None:
    assert node_name(create_engine(URLS[0])) == "db1.example:3306/locks"
    # The driver and the user do not matter: app servers may differ in both.
    assert node_name(create_engine("mariadb+pymysql://other@db1.example:3306/locks")) == (
        "db1.example:3306/locks"
    )
    socket = create_engine("mysql+pymysql://root@/locks?unix_socket=/run/mysqld/mysqld.sock")
    assert node_name(socket) == "unix:/run/mysqld/mysqld.sock/locks"


def test_without_affinity_every_customer_uses_the_order_given(engines: list[Engine]) -> None:
    router = Router(engines)
    for customer_id in (1, 2, 99, None):
        assert [node.engine for node in router.order(customer_id)] == engines
        assert router.pick(customer_id).engine is engines[0]


def test_affinity_gives_every_app_server_the_same_home_whatever_its_order(
    engines: list[Engine],
) -> None:
    routers = [Router(list(order), affinity=True) for order in itertools.permutations(engines)]
    for customer_id in range(1, 300):
        orders = {tuple(node.name for node in r.order(customer_id)) for r in routers}
        assert len(orders) == 1, customer_id


def test_affinity_spreads_customers_over_the_nodes(engines: list[Engine]) -> None:
    router = Router(engines, affinity=True)
    homes = Counter(router.pick(customer_id).name for customer_id in range(1, 3001))
    assert set(homes) == {node.name for node in router.nodes}
    assert all(800 <= count <= 1200 for count in homes.values()), homes


def test_operations_on_all_customers_use_the_order_given(engines: list[Engine]) -> None:
    router = Router(engines, affinity=True)
    assert [node.engine for node in router.order(None)] == engines


def test_a_failed_node_is_set_aside_and_only_its_customers_move(engines: list[Engine]) -> None:
    router = Router(engines, affinity=True)
    before = {customer_id: router.order(customer_id) for customer_id in range(1, 600)}
    failed = router.nodes[1]
    router.set_aside(failed, RuntimeError("gone"))
    for customer_id, order in before.items():
        expected = order[1] if order[0] is failed else order[0]
        assert router.pick(customer_id) is expected


def test_a_set_aside_node_is_tried_again_later(engines: list[Engine]) -> None:
    router = Router(engines, set_aside=0.05)
    router.set_aside(router.nodes[0], RuntimeError("gone"))
    assert router.pick(None) is router.nodes[1]
    time.sleep(0.1)
    assert router.pick(None) is router.nodes[0]


def test_when_every_node_is_set_aside_they_are_tried_in_order(engines: list[Engine]) -> None:
    router = Router(engines)
    for node in router.nodes:
        router.set_aside(node, RuntimeError("gone"))
    assert router.pick(None) is router.nodes[0]


def test_nodes_that_failed_this_operation_come_last(engines: list[Engine]) -> None:
    router = Router(engines)
    first, second, third = router.nodes
    assert router.pick(None, [first]) is second
    assert router.pick(None, [first, second]) is third
    assert router.pick(None, [first, second, third]) is first


def test_a_single_node_is_never_set_aside(engines: list[Engine]) -> None:
    router = Router(engines[:1])
    router.set_aside(router.nodes[0], RuntimeError("gone"))
    assert router.nodes[0].set_aside_until == 0.0
    assert router.pick(5) is router.nodes[0]


def test_setting_aside_warns_once_per_failure_period(
    engines: list[Engine], caplog: pytest.LogCaptureFixture
) -> None:
    # As a manager's router: its failovers are told to the log.
    router = Router(engines, emitter=events.Emitter([events.LoggingHooks()]))
    with caplog.at_level("WARNING", logger="pathlock.store"):
        for _ in range(3):
            router.set_aside(router.nodes[2], RuntimeError("connection refused"))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1
    assert "db3.example:3306/locks" in lines[0]
    assert "connection refused" in lines[0]

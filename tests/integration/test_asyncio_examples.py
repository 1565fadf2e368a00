"""The asyncio examples of docs/ASYNCIO.md run: the manager opened and
closed with the application, a request that waits while another process holds
the paths, and one that gives up with 409."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path
from types import ModuleType

import pytest
from aiohttp.test_utils import TestClient as AiohttpClient
from aiohttp.test_utils import TestServer
from starlette.testclient import TestClient

from pathlock import PathLockManager

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

pytestmark = pytest.mark.timeout(120)


def _example(name: str, url: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("PATHLOCK_DATABASE_URL", url)
    monkeypatch.setenv("NODE_ID", "example")
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _held_for(
    database_url: str,
    customer_id: int,
    path: str,
    seconds: float,
    done: threading.Event | None = None,
) -> threading.Thread:
    """``path`` held by another process's manager for ``seconds``, or until
    ``done`` is set."""
    manager = PathLockManager(database_url, node_id="elsewhere")
    lease = manager.for_customer(customer_id).lock_paths(path)

    def release() -> None:
        (done or threading.Event()).wait(seconds)
        lease.release()
        manager.close()

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_the_starlette_example(
    database_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = _example("starlette_app", database_url, monkeypatch)
    body = {"customer": customer_id, "source": "/Shared/a", "target": "/Shared/b"}
    with TestClient(example.app) as client:
        holder = _held_for(database_url, customer_id, "/Shared", 0.3)
        answer = client.post("/move", json=body)  # waits for the release
        holder.join()
        assert answer.status_code == 200, answer.text
        assert answer.json()["moved"] == ["/Shared/a", "/Shared/b"]
    manager = client.app.state.locks  # type: ignore[attr-defined]
    assert manager._core._closed  # closed with the application


def test_the_aiohttp_example(
    database_url: str, customer_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = _example("aiohttp_app", database_url, monkeypatch)
    body = {"customer": customer_id, "source": "/Shared/a", "target": "/Shared/b"}

    async def main() -> None:
        async with AiohttpClient(TestServer(example.create_app())) as client:
            answer = await client.post("/move", json=body)
            assert answer.status == 200, await answer.text()
            done = threading.Event()  # held 7 s at most, released once the 409 is in
            holder = await asyncio.to_thread(
                _held_for, database_url, customer_id, "/Shared/a/x", 7.0, done
            )
            try:
                answer = await client.post("/move", json=body)  # gives up after 5 s
            finally:
                done.set()
            assert answer.status == 409
            assert (await answer.json())["busy"] == ["/Shared/a/x"]
            await asyncio.to_thread(holder.join)

    asyncio.run(main())

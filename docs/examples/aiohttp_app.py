"""An aiohttp application that moves folders under a pathlock lock.

A cleanup context opens the manager when the application starts and closes
it when it stops. Run it with ``python -m aiohttp.web aiohttp_app:create_app``.

The manager is given no URL: it uses ``$PATHLOCK_DATABASE_URL``, else
``database_url`` in ``/etc/pathlock.toml``, else the user's own SQLite file
(``pathlock info`` says which), so every worker finds the same database
whatever directory it was started from.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from aiohttp import web

from pathlock import AsyncPathLockManager, LockTimeout

LOCKS = web.AppKey("locks", AsyncPathLockManager)


async def pathlock_manager(app: web.Application) -> AsyncIterator[None]:
    async with AsyncPathLockManager(node_id=os.environ.get("NODE_ID")) as manager:
        app[LOCKS] = manager
        yield


async def move(request: web.Request) -> web.Response:
    body = await request.json()
    customer, source, target = body["customer"], body["source"], body["target"]
    locks = request.app[LOCKS].for_customer(customer)
    try:
        async with locks.lock_paths(source, target, timeout=5, reason="move") as lease:
            # ... move the folder, passing lease.fencing_token to the storage ...
            return web.json_response({"moved": [source, target], "token": lease.fencing_token})
    except LockTimeout as busy:
        held = [lock.path for lock in busy.held_by]
        return web.json_response({"busy": held}, status=409)


def create_app(_argv: list[str] | None = None) -> web.Application:
    app = web.Application()
    app.cleanup_ctx.append(pathlock_manager)
    app.router.add_post("/move", move)
    return app

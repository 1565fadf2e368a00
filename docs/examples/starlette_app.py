"""A Starlette (or FastAPI) application that moves folders under a pathlock lock.

The manager is created when the application starts and closed when it stops
(the lifespan), so its connections, its renewals and the leases it still holds
end with the application. Run it with ``uvicorn starlette_app:app``; with
FastAPI, ``FastAPI(lifespan=lifespan)`` takes the same function.

The manager is given no URL: it uses ``$PATHLOCK_DATABASE_URL``, else
``database_url`` in ``/etc/pathlock.toml``, else the user's own SQLite file
(``pathlock info`` says which), so every worker finds the same database
whatever directory it was started from.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pathlock import AsyncPathLockManager, LockTimeout


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with AsyncPathLockManager(node_id=os.environ.get("NODE_ID")) as manager:
        app.state.locks = manager
        yield


async def move(request: Request) -> JSONResponse:
    body = await request.json()
    customer, source, target = body["customer"], body["source"], body["target"]
    locks = request.app.state.locks.for_customer(customer)
    try:
        async with locks.lock_paths(source, target, timeout=5, reason="move") as lease:
            # ... move the folder, passing lease.fencing_token to the storage ...
            return JSONResponse({"moved": [source, target], "token": lease.fencing_token})
    except LockTimeout as busy:
        held = [lock.path for lock in busy.held_by]
        return JSONResponse({"busy": held}, status_code=409)


app = Starlette(routes=[Route("/move", move, methods=["POST"])], lifespan=lifespan)

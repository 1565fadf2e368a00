"""A WsgiDAV server whose locks are pathlock's, for gunicorn: serves the
folder ``$PATHLOCK_DAV_ROOT`` to anyone, with its locks in the database
``$PATHLOCK_DAV_DATABASE`` (a customer of ``$PATHLOCK_DAV_CUSTOMER``);
``$PATHLOCK_DAV_STORAGE=memory`` gives WsgiDAV's own storage instead (each
worker's locks its own), to show what the tests find without pathlock.

    gunicorn -w 2 -b 127.0.0.1:8080 tests.integration.webdav_app:app
"""

from __future__ import annotations

import os
from typing import Any

from wsgidav.wsgidav_app import WsgiDAVApp

from pathlock.wsgidav import LockStorage

storage: Any = True  # WsgiDAV's LockStorageDict
if os.environ.get("PATHLOCK_DAV_STORAGE", "pathlock") == "pathlock":
    storage = LockStorage(
        os.environ["PATHLOCK_DAV_DATABASE"],
        customer_id=int(os.environ.get("PATHLOCK_DAV_CUSTOMER", "0")),
        node_id=f"dav-{os.getpid()}",
    )

app = WsgiDAVApp(
    {
        "provider_mapping": {"/": os.environ["PATHLOCK_DAV_ROOT"]},
        "http_authenticator": {"domain_controller": None},
        "simple_dc": {"user_mapping": {"*": True}},
        "lock_storage": storage,
        "property_manager": True,
        "verbose": 1,
        "logging": {"enable_loggers": []},
    }
)

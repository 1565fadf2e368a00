"""The sizes of what callers give that the tables keep: checked by
:mod:`pathlock._core.validation` before anything is written, and the columns'
sizes in :mod:`pathlock.schema`. Constants only, importing nothing: the
checks need them without loading the tables (or SQLAlchemy)."""

from __future__ import annotations

LEASE_ID_LENGTH = 32
REASON_LENGTH = 1000
NODE_ID_LENGTH = 255
THREAD_LENGTH = 64
# A manager's identity (16 hex digits), a dot and a holder: "t12", "a7" or
# "n" + 24 hex digits of a caller's owner name (see pathlock._owners).
OWNER_KEY_LENGTH = 64

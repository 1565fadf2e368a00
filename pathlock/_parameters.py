"""The bind parameters of a request's statements (:mod:`pathlock._statements`),
from a :class:`~pathlock._core.records.GrantRequest`."""

from __future__ import annotations

from typing import Any

from pathlock._core.records import GrantRequest, queued_json
from pathlock._statements.common import NO_TICKET
from pathlock._statements.conflicts import conflict_parameters


def grant_parameters(request: GrantRequest, ticket: int | None) -> dict[str, Any]:
    """The parameters of an attempt's grant (``grant_statement``) and of the
    reads that say who is in the way; ``ticket``: the request's place in the
    queue (``None``: not queued)."""
    parameters = conflict_parameters(request.paths, shallow=request.shallow)
    shallow = request.shallow
    for n, (path, mode) in enumerate(request.paths):
        parameters[f"rq_path_{n}"] = path
        parameters[f"rq_mode_{n}"] = mode
        if shallow:
            parameters[f"rq_shallow_{n}"] = path in shallow
    parameters.update(
        c_id=request.customer_id,
        l_id=request.lease_id,
        o_node=request.owner.node_id,
        o_pid=request.owner.pid,
        o_thread=request.owner.thread,
        o_key=request.owner.key,
        why=request.reason,
        ttl_us=round(request.ttl * 1_000_000),
        l_data=request.data,
        w_ticket=NO_TICKET if ticket is None else ticket,
    )
    return parameters


def lean_parameters(request: GrantRequest) -> dict[str, Any]:
    """The parameters of a grant without searches (``LEAN_CLAIM`` and
    ``lean_grant``): the request's rows, without the conflict query's."""
    parameters: dict[str, Any] = {
        "c_id": request.customer_id,
        "l_id": request.lease_id,
        "o_node": request.owner.node_id,
        "o_pid": request.owner.pid,
        "o_thread": request.owner.thread,
        "o_key": request.owner.key,
        "why": request.reason,
        "ttl_us": round(request.ttl * 1_000_000),
        "rows": len(request.paths),
        "l_data": request.data,
    }
    shallow = request.shallow
    for n, (path, mode) in enumerate(request.paths):
        parameters[f"rq_path_{n}"] = path
        parameters[f"rq_mode_{n}"] = mode
        if shallow:  # rq_shallow_N only where a path is at depth 0
            parameters[f"rq_shallow_{n}"] = path in shallow
    return parameters


def waiter_parameters(request: GrantRequest, waiter_ttl: float) -> dict[str, Any]:
    # Only these keys: an INSERT takes any extra key named like a column as
    # that column's value.
    return {
        "c_id": request.customer_id,
        "l_id": request.lease_id,
        "w_paths": queued_json(request.paths, request.shallow),
        "o_node": request.owner.node_id,
        "o_pid": request.owner.pid,
        "o_thread": request.owner.thread,
        "o_key": request.owner.key,
        "why": request.reason,
        "w_ttl_us": round(waiter_ttl * 1_000_000),
        # How long paths a release hands to the request last until it takes
        # them up: no longer than its queue row would, nor than its lease.
        "w_hand_over_us": round(min(waiter_ttl, request.ttl) * 1_000_000),
        "l_data": request.data,
    }


def take_up_parameters(request: GrantRequest) -> dict[str, Any]:
    """The parameters of ``TAKE_UP``: the rows handed to ``request`` extended
    to its ttl."""
    return {
        "c_id": request.customer_id,
        "l_id": request.lease_id,
        "ttl_us": round(request.ttl * 1_000_000),
    }

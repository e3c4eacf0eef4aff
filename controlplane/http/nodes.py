"""`GET /v1/nodes`: nodes, their GPUs (and what runs on them), capacity and leases."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from controlplane.http.auth import principal
from controlplane.http.keys import POOL
from controlplane.queries import Q


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/nodes", list_nodes)


async def list_nodes(request: web.Request) -> web.Response:
    who = principal(request)
    rows = await request.app[POOL].fetch(Q["list_nodes"])
    return web.json_response({"nodes": [_view(dict(row), who.is_admin) for row in rows]})


def _view(row: dict[str, Any], admin: bool) -> dict[str, Any]:
    gpus = json.loads(row["gpus"]) if isinstance(row["gpus"], str) else row["gpus"]
    for gpu in gpus:
        gpu["allocated"] = gpu["job_id"] is not None
        if not admin:
            # Which job holds a GPU is another tenant's business; that it is taken is not.
            for key in ("job_id", "attempt", "learner"):
                gpu.pop(key)
    state = row["state"]
    if state == "READY" and row["expired"]:
        state = "UNRESPONSIVE"  # lease expired; the lifecycle manager will declare it lost
    return {
        "name": row["name"],
        "state": state,
        "runtime": row["runtime"],
        "lease_until": row["lease_until"].isoformat(),
        "heartbeat_at": row["heartbeat_at"].isoformat(),
        "registered_at": row["registered_at"].isoformat(),
        "cpus": row["cpus"],
        "cpus_allocated": float(row["cpus_allocated"]),
        "memory_mb": row["memory_mb"],
        "memory_mb_allocated": int(row["memory_mb_allocated"]),
        "gpus": gpus,
        "gpus_free": sum(1 for g in gpus if g["healthy"] and not g["allocated"]),
        "gpus_allocated": sum(1 for g in gpus if g["allocated"]),
    }

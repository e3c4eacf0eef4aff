"""`GET /v1/nodes`: nodes, their GPUs (and what runs on them), capacity and leases."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from controlplane.agents.views import list_nodes as all_nodes
from controlplane.http.auth import principal
from controlplane.http.keys import POOL


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/nodes", list_nodes)


async def list_nodes(request: web.Request) -> web.Response:
    who = principal(request)
    nodes = await all_nodes(request.app[POOL])
    if not who.is_admin:
        for node in nodes:
            _hide_holders(node)
    return web.json_response({"nodes": nodes})


def _hide_holders(node: dict[str, Any]) -> None:
    # Which job holds a GPU is another tenant's business; that it is taken is not.
    for gpu in node["gpus"]:
        for key in ("job_id", "attempt", "learner"):
            gpu.pop(key)

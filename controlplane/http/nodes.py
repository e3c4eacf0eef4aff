"""`GET /v1/nodes`: nodes, their GPUs (and, to admins, what runs on them), capacity and
leases."""

from __future__ import annotations

from aiohttp import web

from controlplane.agents.answers import NodeList, nodes_seen
from controlplane.http.auth import principal
from controlplane.http.keys import POOL
from controlplane.http.operations import (
    Answer,
    Operation,
    add_operations,
    answer,
)


async def list_nodes(request: web.Request) -> web.Response:
    who = principal(request)
    nodes = await nodes_seen(request.app[POOL], holders=who.is_admin)
    return answer(nodes)


OPERATIONS = (
    Operation(
        "get",
        "/v1/nodes",
        list_nodes,
        "listNodes",
        "Nodes: state, lease, capacity, GPUs and their health",
        {200: Answer("the nodes", NodeList)},
        {401: "missing or wrong token"},
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)

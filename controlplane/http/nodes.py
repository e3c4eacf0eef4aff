"""`/v1/nodes`: nodes, their GPUs (and, to admins, what runs on them), capacity and leases; the
admin drains a node for maintenance (its jobs preempted, nothing new placed on it) and puts it
back in service (see `controlplane.agents.drains`)."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.agents.answers import NodeList, NodeView, node_seen, nodes_seen
from controlplane.agents.drains import Drains
from controlplane.http import params
from controlplane.http.auth import principal
from controlplane.http.errors import error
from controlplane.http.keys import PLANE, POOL
from controlplane.http.operations import (
    Answer,
    Operation,
    Param,
    add_operations,
    answer,
)
from controlplane.http.requests import actor, json_body, validated


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="why (recorded in the node's history)",
    )

    @field_validator("reason")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        if value is not None and not params.storable(value):
            raise ValueError("text must be valid Unicode without NUL characters")
        return value


async def list_nodes(request: web.Request) -> web.Response:
    who = principal(request)
    nodes = await nodes_seen(request.app[POOL], holders=who.is_admin)
    return answer(nodes)


def _admin_only(request: web.Request) -> tuple[Drains, str]:
    """The drains and the node's name, for the admin's token only (checked before the body is
    read)."""
    if not principal(request).is_admin:
        raise error(403, "only the admin token may drain and undrain nodes")
    name = request.match_info["node"]
    if not params.storable(name):
        raise error(404, f"no node named {name!r}")  # no node's name holds a NUL
    plane = request.app[PLANE]
    return Drains(plane.pool, plane.store, plane.clock), name


async def _node(request: web.Request, name: str) -> web.Response:
    node = await node_seen(request.app[POOL], name)
    if node is None:  # nodes are never deleted: found a moment ago
        raise error(404, f"no node named {name!r}")
    return answer(node)


async def drain(request: web.Request) -> web.Response:
    drains, name = _admin_only(request)
    body = validated(DrainRequest, await json_body(request))
    await drains.drain(name, actor(principal(request)), body.reason)
    return await _node(request, name)


async def undrain(request: web.Request) -> web.Response:
    drains, name = _admin_only(request)
    await drains.undrain(name, actor(principal(request)))
    return await _node(request, name)


NODE = Param("node", "path", "the node's name", {"type": "string"})
ADMIN = {401: "missing or wrong token", 403: "not the admin token", 404: "no such node"}
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
    Operation(
        "post",
        "/v1/nodes/{node}/drain",
        drain,
        "drainNode",
        "Drain a node for maintenance (admin)",
        {200: Answer("the node, draining", NodeView)},
        {400: "malformed JSON", **ADMIN, 422: "invalid fields, each listed"},
        description="Claims place nothing more on the node, and its agent preempts every job "
        "it runs there within a heartbeat: their learners are asked to checkpoint within "
        "their grace, then stopped, and the jobs go back to the queue without spending a "
        "restart. The agent keeps its lease. Draining a draining node changes nothing.",
        params=(NODE,),
        body=DrainRequest,
    ),
    Operation(
        "post",
        "/v1/nodes/{node}/undrain",
        undrain,
        "undrainNode",
        "Put a drained node back in service (admin)",
        {200: Answer("the node, in service", NodeView)},
        ADMIN,
        description="Claims place work on the node again. Undraining a node in service "
        "changes nothing.",
        params=(NODE,),
    ),
)


def add_routes(app: web.Application) -> None:
    add_operations(app, OPERATIONS)

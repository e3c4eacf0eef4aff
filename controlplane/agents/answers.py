"""What the API shows of the nodes: their state, lease, capacity and GPUs, and to an admin
which job holds each GPU (which job holds one is another tenant's business; that it is taken
is not)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from controlplane.agents.views import list_nodes
from controlplane.database import Executor
from controlplane.instants import Instant


class Gpu(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mb: int
    healthy: bool
    health_reason: str | None
    allocated: bool


class HeldGpu(Gpu):
    """A GPU as an admin sees it: with what holds it (all null: free)."""

    job_id: str | None
    attempt: int | None
    learner: int | None


class NodeView(BaseModel):
    name: str
    state: Literal["READY", "UNRESPONSIVE", "GONE", "LOST"] = Field(
        description="UNRESPONSIVE once its lease has expired, until it is declared LOST"
    )
    draining: bool = Field(
        description="drained by an operator: it takes no new work, and its jobs were sent back "
        "to the queue (preempted), until it is undrained"
    )
    runtime: str
    lease_until: Instant
    heartbeat_at: Instant
    registered_at: Instant
    cpus: float
    cpus_allocated: float
    memory_mb: int
    memory_mb_allocated: int
    gpus: list[HeldGpu | Gpu] = Field(description="by index; what holds each, to admins only")
    gpus_free: int
    gpus_allocated: int


class NodeList(BaseModel):
    nodes: list[NodeView]


async def nodes_seen(db: Executor, *, holders: bool) -> NodeList:
    """Every node by name; with what holds each GPU when `holders` (an admin asks)."""
    return NodeList(nodes=[_view(node, holders) for node in await list_nodes(db)])


async def node_seen(db: Executor, name: str) -> NodeView | None:
    """One node as an admin sees it; None when there is none of that name."""
    found = await list_nodes(db, name)
    return _view(found[0], holders=True) if found else None


def _view(node: dict[str, Any], holders: bool) -> NodeView:
    gpu = HeldGpu if holders else Gpu
    gpus: list[Any] = [gpu.model_validate(g) for g in node["gpus"]]
    return NodeView.model_validate({**node, "gpus": gpus})

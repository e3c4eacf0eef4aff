"""Whether a job could ever be placed: a pure judgement against the live nodes."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.jobs.manifest import (
    MAX_CPUS,
    MAX_GPUS_PER_LEARNER,
    MAX_LEARNERS,
    MAX_MEMORY_MB,
    MIN_CPUS,
    MIN_MEMORY_MB,
    JobManifest,
)
from controlplane.scheduling.placement import Demand


@dataclass(frozen=True, slots=True)
class LiveNodes:
    """The most that any one live node offers of each resource (not necessarily one node), and
    what they offer together."""

    nodes: int
    gpus: int
    cpus: float
    memory_mb: int
    total_gpus: int


def demand_of(manifest: JobManifest) -> Demand:
    """What each of the job's learners needs."""
    return Demand(
        manifest.learners,
        manifest.gpus_per_learner,
        manifest.cpus,
        manifest.memory_mb,
        manifest.learners_per_node,
    )


def out_of_bounds(demand: Demand) -> str | None:
    """What of a queued job's demand is outside the manifest's bounds, or None. The manifest
    refuses such values; a job stored before a bound was raised (or written around the API)
    may still hold one, and is then judged on its own, never placed with the others."""
    bounds = (
        ("learners", demand.learners, 1, MAX_LEARNERS),
        ("gpus_per_learner", demand.gpus, 0, MAX_GPUS_PER_LEARNER),
        ("cpus", demand.cpus, MIN_CPUS, MAX_CPUS),
        ("memory_mb", demand.memory_mb, MIN_MEMORY_MB, MAX_MEMORY_MB),
    )
    for name, value, least, most in bounds:
        # `not least <= value <= most`, not `value < least or ...`: NaN is outside too.
        if not least <= value <= most:
            return f"its {name} {value!r} is outside the manifest's bounds ({least:g} to {most:g})"
    per_node = demand.per_node
    if per_node is not None and not (
        1 <= per_node <= demand.learners and demand.learners % per_node == 0
    ):
        return f"its learners_per_node {per_node!r} does not divide its {demand.learners} learners"
    return None


def unschedulable_reason(demand: Demand, live: LiveNodes) -> str | None:
    """Why the job can never be placed as the cluster stands, or None. Each learner runs on one
    node; a job of one learner needs its whole share there, a job of several may spread over
    nodes. With no live node there is nothing to judge against: the job simply waits for one."""
    if live.nodes == 0:
        return None
    if demand.per_node is not None:
        return _per_node_reason(demand, demand.per_node, live)
    where = "on one node" if demand.learners == 1 else "per learner, on one node"
    if demand.gpus > live.gpus:
        return f"needs {demand.gpus} healthy GPU(s) {where}; the largest node has {live.gpus}"
    if demand.cpus > live.cpus:
        return f"needs {demand.cpus:g} CPUs {where}; the largest node has {live.cpus:g}"
    if demand.memory_mb > live.memory_mb:
        return (
            f"needs {demand.memory_mb} MiB of memory {where}; the largest node has "
            f"{live.memory_mb} MiB"
        )
    total = demand.learners * demand.gpus
    if total > live.total_gpus:
        return f"needs {total} healthy GPU(s) in all; the live nodes have {live.total_gpus}"
    return None


def _per_node_reason(demand: Demand, per_node: int, live: LiveNodes) -> str | None:
    """Why a job of `per_node` learners on each of its nodes can never be placed, or None:
    each of its nodes must hold `per_node` learners' share at once, and it needs that many
    nodes."""
    nodes = demand.learners // per_node
    where = f"for its {per_node} learners on each node"
    if per_node * demand.gpus > live.gpus:
        return (
            f"needs {per_node * demand.gpus} healthy GPU(s) {where}; the largest node has "
            f"{live.gpus}"
        )
    if per_node * demand.cpus > live.cpus:
        return f"needs {per_node * demand.cpus:g} CPUs {where}; the largest node has {live.cpus:g}"
    if per_node * demand.memory_mb > live.memory_mb:
        return (
            f"needs {per_node * demand.memory_mb} MiB of memory {where}; the largest node has "
            f"{live.memory_mb} MiB"
        )
    if nodes > live.nodes:
        return (
            f"needs {nodes} nodes ({per_node} of its {demand.learners} learners on each); the "
            f"live nodes are {live.nodes}"
        )
    total = demand.learners * demand.gpus
    if total > live.total_gpus:
        return f"needs {total} healthy GPU(s) in all; the live nodes have {live.total_gpus}"
    return None

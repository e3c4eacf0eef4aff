"""Whether a job could ever be placed: a pure judgement against the live nodes."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.jobs.manifest import JobManifest


@dataclass(frozen=True, slots=True)
class LiveNodes:
    """The most that any one live node offers of each resource (not necessarily one node), and
    what they offer together."""

    nodes: int
    gpus: int
    cpus: float
    memory_mb: int
    total_gpus: int


def unschedulable_reason(manifest: JobManifest, live: LiveNodes) -> str | None:
    """Why the job can never be placed as the cluster stands, or None. Each learner runs on one
    node; a job of one learner needs its whole share there, a job of several may spread over
    nodes. With no live node there is nothing to judge against: the job simply waits for one."""
    if live.nodes == 0:
        return None
    where = "on one node" if manifest.learners == 1 else "per learner, on one node"
    if manifest.gpus_per_learner > live.gpus:
        return (
            f"needs {manifest.gpus_per_learner} healthy GPU(s) {where}; the largest node has "
            f"{live.gpus}"
        )
    if manifest.cpus > live.cpus:
        return f"needs {manifest.cpus:g} CPUs {where}; the largest node has {live.cpus:g}"
    if manifest.memory_mb > live.memory_mb:
        return (
            f"needs {manifest.memory_mb} MiB of memory {where}; the largest node has "
            f"{live.memory_mb} MiB"
        )
    if manifest.total_gpus > live.total_gpus:
        return (
            f"needs {manifest.total_gpus} healthy GPU(s) in all; the live nodes have "
            f"{live.total_gpus}"
        )
    return None

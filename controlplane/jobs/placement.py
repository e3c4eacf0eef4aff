"""Whether a job could ever be placed: a pure judgement against the largest node."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.jobs.manifest import JobManifest


@dataclass(frozen=True, slots=True)
class Largest:
    """The most that any one live node offers of each resource (not necessarily one node)."""

    nodes: int
    gpus: int
    cpus: float
    memory_mb: int


def unschedulable_reason(manifest: JobManifest, largest: Largest) -> str | None:
    """Why the job can never be placed as the cluster stands, or None. A job's learners run on
    one node, so it needs its whole share there. With no live node there is nothing to judge
    against: the job simply waits for one."""
    if largest.nodes == 0:
        return None
    need_gpus = manifest.learners * manifest.gpus_per_learner
    need_cpus = manifest.learners * manifest.cpus
    need_memory = manifest.learners * manifest.memory_mb
    if need_gpus > largest.gpus:
        return f"needs {need_gpus} healthy GPU(s) on one node; the largest node has {largest.gpus}"
    if need_cpus > largest.cpus:
        return f"needs {need_cpus:g} CPUs on one node; the largest node has {largest.cpus:g}"
    if need_memory > largest.memory_mb:
        return (
            f"needs {need_memory} MiB of memory on one node; the largest node has "
            f"{largest.memory_mb} MiB"
        )
    return None

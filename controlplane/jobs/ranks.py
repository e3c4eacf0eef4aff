"""A job's ranks: each learner of its current attempt as torch.distributed numbers it, with its
node, GPUs and state, folded from the job alone (no event or read of its own).

A learner's RANK is its learner index (`node_agent.rendezvous.places`), so rank r is learner r.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from controlplane.jobs.lifecycle import Job, JobStatus


class Rank(BaseModel):
    """One learner of the job's current attempt."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(
        ge=0, description="its RANK in the job's process group, which is its learner index"
    )
    node: str | None = Field(
        description="the node it runs on (ran on, once the job ended); null while the attempt "
        "is not placed (and for an attempt of several nodes placed before each learner's node "
        "was recorded)"
    )
    gpus: list[str] = Field(
        description="the UUIDs of its GPUs (gpus_per_learner of the job's `gpus`, in rank "
        "order); empty while the attempt is not placed"
    )
    state: JobStatus = Field(
        description="its phase: the job's state, or the phase it reached ahead of learners "
        "still catching up; COMPLETED once it exited 0 while other ranks still run"
    )
    exit_code: int | None = Field(
        description="its exit code once it exited: 0 when it completed; null while it runs, "
        "and for a job that FAILED or was CANCELLED, whose exit_codes do not say which rank "
        "each is"
    )


def ranks(job: Job) -> list[Rank]:
    """The ranks of the job's current attempt, by rank."""
    learners = job.manifest.learners
    each = job.manifest.gpus_per_learner
    return [
        Rank(
            rank=rank,
            node=_node(job, rank),
            # The claim lists the GPUs learner by learner, each learner's gpus_per_learner.
            gpus=job.gpus[rank * each : (rank + 1) * each],
            state=_state(job, rank),
            exit_code=0 if _completed(job, rank) else None,
        )
        for rank in range(learners)
    ]


def _completed(job: Job, rank: int) -> bool:
    # A job completes only once every learner exited 0 (`decide` refuses other codes).
    return job.state is JobStatus.COMPLETED or rank in job.exited


def _state(job: Job, rank: int) -> JobStatus:
    if _completed(job, rank):
        return JobStatus.COMPLETED
    if job.state.terminal:
        return job.state
    return job.learner_phases.get(rank, job.state)


def _node(job: Job, rank: int) -> str | None:
    if rank < len(job.learner_nodes):
        return job.learner_nodes[rank]
    # An attempt placed before each learner's node was recorded: known when there is one.
    return job.nodes[0] if len(job.nodes) == 1 else None

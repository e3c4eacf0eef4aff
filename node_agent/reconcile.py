"""What a (re)starting agent does with what an earlier agent of its node left behind: a pure
function of the node's live allocations, their jobs as their events tell, and the learners the
runtime found running.

- An allocation whose job is still running that very attempt and epoch is carried on here: its
  learners that run are adopted, the others are looked for (ended while no agent watched) or
  started.
- Every other allocation is over (its job was cancelled, finished, or restarted elsewhere while
  the agent was down): it is released.
- A running learner that no carried-on attempt accounts for is stale (its epoch is fenced): it is
  killed, never resumed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from uuid import UUID

# The pure values only: the planner runs without a database driver (test_claim_order.py).
from controlplane.agent_port.values import Allocation, Claim, LearnerAllocation
from controlplane.jobs.lifecycle import Job
from node_agent.runtime import FoundLearner


@dataclass(frozen=True, slots=True)
class VersionedJob:
    job: Job
    version: int
    """Its stream's version: requests after it are carried to the learners."""


@dataclass(frozen=True, slots=True)
class Resumed:
    claim: Claim
    running: dict[int, FoundLearner] = field(default_factory=dict)
    """The attempt's learners found running, by learner index."""


@dataclass(frozen=True, slots=True)
class Plan:
    resume: list[Resumed]
    release: list[tuple[UUID, int]]
    """(job, attempt) allocations that are over."""
    kill: list[FoundLearner]


def plan(
    allocations: Sequence[Allocation],
    jobs: Mapping[UUID, VersionedJob],
    found: Sequence[FoundLearner],
) -> Plan:
    attempts: dict[tuple[UUID, int], list[Allocation]] = {}
    for allocation in allocations:
        attempts.setdefault((allocation.job_id, allocation.attempt), []).append(allocation)
    resume: list[Resumed] = []
    release: list[tuple[UUID, int]] = []
    for (job_id, attempt), learners in attempts.items():
        current = jobs.get(job_id)
        epoch = learners[0].epoch
        if current is None or not _runs(current.job, attempt, epoch):
            release.append((job_id, attempt))
            continue
        claim = Claim(
            job=current.job,
            attempt=attempt,
            epoch=epoch,
            learners=_placement(current.job, learners),
            version=current.version,
        )
        running = {
            f.learner: f
            for f in found
            if (f.job_id, f.attempt, f.epoch) == (job_id, attempt, epoch)
        }
        resume.append(Resumed(claim, running))
    kept = {f for r in resume for f in r.running.values()}
    return Plan(resume, release, [f for f in found if f not in kept])


def _placement(job: Job, here: Sequence[Allocation]) -> list[LearnerAllocation]:
    """Every learner of the attempt, this node's with their GPUs and the others' on their
    nodes (their GPUs are not this node's to know): a learner's rank, world size and node rank
    come from the whole placement, not from the learners on this node. This node's alone when
    the job's record has no placement (an attempt placed before it was recorded)."""
    mine = {a.learner: LearnerAllocation(a.learner, a.node, a.gpus) for a in here}
    if not set(mine) <= set(range(len(job.learner_nodes))):
        return [mine[index] for index in sorted(mine)]
    return [
        mine.get(index, LearnerAllocation(index, node, []))
        for index, node in enumerate(job.learner_nodes)
    ]


def _runs(job: Job, attempt: int, epoch: int) -> bool:
    return job.state.running and job.attempt == attempt and job.epoch == epoch

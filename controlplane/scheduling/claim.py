"""A claim's outcome as a pure record: what the claim transaction (agents/claims.py) returns,
and what an agent, its attempts and its crash reconciliation work from."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.jobs.lifecycle import Job
from controlplane.scheduling.placement import LearnerAllocation


@dataclass(frozen=True, slots=True)
class Claim:
    """A job attempt placed on nodes: its learners' nodes and GPUs, and the fencing epoch."""

    job: Job
    attempt: int
    epoch: int
    learners: list[LearnerAllocation]
    version: int
    """The job stream's version once the claim's event is in."""
    trace: dict[str, str] = field(default_factory=dict)
    """The claim's span (in the job's trace), for the attempt's spans to continue; empty for
    an attempt an agent took over (after a restart, or placed on it by another node's claim),
    whose spans then start a trace of their own."""

    @property
    def gpus(self) -> list[str]:
        return [gpu for learner in self.learners for gpu in learner.gpus]

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(learner.node for learner in self.learners))

    def on(self, node: str) -> list[LearnerAllocation]:
        """The learners that `node` runs."""
        return [learner for learner in self.learners if learner.node == node]

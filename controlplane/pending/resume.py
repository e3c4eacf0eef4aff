"""The walk of `reasons.assess`, resumed where the last one's inputs still hold: the recorder
judges the whole queue every round, and with a burst of thousands of queued jobs most rounds
change only its end (new jobs) or one place in it (a cancellation, a backoff that ended).

The walk is a fold over the queue in the policy's order: a job's reasons depend only on the
cluster, the tenants, the order, the instant (through whether its backoff still holds) and the
jobs ahead of it. So where the cluster, the tenants and the order are as the last walk had them,
the jobs up to the first place where the queue differs from the last walk's (a job new, gone,
changed, or its backoff over) are judged as they were, and the walk goes on from there, from the
state it had kept at that point (`Ahead`, kept every CHECKPOINT jobs and at the end). Anything
else (a claim, which changes a node's room and its tenant's GPUs; a node's change; a tenant's
or the policy's) walks the whole queue again. A new job that the order puts in the middle of
the queue (under fair share, a tenant's new job goes where its share puts it) resumes there:
the jobs after it are walked again, as they must be.

The result is the whole walk's, by construction; tests/controlplane/pending/test_resume.py holds
the two equal over generated sequences of arrivals, claims, cancellations and time passing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.pending.reasons import Ahead, Assessment, NodeRoom, Walk
from controlplane.scheduling.claim_order import QueuedJob, TenantShare
from controlplane.scheduling.policy import Order

CHECKPOINT = 64
"""How many jobs apart the walk's state is kept: a resumed walk walks again at most this many
jobs before the first that changed. Each state kept copies every node's free room."""

Key = tuple[QueuedJob, bool]
"""A job as the walk judges it: its queue row, and whether its backoff holds at the instant."""


@dataclass(frozen=True, slots=True)
class _Walked:
    context: tuple[list[NodeRoom], list[TenantShare], Order]
    keys: list[Key]
    assessed: list[Assessment]
    kept: dict[int, Ahead]
    """The state before the job at each index (every CHECKPOINT, and the end): never taken
    from, only copied."""


class ResumedWalk:
    """`reasons.assess` over a queue already in the policy's order, resumed from the last
    call's walk where its inputs still hold. Not thread-safe: one recorder's rounds, one at a
    time."""

    def __init__(self, checkpoint: int = CHECKPOINT) -> None:
        self._checkpoint = checkpoint
        self._last: _Walked | None = None
        self.walked = 0
        """How many jobs the last call walked (the others' assessments were the last call's)."""

    def assess(
        self,
        nodes: Sequence[NodeRoom],
        tenants: Sequence[TenantShare],
        ordered: Sequence[QueuedJob],
        *,
        now: datetime,
        order: Order,
    ) -> list[Assessment]:
        """What `assess(nodes, tenants, ordered, now=now, order=order)` returns, where
        `ordered` is the queue in `order` (`reasons.queue_order`)."""
        context = (list(nodes), list(tenants), order)
        keys = [(job, job.not_before is not None and job.not_before > now) for job in ordered]
        last = self._last
        resume_at = 0
        if last is not None and last.context == context:
            same = _common(last.keys, keys)
            resume_at = max(at for at in last.kept if at <= same)
        walk = Walk(nodes, tenants, now=now, order=order)
        if last is not None and resume_at:
            ahead = last.kept[resume_at].copy()
            assessed = last.assessed[:resume_at]
            kept = {at: state for at, state in last.kept.items() if at <= resume_at}
        else:
            ahead, assessed, kept = walk.start(), [], {}
            kept[0] = ahead.copy()
        for index in range(resume_at, len(ordered)):
            if index % self._checkpoint == 0 and index not in kept:
                kept[index] = ahead.copy()
            assessed.append(walk.step(ahead, ordered[index], index + 1))
        kept[len(ordered)] = ahead
        # Kept only once the walk is whole: one that failed part way leaves the last one.
        self._last = _Walked(context, keys, assessed, kept)
        self.walked = len(ordered) - resume_at
        return list(assessed)


def _common(before: Sequence[Key], now: Sequence[Key]) -> int:
    """How many jobs from the front the two walks have alike."""
    for index, (was, is_) in enumerate(zip(before, now, strict=False)):
        if was != is_:
            return index
    return min(len(before), len(now))

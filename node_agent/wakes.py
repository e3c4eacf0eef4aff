"""What wakes a node agent, and what each wake makes it do: pure, so that every case is tested
without a database.

An agent LISTENs on two channels that the `jobs` projection notifies (its `CLAIMABLE_CHANNEL`
and `REQUESTS_CHANNEL`), never on every append: on a busy cluster the learners' reports are
hundreds of commits a second, and each wake of every agent costs queries. A notification is
still only a hint: a round every `poll_s` does everything, and so does a wake-up that no
channel counts (the listener reconnected, and may have missed notifications meanwhile).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Heard:
    """What the agent's listener had counted at some moment (see `LogListener.notified`)."""

    wakes: int
    """Every wake-up: the notifications of both channels, and the listener's own."""
    claimable: int
    requests: int


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of the agent's work does."""

    requests: bool
    """Carry cancel and checkpoint requests (and attempts over elsewhere) to running learners,
    and account for allocations that no attempt here runs (learners another node's claim
    placed here)."""
    claim: bool
    """Claim while the node has a GPU free (`gpu_free`)."""
    changed: bool
    """The agent's own learners changed (one ended): claim whether a GPU looks free or not (a
    CPU job may fit beside the others)."""


def round_after(before: Heard, after: Heard, *, changed: bool, polled: bool) -> Round:
    """What to do after the listener went from `before` to `after`; `changed`: the agent's
    own learners changed meanwhile; `polled`: the fallback poll is due."""
    claimable = after.claimable - before.claimable
    requests = after.requests - before.requests
    if polled or after.wakes - before.wakes > claimable + requests:
        return Round(requests=True, claim=True, changed=changed)
    return Round(requests=requests > 0, claim=claimable > 0, changed=changed)


def gpu_free(gpus: Collection[str], unhealthy: Collection[str], held: Collection[str]) -> bool:
    """Whether a claim woken by a claimable job (or the poll) may take anything: the node has
    a healthy GPU that none of its learners holds. A node whose GPUs are all held cannot take
    a GPU job, and a thousand full nodes must not each claim for every job submitted; its CPU
    jobs wait until one of its learners ends (`Round.changed`) or a poll finds a GPU free. A
    node with no healthy GPU at all (a CPU node) takes only CPU jobs, and nothing cheaper than
    the claim itself says whether one fits: it claims."""
    usable = [gpu for gpu in gpus if gpu not in unhealthy]
    return not usable or any(gpu not in held for gpu in usable)

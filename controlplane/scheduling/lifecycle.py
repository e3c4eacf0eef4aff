"""The claim policy as its stream (`scheduling-policy`) has it, and how a change is decided on
it: the scheduling aggregate for the command path (events/commands.py). No I/O here.

Setting the policy in force changes nothing and writes nothing: the record shows switches
only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.events.commands import Aggregate
from controlplane.refusals import Refusal, Refused
from controlplane.scheduling.events import SchedulingEvent, SchedulingPolicySet
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """Claims follow `policy` from now on."""

    policy: ClaimPolicy
    actor: str
    reason: str | None
    at: datetime


def decide(command: SetPolicy, policy: ClaimPolicy) -> Sequence[SchedulingEvent]:
    if command.policy == policy:
        return []
    return [
        SchedulingPolicySet(
            order=command.policy.order,
            quotas=command.policy.quotas,
            actor=command.actor,
            reason=command.reason,
            at=command.at,
        )
    ]


def evolve(policy: ClaimPolicy, event: SchedulingEvent) -> ClaimPolicy:
    match event:
        case SchedulingPolicySet():
            return event.policy
    return policy


def _busy(stream_id: str, tries: int) -> Refusal:
    # Operators switching at once, again and again: the command gave up.
    message = f"{stream_id} kept changing; gave up after {tries} tries; nothing was written"
    return Refusal(Refused.CONFLICT, message)


POLICY: Aggregate[SetPolicy, ClaimPolicy, SchedulingEvent] = Aggregate(
    event_type=SchedulingEvent, initial=DEFAULT, decide=decide, evolve=evolve, busy=_busy
)
"""The scheduling stream, for the command path."""

"""The hints that wake an agent: NOTIFY channels heard on one LISTEN connection (claimable jobs,
requests for running jobs, deployments' queued tasks and inference turns), counted by
`Wakeups`. Without a connection (`listen` False) every wait ends at the poll interval, which
is all a port without Postgres needs (`polling`)."""

from __future__ import annotations

from controlplane.database import AGENT_ROLE
from controlplane.deployments.wakeups import INFERENCE, Wakeups, queue_key
from controlplane.events.subscription import LogListener
from controlplane.jobs.projection import CLAIMABLE_CHANNEL, REQUESTS_CHANNEL

__all__ = [
    "CLAIMABLE_CHANNEL",
    "INFERENCE",
    "REQUESTS_CHANNEL",
    "LogListener",
    "Wakeups",
    "agent_wakeups",
    "polling",
    "queue_key",
]


def agent_wakeups(url: str, *, poll_s: float, listen: bool) -> Wakeups:
    """One LISTEN connection (as the agent role) for all of an agent's channels: its claim and
    request hints and its replicas' serving hints (counted by key, waking no claim); always
    direct, as LISTEN does not survive transaction pooling. None at all when `listen` is False."""
    return Wakeups(
        url,
        also=(CLAIMABLE_CHANNEL, REQUESTS_CHANNEL),
        poll_interval=poll_s,
        role=AGENT_ROLE,
        listen=listen,
    )


def polling(poll_s: float) -> Wakeups:
    """Wakeups that never connect: every wait ends after `poll_s` (an agent on a port without
    Postgres, as under `MemoryPort`)."""
    return Wakeups(
        "", also=(CLAIMABLE_CHANNEL, REQUESTS_CHANNEL), poll_interval=poll_s, listen=False
    )

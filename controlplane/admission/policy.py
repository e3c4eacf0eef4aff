"""One admission policy for everything a tenant's command makes take room: what the tenant holds
now, plus what the command asks for, against the tenant's limits. Pure: the usage comes from
the database (`admission.usage`), the limits from the tenant's stream.

A command is refused when any quantity it asks for would pass its limit: INVALID (422) when the
ask alone is more than the limit (it could never be admitted as it is), LIMITED (429) when what
the tenant holds now leaves no room for it (it may be once some of that ends). Nothing is
written either way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from controlplane.jobs.manifest import JobManifest
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.limits import TenantLimits


@dataclass(frozen=True, slots=True)
class Room:
    """Quantities of what a tenant holds, or of what a command asks for; each is the
    TenantLimits field of the same name."""

    queued_jobs: int = 0
    cpus: float = 0.0
    memory_mb: int = 0
    deployments: int = 0
    replicas: int = 0
    searches: int = 0
    queued_predictions: int = 0
    artifact_bytes: int = 0

    def __add__(self, other: Room) -> Room:
        return Room(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(Room)}
        )


NOTHING = Room()


def job_room(manifest: JobManifest) -> Room:
    """What submitting a job asks for: a place in the queue and, unless it is an inference job
    (whose deployment's replicas hold the nodes), its learners' CPUs and memory."""
    if manifest.inference is not None:
        return Room(queued_jobs=1)
    return Room(
        queued_jobs=1,
        cpus=manifest.learners * manifest.cpus,
        memory_mb=manifest.learners * manifest.memory_mb,
    )


def replica_room(replicas: int, cpus: float, memory_mb: int) -> Room:
    """What `replicas` more replicas of a deployment ask for, each with `cpus` and
    `memory_mb`."""
    return Room(replicas=replicas, cpus=replicas * cpus, memory_mb=replicas * memory_mb)


WHAT = {
    "queued_jobs": "jobs QUEUED",
    "cpus": "CPUs asked for by live jobs",
    "memory_mb": "MiB of memory asked for by live jobs",
    "deployments": "deployments",
    "replicas": "deployment replicas",
    "searches": "searches running",
    "queued_predictions": "prediction items waiting or running",
    "artifact_bytes": "bytes of model artifacts",
}
"""How a message names each quantity."""


def refusal(tenant: str, limits: TenantLimits, held: Room, asked: Room) -> Refusal | None:
    """The first limit `asked` on top of `held` would pass, if any (only quantities asked for
    are checked: a tenant over a limit the admin lowered may still do what takes none of it)."""
    for quantity in fields(Room):
        name = quantity.name
        ask, have, limit = getattr(asked, name), getattr(held, name), getattr(limits, name)
        if ask <= 0 or have + ask <= limit:
            continue
        what = WHAT[name]
        if ask > limit:
            # The tenant may never hold this much: the admin's limit forbids it, whatever ends.
            return Refusal(
                Refused.FORBIDDEN,
                f"this asks for {ask:g} {what}, more than tenant {tenant!r} may hold at all "
                f"({name} limit {limit:g})",
                field=name,
            )
        return Refusal(
            Refused.LIMITED,
            f"tenant {tenant!r} holds {have:g} {what} and this asks for {ask:g} more: its "
            f"{name} limit is {limit:g}; try again once some of them have ended",
            field=name,
        )
    return None

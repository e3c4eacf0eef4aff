"""What a replay takes and gives back, as values. Times are virtual: seconds after the
workload's origin (a float keeps a microsecond for centuries), so that the replay does no
datetime arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from controlplane.scheduling.claim_order import QueuedJob, total_gpus
from controlplane.scheduling.policy import DEFAULT, ClaimPolicy


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """A node registered (again): READY with this room."""

    node: str
    cpus: float
    memory_mb: int
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True, slots=True)
class GpuFailed:
    """A GPU takes no new work from now on."""

    node: str
    uuid: str


@dataclass(frozen=True, slots=True)
class NodeLeft:
    """A node was declared lost, or deregistered: it offers nothing from now on."""

    node: str


@dataclass(frozen=True, slots=True)
class TenantSet:
    """A tenant's weight and GPU quota from now on (created, or updated)."""

    name: str
    weight: float
    gpu_quota: int | None


Change = NodeJoined | GpuFailed | NodeLeft | TenantSet


@dataclass(frozen=True, slots=True)
class Timed:
    at: float
    change: Change


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job as it ran: the replay runs it as long."""

    run_s: float | None
    """From its claim to its end; None: until the job is stopped (`JobSpec.stop`)."""
    backoff_s: float = 0.0
    """How long after its end the job waited before it could be claimed again (its restart's
    backoff); 0 for the last."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job as the replay submits it."""

    queued: QueuedJob
    """Its queue row: tenant, demand, priority, submission time (the order's, unchanged)."""
    submitted: float
    attempts: tuple[Attempt, ...]
    """Never empty: a job that never ran has one attempt that runs until it is stopped."""
    stop: float | None
    """When it was cancelled (or failed while queued), or when the log ends for a job that
    had not ended by then: the replay stops it there, queued or running. None: it ended on its
    own."""


@dataclass(frozen=True, slots=True)
class Run:
    """An attempt holding its GPUs, from its claim to its end."""

    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a job: in the replay, or in the recorded past."""

    job_id: UUID
    tenant: str
    gpus: int
    """GPUs it holds while it runs (all its learners')."""
    submitted: float
    runs: tuple[Run, ...]
    end: float | None
    """When it ended (completed, failed, cancelled); None: it had not."""
    order: int | None
    """Its place among the jobs' first claims (0 first); None: never claimed."""

    @property
    def start(self) -> float | None:
        return self.runs[0].start if self.runs else None


@dataclass(frozen=True, slots=True)
class Workload:
    """The recorded past, ready to replay."""

    origin: datetime
    """Virtual time 0: the window's start, or earlier, where no job was queued or running."""
    since: float
    """The window's start: the report covers the jobs submitted from here ..."""
    until: float | None
    """... until here (None: the log's end)."""
    changes: tuple[Timed, ...]
    """Nodes' and tenants' changes, in the log's order; those before the origin at 0."""
    jobs: tuple[JobSpec, ...]
    """Every job submitted from the origin until `until`, in the log's order."""
    recorded: tuple[Outcome, ...]
    """What really became of each of `jobs`, in the same order."""
    release_delay_s: float
    """How long a busy GPU really took to be claimed again after a job's end (the agent
    stores the job's last lines, removes its learners, releases its GPUs, claims): the
    replay holds GPUs that long after each attempt."""
    policy: ClaimPolicy = DEFAULT
    """The claim policy in force when the log was read (its last SchedulingPolicySet's): what
    claims follow now, and what `current` replays."""

    def reported(self, outcome: Outcome) -> bool:
        """Whether the report covers this job: submitted inside the window."""
        return self.since <= outcome.submitted and (
            self.until is None or outcome.submitted < self.until
        )


def gpus_of(job: JobSpec) -> int:
    return total_gpus(job.queued.demand)

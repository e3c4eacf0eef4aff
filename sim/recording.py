"""A workload read from recorded events, pure: what the replay needs of the past, and what
really became of each job.

- Tenants: their weight and quota as created and updated. Nodes: registered (again, with their
  room and GPUs), a GPU gone unhealthy, lost or deregistered.
- Jobs: each job submitted in the window (inference jobs left out: they hold no node), with its
  demand, priority and tenant, and its attempts as they ran: each from its claim
  (`JobDeploying`) to the event that ended it (`JobCompleted`, `JobFailed`, `JobRestarted`,
  `DeploymentRolledBack`), and the restart's backoff after it (`not_before`). The replay runs
  each attempt as long, and keeps a job waiting as long between attempts, whatever node it
  lands on: a restart is the job's own history. Only a node lost in the replay restarts what
  the replay runs there (see `engine.py`).
- A job cancelled (or failed) while queued leaves the queue at that instant; one cancelled while
  running runs until that instant, however late the replay started it. A job that had not
  ended when the log was read is stopped at the log's end (the last event's time).
- The window: jobs submitted from `since` until `until`. The replay starts earlier where jobs
  submitted before `since` were still queued or running then: at the last instant before
  `since` at which none was (so no job's fate depends on what came before), and replays those
  jobs too; the report covers the window's only.
- The release delay: how long a busy GPU took to be claimed again after an attempt's end (the
  median over the claims of jobs that were already waiting then); the replay holds GPUs that
  much longer after every attempt, as the agents did.
- The claim policy in force at the log's end (the last `SchedulingPolicySet`; the default
  without one): what `current` replays.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

from controlplane.agents.events import NodeDeregistered, NodeGpuUnhealthy, NodeLost, NodeRegistered
from controlplane.events.records import RecordedEvent
from controlplane.jobs.events import (
    DeploymentRolledBack,
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobFailed,
    JobRestarted,
    JobSubmitted,
)
from controlplane.scheduling.claim_order import QueuedJob
from controlplane.scheduling.events import SchedulingPolicySet
from controlplane.scheduling.policy import DEFAULT
from controlplane.scheduling.streams import CATEGORY as SCHEDULING
from controlplane.scheduling.unschedulable import demand_of
from controlplane.tenants.events import TenantCreated, TenantUpdated
from controlplane.tenants.streams import tenant_of
from sim.workload import (
    Attempt,
    Change,
    Gpu,
    GpuFailed,
    JobSpec,
    NodeJoined,
    NodeLeft,
    Outcome,
    Run,
    TenantSet,
    Timed,
    Workload,
)

CATEGORIES = ("job", "node", "tenant", SCHEDULING)
"""The streams a workload is read from."""
TIMED = ("job", "node", "tenant")
"""Those whose events' instants are the workload's (a policy's switch ends no job)."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FOREVER = datetime.max.replace(tzinfo=UTC)


Virtual = Callable[[datetime], float]
"""An instant as seconds after the workload's origin."""


@dataclass(frozen=True, slots=True)
class _Held:
    """An attempt as it really ran."""

    start: datetime
    end: datetime | None
    """None: still running when the log ends."""
    gpus: tuple[str, ...]
    position: int
    """Its claim's place in the log: orders claims recorded at the same instant."""
    waiting_since: datetime
    """When the job could first have been claimed for it."""
    open_ended: bool
    """Cut short by the job's cancellation, or by the log's end: how long it would have run is
    unknown, so the replay runs it until the job is stopped."""
    backoff_s: float


@dataclass(slots=True)
class _History:
    """A job's recorded life, as read so far."""

    submitted: JobSubmitted
    held: list[_Held] = field(default_factory=list)
    claim: tuple[JobDeploying, int] | None = None
    """The running attempt's claim and its place in the log."""
    waiting_since: datetime | None = None
    stopped: datetime | None = None
    ended: datetime | None = None

    def record(self, recorded: RecordedEvent) -> None:
        match recorded.event:
            case JobDeploying() as claim:
                self.claim = (claim, recorded.position)
            case JobRestarted(at=at, not_before=not_before):
                backoff = max((not_before - at).total_seconds(), 0.0) if not_before else 0.0
                self._close(at, backoff_s=backoff, open_ended=False)
                self.waiting_since = not_before or at
            case DeploymentRolledBack(at=at):
                self._close(at, backoff_s=0.0, open_ended=False)
                self.waiting_since = at
            case JobCompleted(at=at) | JobFailed(at=at) | JobCancelled(at=at):
                cancelled = isinstance(recorded.event, JobCancelled)
                if cancelled or self.claim is None:
                    self.stopped = at  # the user's decision, or it left the queue
                self._close(at, backoff_s=0.0, open_ended=cancelled)
                self.ended = at

    def finish(self, log_end: datetime) -> None:
        """The log ends: a job still running or queued is stopped there."""
        if self.ended is None:
            self._close(None, backoff_s=0.0, open_ended=True)
            self.stopped = log_end

    def _close(self, at: datetime | None, *, backoff_s: float, open_ended: bool) -> None:
        if self.claim is None:
            return
        claim, position = self.claim
        waiting = self.waiting_since or self.submitted.at
        held = _Held(claim.at, at, tuple(claim.gpus), position, waiting, open_ended, backoff_s)
        self.held.append(held)
        self.claim = None


def workload_of(
    events: Sequence[RecordedEvent], since: datetime | None, until: datetime | None
) -> Workload:
    """The workload of the jobs submitted from `since` until `until` (None: the log's ends),
    read from every recorded job, node, tenant and scheduling event, in the log's order."""
    histories: dict[str, _History] = {}
    infrastructure: list[tuple[datetime, Change]] = []
    log_end: datetime | None = None
    policy = DEFAULT
    for recorded in events:
        if isinstance(recorded.event, SchedulingPolicySet):
            policy = recorded.event.policy
            continue
        at = _instant(recorded)
        if at is None:
            continue
        log_end = at if log_end is None else max(log_end, at)
        match recorded.event:
            case JobSubmitted(manifest=manifest) as submitted if manifest.inference is None:
                histories[recorded.stream_id] = _History(submitted)
            case NodeRegistered(cpus=cpus, memory_mb=memory_mb, gpus=gpus):
                offered = tuple(Gpu(g.index, g.uuid, g.healthy) for g in gpus)
                infrastructure.append((at, NodeJoined(_node(recorded), cpus, memory_mb, offered)))
            case NodeGpuUnhealthy(uuid=uuid):
                infrastructure.append((at, GpuFailed(_node(recorded), uuid)))
            case NodeLost() | NodeDeregistered():
                infrastructure.append((at, NodeLeft(_node(recorded))))
            case TenantCreated(name=name, weight=weight, gpu_quota=quota):
                infrastructure.append((at, TenantSet(name, weight, quota)))
            case TenantUpdated(weight=weight, gpu_quota=quota):
                infrastructure.append((at, TenantSet(tenant_of(recorded.stream_id), weight, quota)))
            case _:
                history = histories.get(recorded.stream_id)
                if history is not None:
                    history.record(recorded)
    end = log_end or since or EPOCH
    for history in histories.values():
        history.finish(end)
    origin = _origin(list(histories.values()), since, end)
    replayed = [
        h
        for h in histories.values()
        if origin <= h.submitted.at and (until is None or h.submitted.at < until)
    ]

    def virtual(instant: datetime) -> float:
        return max((instant - origin).total_seconds(), 0.0)

    return Workload(
        origin=origin,
        since=virtual(since) if since is not None else 0.0,
        until=virtual(until) if until is not None else None,
        changes=tuple(Timed(virtual(at), change) for at, change in infrastructure),
        jobs=tuple(_spec(h, virtual) for h in replayed),
        recorded=_outcomes(replayed, virtual),
        release_delay_s=_release_delay(replayed),
        policy=policy,
    )


def _instant(recorded: RecordedEvent) -> datetime | None:
    """When the event happened; None for the events a workload does not read."""
    at = getattr(recorded.event, "at", None)
    return at if isinstance(at, datetime) and recorded.category in TIMED else None


def _node(recorded: RecordedEvent) -> str:
    return recorded.stream_id.partition("-")[2]


def _origin(histories: list[_History], since: datetime | None, log_end: datetime) -> datetime:
    """Where the replay starts: `since`, or earlier while the jobs submitted before it were
    queued or running without a break; the first submission without `since`."""
    if since is None:
        return min((h.submitted.at for h in histories), default=log_end)
    start, busy_until = since, None
    for history in sorted(histories, key=lambda h: h.submitted.at):
        submitted = history.submitted.at
        if submitted >= since:
            break
        ended = history.ended or FOREVER
        if busy_until is None or submitted > busy_until:
            start, busy_until = submitted, ended  # idle before it: a busy period starts
        else:
            busy_until = max(busy_until, ended)
    return start if busy_until is not None and busy_until > since else since


def _spec(history: _History, virtual: Virtual) -> JobSpec:
    submitted = history.submitted
    manifest = submitted.manifest
    attempts = [
        Attempt(
            None
            if held.open_ended or held.end is None
            else (held.end - held.start).total_seconds(),
            held.backoff_s,
        )
        for held in history.held
    ]
    if not attempts or (history.stopped is not None and not history.held[-1].open_ended):
        # It was last waiting in the queue: the replay's next attempt runs until it is stopped.
        attempts.append(Attempt(None))
    queued = QueuedJob(
        job_id=submitted.job_id,
        tenant=submitted.tenant,
        demand=demand_of(manifest),
        priority=manifest.priority,
        submitted_at=submitted.at,
        not_before=None,
    )
    stop = virtual(history.stopped) if history.stopped is not None else None
    return JobSpec(queued, virtual(submitted.at), tuple(attempts), stop)


def _outcomes(histories: list[_History], virtual: Virtual) -> tuple[Outcome, ...]:
    """What really became of each job; its order among the first claims by their recorded
    instants (and places in the log)."""
    claimed = sorted(
        (h for h in histories if h.held), key=lambda h: (h.held[0].start, h.held[0].position)
    )
    order = {h.submitted.job_id: place for place, h in enumerate(claimed)}
    return tuple(
        Outcome(
            job_id=h.submitted.job_id,
            tenant=h.submitted.tenant,
            gpus=h.submitted.manifest.total_gpus,
            submitted=virtual(h.submitted.at),
            runs=tuple(
                Run(virtual(held.start), virtual(held.end or h.stopped or held.start))
                for held in h.held
            ),
            end=virtual(h.ended) if h.ended is not None else None,
            order=order.get(h.submitted.job_id),
        )
        for h in histories
    )


def _release_delay(histories: list[_History]) -> float:
    """The median time from an attempt's end to the next claim of one of its GPUs, over the
    claims of jobs that were already waiting when that GPU came free: the time a node takes
    to hand a busy GPU on (0 when nothing was handed on)."""
    by_gpu: dict[str, list[_Held]] = defaultdict(list)
    for history in histories:
        for held in history.held:
            for gpu in held.gpus:
                by_gpu[gpu].append(held)
    freed: dict[int, datetime] = {}
    """For each attempt (by its claim's place in the log), when the last of its GPUs'
    previous holders ended."""
    for attempts in by_gpu.values():
        attempts.sort(key=lambda held: (held.start, held.position))
        for before, after in pairwise(attempts):
            if before.end is not None and before.end <= after.start:
                freed[after.position] = max(freed.get(after.position, before.end), before.end)
    delays = [
        (held.start - freed[held.position]).total_seconds()
        for history in histories
        for held in history.held
        if held.position in freed and held.waiting_since <= freed[held.position]
    ]
    return statistics.median(delays) if delays else 0.0

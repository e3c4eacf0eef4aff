"""The `jobs` projection: `job_status` (one row per job, its folded state), `job_history`
(every event of every job with the state it left, its time, actor and reason) and `job_counts`
(how many jobs each tenant has in each state, in all and by each label pair, and the CPUs and
memory their learners ask for). It also deletes the secret environment (`job_secret_env`) of
jobs that have ended; that table is not its own (a rebuild must not empty it: jobs still
running need their secrets)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from uuid import UUID

from controlplane.database import Executor
from controlplane.events.records import RecordedEvent
from controlplane.events.types import Event
from controlplane.jobs.events import (
    CheckpointRequested,
    DeploymentRolledBack,
    JobCancelled,
    JobDeploying,
    JobEvent,
    JobFailed,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.lifecycle import JOB, Job, JobStatus, evolve
from controlplane.jobs.streams import CATEGORY, job_id_of
from controlplane.queries import Q

CLAIMABLE = (JobSubmitted, JobRestarted, DeploymentRolledBack)
"""Events after which a job waits in the queue."""
CLAIMABLE_CHANNEL = "trainyard_claimable"
"""NOTIFYed when a batch made jobs claimable: wakes the node agents' claims (a hint; they also
poll)."""
REQUESTS_CHANNEL = "trainyard_requests"
"""NOTIFYed when a batch holds an event that node agents act on besides their claims (see
`requested`): wakes them to carry it to their learners (a hint; they also poll)."""
CPUS_SCALE = Decimal("0.000000")
"""The counters' CPUs are in millionths (job_counts.cpus, numeric(24, 6)); zero at that scale."""
KEPT = 2048
"""How many live jobs' docs the projection keeps between batches (the most recently moved): a
job's next event is most often a moment away (its claim, its phases, its end), and its doc need
not then be read again (see `job_docs`). Kept as the JSON text the projection wrote, one
string each (about 1.5 KiB), not as the folded `Job`: a `Job` is some 21 objects that the cyclic
garbage collector tracks, and in the API's process, which applies the projections, every full
collection walked the 43,000 of 2,048 kept jobs, holding the event loop 11 to 35 ms on a 2-core
machine (submit p99 22 to 35 ms in `bench api`, 15 to 18 without them, 2026-12-02); a string is
never walked (1 to 3 ms). Parsing the text again costs about 22 us a job."""


class JobsProjection:
    name = "jobs"
    tables: Sequence[str] = ("job_status", "job_history", "job_counts")
    categories: frozenset[str] | None = frozenset({CATEGORY})

    def __init__(self) -> None:
        self._kept: OrderedDict[UUID, tuple[int, str]] = OrderedDict()
        """Jobs' docs as this projection last wrote them, with their rows' versions: used only
        where the row still has that version (a batch rolled back, or another replica's, leaves
        it at another), never trusted alone."""

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        # The runner hands it only the events of job streams (`categories`), all JobEvents.
        mine = [e for e in events if isinstance(e.event, JobEvent)]
        if not mine:
            return
        ids = list(dict.fromkeys(job_id_of(e.stream_id) for e in mine))
        # Four statements a batch, however many events: each job is read, folded over all of
        # its events in the batch and written once, the history rows go in together, and so do
        # the counters the batch moved.
        jobs: dict[UUID, Job | None] = dict.fromkeys(ids)
        kept = self._kept
        held = [kept[job_id][0] if job_id in kept else 0 for job_id in ids]
        for row in await conn.fetch(Q["job_docs"], ids, held):
            doc = row["doc"]
            jobs[row["job_id"]] = Job.model_validate_json(
                kept[row["job_id"]][1] if doc is None else doc
            )
        before = {job_id: job.state for job_id, job in jobs.items() if job is not None}
        versions: dict[UUID, int] = {}
        history: list[tuple[Any, ...]] = []
        for recorded in mine:
            job_id = job_id_of(recorded.stream_id)
            event = JOB.event_of(recorded)
            job = evolve(jobs[job_id], event)
            jobs[job_id] = job
            versions[job_id] = recorded.stream_version
            history.append(
                (
                    job_id,
                    recorded.stream_version,
                    recorded.position,
                    event.type_name,
                    job.state.value,
                    job.attempt,
                    event.at,
                    recorded.metadata.actor,
                    reason(event),
                )
            )
        folded = [(versions[job_id], job) for job_id, job in jobs.items() if job is not None]
        docs = [job.model_dump_json() for _, job in folded]
        self._keep(folded, docs)
        await conn.execute(
            Q["upsert_job_status"],
            [job.job_id for _, job in folded],
            [job.tenant for _, job in folded],
            [job.manifest.name for _, job in folded],
            [job.state.value for _, job in folded],
            [job.attempt for _, job in folded],
            [job.restarts for _, job in folded],
            [job.manifest.priority for _, job in folded],
            [json.dumps(job.manifest.labels) for _, job in folded],
            [job.submitted_at for _, job in folded],
            [job.updated_at for _, job in folded],
            [version for version, _ in folded],
            docs,
            [job.not_before for _, job in folded],
        )
        await conn.execute(Q["insert_job_history"], *map(list, zip(*history, strict=True)))
        moved = counts_moved(before, [job for _, job in folded])
        if moved:
            await conn.execute(Q["move_job_counts"], *map(list, zip(*moved, strict=True)))
        ended = [job.job_id for _, job in folded if job.state.terminal]
        if ended:
            await conn.execute(Q["delete_job_secret_env"], ended)
        # Node agents are woken only by what concerns them, as this batch commits (a NOTIFY is
        # delivered at commit, once per channel however many were sent, and the commit takes
        # the notification lock once whatever the channels): jobs are claimable once their
        # queue rows are, and a learner's progress report (most of the log) wakes no agent.
        if any(isinstance(e.event, CLAIMABLE) for e in mine):
            await conn.execute(Q["notify_claimable"])
        if any(requested(e.event) for e in mine):
            await conn.execute(Q["notify_requests"])

    def _keep(self, folded: Sequence[tuple[int, Job]], docs: Sequence[str]) -> None:
        """Keep the batch's live jobs' docs as written (before its commit: should it roll back,
        the rows keep their older versions, and the kept ones go unused), the KEPT most
        recent."""
        kept = self._kept
        for (version, job), doc in zip(folded, docs, strict=True):
            kept.pop(job.job_id, None)
            if not job.state.terminal:  # an ended job's next event is rare
                kept[job.job_id] = (version, doc)
        while len(kept) > KEPT:
            kept.popitem(last=False)


def requested(event: Event) -> bool:
    """Whether `event` is what node agents react to besides their claims, exactly: running
    learners must act on it (`Agent._carry_requests`: a cancel, a checkpoint request, or an
    attempt over without their node's say: restarted elsewhere, rolled back, failed by a
    learner on another node), or it places learners on nodes other than the claimer's, which
    start them (`Agent._account`, which also gives back the allocations of an attempt that
    ended before they started: one of the events above). Anything else (progress reports, a
    deployment on its claimer's node alone, a completion) concerns no other agent."""
    if isinstance(event, JobDeploying):
        return len(event.nodes) > 1
    return isinstance(
        event, JobCancelled | CheckpointRequested | JobRestarted | DeploymentRolledBack | JobFailed
    )


def counts_moved(
    before: dict[UUID, JobStatus], jobs: Sequence[Job]
) -> list[tuple[str, str, str, int, Decimal, int]]:
    """How a batch moved the counters (job_counts): (labels, tenant, state, and by how much:
    jobs, CPUs, memory) of each counter that moved, from the jobs' states `before` the batch (a
    job missing there was submitted in it) to their states after it."""
    moved: dict[tuple[str, str, str], tuple[int, Decimal, int]] = {}

    def move(counter: tuple[str, str, str], sign: int, cpus: Decimal, memory_mb: int) -> None:
        n, c, m = moved.get(counter, (0, Decimal(0), 0))
        moved[counter] = (n + sign, c + sign * cpus, m + sign * memory_mb)

    for job in jobs:
        was = before.get(job.job_id)
        if was is job.state:
            continue
        cpus, memory_mb = room_of(job)
        for labels in counted_by(job):
            move((labels, job.tenant, job.state.value), 1, cpus, memory_mb)
            if was is not None:
                move((labels, job.tenant, was.value), -1, cpus, memory_mb)
    return [(*counter, *by) for counter, by in moved.items() if any(by)]


def room_of(job: Job) -> tuple[Decimal, int]:
    """The CPUs and memory (MiB) a job's learners ask for, as its counters hold them: none for
    an inference job, whose deployment's replicas hold its room. The CPUs as a decimal of the
    counters' scale (from the float's shortest spelling, as its JSON document has it, rounded
    as Postgres rounds: migration 0050), so that counters summed in any order agree to the last
    digit, and are written alike."""
    manifest = job.manifest
    if manifest.inference is not None:
        return CPUS_SCALE, 0
    cpus = (manifest.learners * Decimal(repr(manifest.cpus))).quantize(CPUS_SCALE, ROUND_HALF_UP)
    return cpus, manifest.learners * manifest.memory_mb


def counted_by(job: Job) -> list[str]:
    """The label filters (job_counts.labels) a job is counted under: every job under '{}', and
    under each of its label pairs alone. A job's labels are its manifest's, fixed at submission."""
    labels = job.manifest.labels
    return ["{}", *(json.dumps({key: value}) for key, value in labels.items())]


def reason(event: JobEvent) -> str | None:
    """Why the event happened, for the events that say."""
    if isinstance(event, JobFailed | JobCancelled | JobRestarted | DeploymentRolledBack):
        return event.reason
    return None

"""Carrying out searches: their commands against their streams, and driving each one on as its
trials' jobs end (`drive`), with the search's stream as the only truth and its trials as jobs
of the job service (placed, isolated, restarted, accounted for and queued fairly like any).

Every step records first and acts after: a decision is appended (at the version it was decided
on), then its job is submitted or cancelled. Each action is idempotent (a trial's job has an id
derived from the search, the trial and the rung), so a control plane killed between the two
does the action again at its next drive, and never twice."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from uuid import UUID

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.events.commands import Loaded
from controlplane.events.errors import ConcurrencyError
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.lifecycle import Cancel as CancelJob
from controlplane.jobs.lifecycle import JobStatus, Refused
from controlplane.jobs.manifest import HparamsSpec, JobManifest, TrialSpec
from controlplane.jobs.service import Jobs
from controlplane.logs.metrics import read_metrics
from controlplane.queries import Q
from controlplane.searches.events import SearchEvent, SearchSubmitted
from controlplane.searches.lifecycle import (
    SEARCH,
    Cancel,
    Outcome,
    Search,
    SearchExists,
    SearchRefused,
    Submit,
    advance,
    evolve,
    trial_job_id,
)
from controlplane.searches.spec import SearchSpec
from controlplane.searches.streams import search_stream
from controlplane.searches.trials import Trial, TrialState
from controlplane.tenants.views import tenant_limits

ACTOR = "system:searches"
SEARCH_LABEL = "trainyard.search"
TRIAL_LABEL = "trainyard.trial"
IDEMPOTENCY_NAMESPACE = uuid.UUID("0b7f3d52-43c6-4a8e-bd0f-6a3c5a1e9d24")
"""Search ids of idempotent submissions are uuid5(namespace, tenant + key)."""
ENDED = frozenset({"JobCompleted", "JobFailed", "JobCancelled"})


class SearchMismatch(Exception):
    """An Idempotency-Key reused for a different search; nothing was written."""


def new_search_id(tenant: str, idempotency_key: str | None) -> UUID:
    if idempotency_key is None:
        return uuid.uuid4()
    return uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{tenant}\n{idempotency_key}")


def trial_manifest(search: Search, trial: Trial) -> JobManifest:
    """The job that runs `trial`'s current rung: the search's template with the trial's
    hyperparameters and budget, a name shared by the trial's rungs, and labels naming both."""
    spec = search.spec
    template = spec.trial.model_dump()
    return JobManifest.model_validate(
        {
            **template,
            "name": f"{spec.name[:100]}-trial-{trial.number}",
            "labels": {
                **template["labels"],
                SEARCH_LABEL: str(search.search_id),
                TRIAL_LABEL: str(trial.number),
            },
            "hparams": HparamsSpec(values=trial.point, budget=trial.budget, unit=spec.budget.unit),
            "trial": TrialSpec(
                search_id=search.search_id,
                number=trial.number,
                rung=trial.rung,
                checkpoints_of=trial_job_id(search.search_id, trial.number, 0),
            ),
        }
    )


class Searches:
    """Search commands and reads, and the step that drives a search on."""

    def __init__(self, store: EventStore, jobs: Jobs, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._jobs = jobs
        self.clock = clock
        self._driven: dict[UUID, Loaded[Search | None, SearchEvent]] = {}
        """The running searches' streams as their last drive here read them: the next drive
        reads only what was appended since (each trial's end adds a few events to a stream
        that holds every trial's, read whole it cost most of a drive)."""

    async def load(self, search_id: UUID) -> Search | None:
        return (await SEARCH.load(self._store, search_stream(search_id))).state

    async def submit(
        self,
        tenant: str,
        spec: SearchSpec,
        metadata: Metadata,
        idempotency_key: str | None = None,
    ) -> tuple[Search, bool]:
        """Record the search and its first trials, and submit their jobs; returns it and whether
        it was created now (False for a retry with the same Idempotency-Key)."""
        search_id = new_search_id(tenant, idempotency_key)
        event = SearchSubmitted(at=self.clock.now(), search_id=search_id, tenant=tenant, spec=spec)
        stream = search_stream(search_id)
        try:
            executed = await SEARCH.execute(self._store, stream, Submit(event), metadata)
        except SearchExists:
            existing = await self.load(search_id)
            if existing is None or existing.tenant != tenant or existing.spec != spec:
                raise SearchMismatch(
                    f"Idempotency-Key {idempotency_key!r} was used for search {search_id} with "
                    "a different search"
                ) from None
            return existing, False
        if executed.state is None:
            raise SearchRefused(f"search {search_id}: its submission left no search")
        # As stored, not as submitted: the driver, woken by the same event, carries the search
        # out from its stream too, and both must make the same trial jobs. A number may come
        # back from Postgres written otherwise (9.3e+65, a float, as an integer), and a trial
        # job made from each would be two manifests under one id.
        search = await self.load(search_id)
        if search is None:
            raise SearchRefused(f"search {search_id}: its submission left no search")
        await self._carry_out(search)
        return search, True

    async def cancel(self, search_id: UUID, reason: str, metadata: Metadata) -> Search:
        """End the search and stop its running trials' jobs."""
        stream = search_stream(search_id)
        command = Cancel(reason, self.clock.now())
        executed = await SEARCH.execute(self._store, stream, command, metadata)
        if executed.state is None:
            raise SearchRefused("no such search", not_found=True)
        await self._carry_out(executed.state)
        return executed.state

    async def drive(self, search_id: UUID) -> Search | None:
        """Record what became of the search's running trials' jobs, let its searcher decide
        what comes next, and carry that out. A conflict (another replica drove it meanwhile)
        leaves it to the next drive, which decides on the stream as it is then."""
        stream = search_stream(search_id)
        loaded = await SEARCH.load(self._store, stream, since=self._driven.pop(search_id, None))
        search = loaded.state
        if search is None:
            return None
        outcomes = await self._outcomes(search) if search.state == "running" else []
        events = advance(search, outcomes, self.clock.now())
        if events:
            metadata = Metadata.capture(ACTOR, tenant=search.tenant, causation_id=stream)
            try:
                await self._store.append(stream, loaded.version, events, metadata)
            except ConcurrencyError:
                self._driven[search_id] = loaded
                return search
            for event in events:
                search = evolve(search, event)
        if search.state == "running":
            # As read, not with the events just appended: the next drive reads those back.
            self._driven[search_id] = loaded
        await self._carry_out(search)
        return search

    async def _outcomes(self, search: Search) -> list[Outcome]:
        """How each running trial's job ended, for those that did and whose metric reports are
        complete: the learner reported the metric at the rung's budget, or the job's agents
        gave its allocations back (they store every line first)."""
        running = search.running
        heads = await self._heads([search.jobs[t.number] for t in running])
        ended = [t for t in running if heads.get(search.jobs[t.number]) in ENDED]
        if not ended:
            return []
        released = {
            row["job_id"]
            for row in await self._store.pool.fetch(
                Q["trial_jobs_released"], [search.jobs[t.number] for t in ended]
            )
        }
        outcomes = []
        name = search.spec.metric.name
        for trial in ended:
            job_id = search.jobs[trial.number]
            job, _ = await self._jobs.current(job_id)
            if job is None:
                continue
            if job.state is not JobStatus.COMPLETED:
                last = job.transitions[-1].reason if job.transitions else None
                why = f"its job {job_id} ended {job.state.value}: {last or 'no reason given'}"
                outcomes.append(Outcome(trial.number, failure=why))
                continue
            points = [
                (p.step, p.values[name])
                for p in await read_metrics(self._store.pool, job_id)
                if name in p.values
            ]
            at_budget = any(step >= trial.budget for step, _ in points)
            if at_budget or job_id in released:
                outcomes.append(Outcome(trial.number, metric=points[-1][1] if points else None))
        return outcomes

    async def _heads(self, job_ids: Sequence[UUID]) -> dict[UUID, str | None]:
        """Each job's last event type in the log (None: not submitted)."""
        rows = await self._store.pool.fetch(Q["trial_job_heads"], list(job_ids))
        return {row["job_id"]: row["type"] for row in rows}

    async def _carry_out(self, search: Search) -> None:
        """Submit the jobs of running trials not submitted yet, and cancel the jobs of trials
        the search cancelled; both idempotent."""
        live = [t for t in search.trials if t.state in (TrialState.RUNNING, TrialState.CANCELLED)]
        if not live:
            return
        heads = await self._heads([search.jobs[t.number] for t in live])
        metadata = Metadata.capture(
            ACTOR, tenant=search.tenant, causation_id=search_stream(search.search_id)
        )
        limits = await tenant_limits(self._store.pool, search.tenant)
        for trial in live:
            job_id = search.jobs[trial.number]
            head = heads.get(job_id)
            if trial.state is TrialState.RUNNING and head is None:
                await self._jobs.submit(
                    search.tenant,
                    trial_manifest(search, trial),
                    metadata,
                    limits=None if limits is None else limits.for_job(),
                    job_id=job_id,
                )
            elif trial.state is TrialState.CANCELLED and head is not None and head not in ENDED:
                reason = f"search {search.search_id} ended ({search.state})"
                with contextlib.suppress(Refused):  # it ended meanwhile
                    await self._jobs.execute(job_id, CancelJob(reason, self.clock.now()), metadata)

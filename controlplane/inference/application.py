"""Inference jobs as their front ends use them: submit one (a job: read, stream and cancel it
through the jobs facade), its statistics (exact; also as they change) and its queries' results.

A facade in the sense of eventsourcing's Application, beside the jobs one it submits through
(`controlplane.jobs.application`: the same limits, views and visibility as any job's). What it
refuses it raises as a `Refusal`; a model version without a servable entry point is refused as
the `ValidationError` of its metadata, each field listed; items the version's declared input
does not take, as a `Refusal` naming the first (`input.items.N`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import asyncpg

from controlplane.deployments.application import refusing
from controlplane.deployments.inputs import check_generated, check_items, declared_input
from controlplane.deployments.tasks import Tasks
from controlplane.events.metadata import Metadata
from controlplane.inference.service import Inference
from controlplane.inference.spec import InferenceRequest
from controlplane.inference.views import InferenceStats, QueryPage, queries, stats
from controlplane.jobs.application import JobsApplication
from controlplane.jobs.images import ImageAllowlist, ImageRefused
from controlplane.jobs.lifecycle import Job
from controlplane.jobs.service import IdempotencyMismatch, new_job_id
from controlplane.jobs.views import JobView
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.principals import Principal

STATS_INTERVAL_S = 1.0
"""How often a follower of the statistics looks again (it is told only what changed)."""


class InferenceApplication:
    def __init__(
        self,
        inference: Inference,
        jobs: JobsApplication,
        tasks: Tasks,
        pool: asyncpg.Pool,
        *,
        images: ImageAllowlist,
    ) -> None:
        self._inference = inference
        self._jobs = jobs
        self._tasks = tasks
        self._pool = pool
        self._images = images

    async def submit(
        self, tenant: str, request: InferenceRequest, metadata: Metadata, key: str | None
    ) -> tuple[JobView, bool]:
        """The inference job submitted, and whether it is new: a retry with the same
        idempotency key finds the job its first try made."""
        try:
            self._images.admit(request.resources.image)
        except ImageRefused as exc:
            raise Refusal(Refused.INVALID, str(exc), field="resources.image") from exc
        job_id = new_job_id(tenant, key)
        with refusing():
            manifest, servable_input = await self._inference.manifest(tenant, request, job_id)
            declared = declared_input(servable_input)
            if request.input.items is not None:
                check_items(declared, request.input.items, "input.items")
            if request.input.generate is not None:
                shape = request.input.generate.shape
                check_generated(declared, shape, "input.generate.shape")
            limits = None
            # A retry finds its job whatever the limits say now; only a new job is held to them.
            if key is None or await self._jobs.jobs.load(job_id) is None:
                limits = (await self._jobs.admit(tenant, manifest)).for_job()
            try:
                job, created = await self._inference.submit(
                    tenant, job_id, manifest, metadata, key, limits
                )
            except IdempotencyMismatch as exc:
                raise Refusal(Refused.CONFLICT, str(exc)) from exc
        return await self._jobs.view(job, now=False), created

    async def job(self, who: Principal, job_id: str) -> Job:
        """The inference job `job_id` names, when `who` may see it."""
        job = await self._jobs.visible(who, job_id)
        if job.manifest.inference is None:
            raise Refusal(
                Refused.NOT_FOUND, f"job {job.job_id} is not an inference job: it has no queries"
            )
        return job

    async def stats(self, job: Job) -> InferenceStats:
        spec = job.manifest.inference
        figures = await stats(self._pool, job.job_id)
        return InferenceStats.model_validate(
            {
                "job_id": job.job_id,
                "state": job.state,
                "model": None
                if spec is None
                else f"{spec.model_tenant}/{spec.model_name}:{spec.version}",
                "weight": None if spec is None else spec.weight,
                "batch_size": None if spec is None else spec.batch_size,
                "total_queries": None if spec is None else spec.queries,
                **figures,
            }
        )

    async def changes(self, job: Job) -> AsyncGenerator[InferenceStats | None]:
        """The job's statistics now and whenever they change (looked at each
        `STATS_INTERVAL_S`), None when they have not; ends after the job has ended (its final
        figures said) or once this process stops."""
        sent = None
        while True:
            view = await self.stats(job)
            # The window's rate moves while nothing happens: the counts say what did.
            changed = (view.state, view.queries, len(view.replicas))
            if changed != sent:
                sent = changed
                yield view
            else:
                yield None
            if job.state.terminal or await self._tasks.pause(STATS_INTERVAL_S):
                return
            job = await self._jobs.jobs.load(job.job_id) or job

    async def queries(self, job: Job, *, after: int | None, limit: int) -> QueryPage:
        """The job's queries after index `after` (None: from the first), at most `limit`."""
        page = await queries(
            self._pool, job.job_id, after=-1 if after is None else after, limit=limit
        )
        # None once this page is the last (shorter than asked for): nothing more to ask for now.
        next_after = page[-1].index if len(page) == limit else None
        return QueryPage(job_id=job.job_id, queries=page, next_after=next_after)

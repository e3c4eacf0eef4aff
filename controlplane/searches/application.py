"""The searches feature as its front ends use it: submit a search, list them, read one with
its trials, its trials' metric curves and its best trial, cancel one, and find the one whose
events a follower reads.

A facade in the sense of eventsourcing's Application (see `controlplane.jobs.application`): it
takes requests already parsed, checks a submission as a job's (its trials are jobs: the jobs
facade's manifest checks and limits) before anything is written, runs commands through the
`Searches` service, and answers with the views of `searches.views`. What it refuses it raises
as a `Refusal`. A tenant sees its own searches; another's is "not found", never "forbidden".
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from uuid import UUID

import asyncpg

from controlplane.admission.policy import Room
from controlplane.events.metadata import Metadata
from controlplane.jobs.application import JobsApplication, decode_cursor, encode_cursor
from controlplane.jobs.images import ImageAllowlist, ImageRefused
from controlplane.refusals import Refusal, Refused
from controlplane.searches.lifecycle import Search, SearchBusy, SearchRefused, State
from controlplane.searches.service import Searches, SearchMismatch, new_search_id
from controlplane.searches.spec import SearchSpec
from controlplane.searches.views import (
    BestMetric,
    BestTrial,
    CurvePage,
    SearchCancelled,
    SearchCreated,
    SearchDetail,
    SearchPage,
    TrialList,
    best_manifest,
    curves,
    list_searches,
    search_detail,
    search_row,
    search_view,
    trials,
)
from controlplane.tenants.principals import Principal

DEFAULT_REASON = "cancelled by user"
MAX_REASON = 1000
NOT_FOUND = "no such search"
READ_MODEL_WAIT_S = 5.0
"""How long a read waits for a search its stream has to reach the read model (a moment,
unless the projections are stuck: /readyz says so)."""
READ_MODEL_POLL_S = 0.02


class SearchesApplication:
    def __init__(
        self,
        searches: Searches,
        jobs: JobsApplication,
        pool: asyncpg.Pool,
        *,
        images: ImageAllowlist,
    ) -> None:
        self.searches = searches
        self._jobs = jobs
        self._pool = pool
        self._images = images

    async def submit(
        self, tenant: str, spec: SearchSpec, metadata: Metadata, key: str | None
    ) -> tuple[SearchCreated, bool]:
        """The search submitted (its first trials' jobs too), and whether it is new: a retry
        with the same idempotency key finds the search its first try made."""
        template = spec.trial
        try:
            self._images.admit(template.image)
        except ImageRefused as exc:
            raise Refusal(Refused.INVALID, str(exc), field="trial.image") from exc
        await self._jobs.check_manifest(template, tenant, field_prefix="trial.")
        # A retry of a submission that was accepted finds its search whatever the limits say
        # now; a new one is held to the tenant's rate, queue and largest node, as a job is (its
        # trials are jobs), and runs at most as many trials at once as the tenant may queue.
        if key is None or await self.searches.load(new_search_id(tenant, key)) is None:
            limits = await self._jobs.admit(tenant, template, also=Room(searches=1))
            if spec.max_concurrent_trials > limits.queued_jobs:
                raise Refusal(
                    Refused.INVALID,
                    f"max_concurrent_trials {spec.max_concurrent_trials} is more than tenant "
                    f"{tenant!r} may queue jobs ({limits.queued_jobs})",
                    field="max_concurrent_trials",
                )
        try:
            search, created = await self.searches.submit(tenant, spec, metadata, key)
        except SearchMismatch as exc:
            raise Refusal(Refused.CONFLICT, str(exc)) from exc
        view = SearchCreated(
            id=search.search_id,
            tenant=search.tenant,
            name=spec.name,
            state=search.state,
            trials=len(search.trials),
        )
        return view, created

    async def page(
        self, who: Principal, *, state: State | None, cursor: str | None, limit: int
    ) -> SearchPage:
        """The searches `who` may see, newest first; at most `limit` from `cursor`."""
        tenant = None if who.is_admin else who.tenant
        found, total = await list_searches(
            self._pool, tenant, state, decode_cursor(cursor), limit + 1
        )
        page = found[:limit]
        next_cursor = None
        if page and len(found) > limit:
            next_cursor = encode_cursor(page[-1]["created_at"], page[-1]["search_id"])
        return SearchPage(
            searches=[search_view(row) for row in page], next_cursor=next_cursor, total=total
        )

    async def visible(self, who: Principal, search_id: str) -> asyncpg.Record:
        """The search's row in the read model (which lags the log by a moment), when `who` may
        see it."""
        uuid = _search_id(search_id)
        row: asyncpg.Record | None = await search_row(self._pool, uuid)
        if row is None:
            # Submitted a moment ago (404 unless its stream has it, for `who` to see): a
            # client following the 201's links finds it.
            await self.loaded(who, search_id)
            row = await self._projected(uuid)
        if not who.may_see(row["tenant"]):
            raise Refusal(Refused.NOT_FOUND, NOT_FOUND)
        return row

    async def _projected(self, search_id: UUID) -> asyncpg.Record:
        """The row of a search its stream has, once the read model shows it."""
        try:
            async with asyncio.timeout(READ_MODEL_WAIT_S):
                while True:
                    row = await search_row(self._pool, search_id)
                    if row is not None:
                        return row
                    # Polled: the projection may be applied by another control plane.
                    await asyncio.sleep(READ_MODEL_POLL_S)
        except TimeoutError:
            raise Refusal(
                Refused.LIMITED,
                "the search was submitted a moment ago and its views are not ready yet",
                retry_after_s=1,
            ) from None

    async def loaded(self, who: Principal, search_id: str) -> Search:
        """The search from its stream, when `who` may see it. From the stream itself, not the
        read model, which may not show a search just submitted: a command on it, or its
        events, right after the submission must find it."""
        search = await self.searches.load(_search_id(search_id))
        if search is None or not who.may_see(search.tenant):
            raise Refusal(Refused.NOT_FOUND, NOT_FOUND)
        return search

    def detail(self, row: asyncpg.Record) -> SearchDetail:
        return search_detail(row)

    async def trials(self, row: asyncpg.Record) -> TrialList:
        return TrialList(trials=await trials(self._pool, row["search_id"]))

    async def curves(
        self,
        row: asyncpg.Record,
        *,
        metric: str | None,
        after: int,
        only: Sequence[int],
        limit: int,
        points: int,
    ) -> CurvePage:
        """Every trial's curve of the search's metric (or `metric`), a page of trials at a
        time: `after` a trial number, at most `limit`, each thinned to about `points` points;
        `only` (when any) picks trials. `next_after` continues the page, null at the last."""
        metric = metric or row["metric"]
        page = await curves(
            self._pool,
            row["search_id"],
            metric,
            after=after,
            only=list(only) or None,
            limit=limit + 1,
            points=points,
        )
        more = len(page) > limit
        page = page[:limit]
        return CurvePage(
            metric=metric,
            mode=row["mode"] if metric == row["metric"] else None,
            trials=page,
            next_after=page[-1].number if more else None,
        )

    async def best(self, row: asyncpg.Record) -> BestTrial:
        """The best trial so far, and the job manifest that trains its model again (the
        template, its hyperparameters, the whole budget)."""
        if row["best_trial"] is None:
            raise Refusal(Refused.NOT_FOUND, "no trial has reported its metric yet")
        trial = (await trials(self._pool, row["search_id"]))[row["best_trial"]]
        return BestTrial(
            trial=row["best_trial"],
            rung=row["best_rung"],
            metric=BestMetric(name=row["metric"], mode=row["mode"], value=row["best_metric"]),
            hparams=trial.hparams,
            job_id=trial.job_id,
            manifest=best_manifest(row, trial),
        )

    async def cancel(
        self, search: Search, reason: str | None, metadata: Metadata
    ) -> SearchCancelled:
        """Cancel the search (its running trials' jobs are cancelled as it is driven); `reason`
        says why (none, or empty: "cancelled by user")."""
        if reason is not None:
            _check_reason(reason)
        try:
            cancelled = await self.searches.cancel(
                search.search_id, reason or DEFAULT_REASON, metadata
            )
        except SearchRefused as exc:
            kind = Refused.NOT_FOUND if exc.not_found else Refused.CONFLICT
            raise Refusal(kind, str(exc)) from exc
        except SearchBusy as exc:
            raise Refusal(Refused.CONFLICT, str(exc)) from exc
        return SearchCancelled(id=cancelled.search_id, state=cancelled.state)


def _check_reason(reason: str) -> None:
    if len(reason) > MAX_REASON:
        message = f"reason must be at most {MAX_REASON} characters"
        raise Refusal(Refused.MALFORMED, message, field="reason")
    if not _storable(reason):
        message = "reason must be valid Unicode text without NUL"
        raise Refusal(Refused.MALFORMED, message, field="reason")


def _storable(text: str) -> bool:
    # Postgres jsonb holds no NUL and only valid UTF-8 (json.loads lets surrogates through).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\0" not in text


def _search_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise Refusal(Refused.NOT_FOUND, NOT_FOUND, field="search_id") from None

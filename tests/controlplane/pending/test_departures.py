"""The `pending` projection ends a job's spans with the job's own events (its claim, its end),
so that a claim costs the recorder no event; a change the recorder appends after the attempt
left (judged before the claim, or recorded late with the instant it happened) holds the
attempt only until it left, and never opens a span that nothing would end. It writes a batch's
runs of changes and of departures a statement each, with the spans one event at a time gives."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.events.types import Event
from controlplane.jobs.events import JobCancelled, JobDeploying, JobRestarted
from controlplane.jobs.streams import job_stream
from controlplane.pending.events import PendingReason, PendingReasonsChanged
from controlplane.pending.projection import PendingProjection
from controlplane.pending.reasons import Blocking, Reason
from controlplane.pending.streams import pending_stream
from controlplane.projections.runner import ProjectionRunner
from tests.conftest import fresh_store
from tests.polling import eventually

T0 = datetime(2026, 11, 29, 10, tzinfo=UTC)
META = Metadata(actor="test", tenant="acme")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def changed(seconds: float, attempt: int, *kinds: Reason) -> PendingReasonsChanged:
    reasons = [PendingReason(reason=k, blocking=Blocking.WAITING, detail=k) for k in kinds]
    return PendingReasonsChanged(at=at(seconds), attempt=attempt, reasons=reasons)


async def test_the_jobs_own_events_end_its_spans_and_a_late_change_holds_it_until_it_left(
    db_url: str, pool: asyncpg.Pool, store: EventStore
) -> None:
    job_id = uuid4()
    versions = {job_stream(job_id): 0, pending_stream(job_id): 0}

    async def append(stream: str, event: Event) -> None:
        await store.append(stream, versions[stream], [event], META)
        versions[stream] += 1

    deploying = JobDeploying(at=at(10), attempt=1, nodes=["n1"], gpus=["GPU-0"], epoch=1)
    await append(pending_stream(job_id), changed(0, 1, Reason.RESOURCES, Reason.FAIR_SHARE))
    await append(job_stream(job_id), deploying)
    # Judged at 5 s, before the claim, appended after it: it held the attempt from 5 to 10 s.
    await append(pending_stream(job_id), changed(5, 1, Reason.RESOURCES, Reason.STARTING))
    # Judged after the claim: nothing held the attempt any more.
    await append(pending_stream(job_id), changed(12, 1, Reason.PRIORITY))
    restarted = JobRestarted(at=at(20), reason="crashed", attempt=2, resume_from=None)
    await append(job_stream(job_id), restarted)
    await append(pending_stream(job_id), changed(21, 2, Reason.BACKOFF))
    await append(job_stream(job_id), JobCancelled(at=at(30), reason="enough"))
    # The cancel names no attempt: it ends every attempt, this one too.
    await append(pending_stream(job_id), changed(25, 2, Reason.BACKOFF, Reason.QUOTA))

    runner = ProjectionRunner(pool, store, LogListener(db_url), [PendingProjection()])
    query = """SELECT attempt, reason, started_at, ended_at FROM pending_spans
               WHERE job_id = $1 ORDER BY attempt, started_at, reason"""

    async def spans() -> list[tuple[int, str, datetime, datetime | None]]:
        rows = await pool.fetch(query, job_id)
        return [(r["attempt"], r["reason"], r["started_at"], r["ended_at"]) for r in rows]

    expected = [
        (1, "fair_share", at(0), at(5)),
        (1, "resources", at(0), at(10)),
        (1, "starting", at(5), at(10)),
        (2, "backoff", at(21), at(30)),
        (2, "quota", at(25), at(30)),
    ]

    async def applied() -> bool:
        # Until the log shows the last event (an older transaction open elsewhere on the
        # server may hold it back a moment).
        await runner.catch_up(PendingProjection())
        return await spans() == expected

    await eventually(applied)
    # Rebuilt from the log, the same.
    await runner.rebuild(PendingProjection.name)
    assert await spans() == expected


async def test_a_claim_stamped_before_a_change_it_follows_in_the_log_ends_no_span_before_it_began(
    db_url: str, pool: asyncpg.Pool, store: EventStore
) -> None:
    job_id = uuid4()
    # Judged at 15 s and committed first; a claim stamped at 10 s committed after it.
    await store.append(pending_stream(job_id), 0, [changed(15, 1, Reason.RESOURCES)], META)
    deploying = JobDeploying(at=at(10), attempt=1, nodes=["n1"], gpus=["GPU-0"], epoch=1)
    await store.append(job_stream(job_id), 0, [deploying], META)
    runner = ProjectionRunner(pool, store, LogListener(db_url), [PendingProjection()])

    async def applied() -> bool:
        await runner.catch_up(PendingProjection())
        rows = await pool.fetch(
            "SELECT started_at, ended_at FROM pending_spans WHERE job_id = $1", job_id
        )
        return [tuple(r) for r in rows] == [(at(15), at(15))]  # no time, never less

    await eventually(applied)


@dataclass(frozen=True)
class Step:
    """An event of one of three jobs: the recorder's change of its reasons (`kinds`), or the
    job's own departure from the queue (claimed, or cancelled: attempt None)."""

    job: int
    attempt: int | None
    kinds: tuple[Reason, ...] = ()
    change: bool = True
    early_s: int = 0
    """How long before the step's own instant a departure was stamped (a claim stamped before
    a change it commits after)."""


KINDS = (Reason.RESOURCES, Reason.FAIR_SHARE, Reason.STARTING, Reason.QUOTA)
STEPS = st.lists(
    st.one_of(
        st.builds(
            Step,
            job=st.integers(0, 2),
            attempt=st.integers(1, 2),
            kinds=st.lists(st.sampled_from(KINDS), unique=True, max_size=3).map(tuple),
        ),
        st.builds(
            Step,
            job=st.integers(0, 2),
            attempt=st.one_of(st.none(), st.integers(1, 2)),
            change=st.just(False),
            early_s=st.integers(0, 3),
        ),
    ),
    max_size=24,
)


def event_of(step: Step, seconds: int) -> Event:
    if step.change:
        assert step.attempt is not None
        return changed(seconds, step.attempt, *step.kinds)
    if step.attempt is None:
        return JobCancelled(at=at(seconds - step.early_s), reason="enough")
    return JobDeploying(
        at=at(seconds - step.early_s), attempt=step.attempt, nodes=["n1"], gpus=[], epoch=1
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
async def test_a_batch_writes_the_spans_that_its_events_one_at_a_time_write(
    pg_server: str, template_db: str, steps: list[Step]
) -> None:
    # A database per example: a rebuild replays the whole log.
    async with fresh_store(pg_server, template_db, pool_size=2) as (url, pool, store):
        await append_steps(store, steps)

        async def spans_after_rebuild(batch_size: int) -> list[tuple[object, ...]]:
            projection = PendingProjection()
            runner = ProjectionRunner(
                pool, store, LogListener(url), [projection], batch_size=batch_size
            )
            await runner.rebuild(projection.name)
            return [tuple(r) for r in await pool.fetch(SPANS)]

        # The whole log in one batch, then one event a batch: each change or departure written
        # alone, as the projection wrote every change before it gathered runs.
        assert await spans_after_rebuild(500) == await spans_after_rebuild(1)


async def append_steps(store: EventStore, steps: list[Step]) -> None:
    """Each step a second after the last, in a transaction of its own: a job's changes come in
    their instants' order, as the recorder records them; its departures may be stamped before
    a change they follow."""
    jobs = [uuid4() for _ in range(3)]
    versions: dict[str, int] = {}
    for seconds, step in enumerate(steps, start=10):
        stream = (pending_stream if step.change else job_stream)(jobs[step.job])
        await store.append(stream, versions.get(stream, 0), [event_of(step, seconds)], META)
        versions[stream] = versions.get(stream, 0) + 1


SPANS = """SELECT job_id, attempt, reason, blocking, detail, started_at, ended_at
           FROM pending_spans ORDER BY job_id, attempt, reason, started_at"""

"""A search's driver repairs what a crash left, on a real Postgres: decisions recorded whose jobs
were never submitted get them (once, whatever how often it runs), a cancelled trial's job that
still runs is cancelled, and the searches projection rebuilt from the log equals the one built
as the events came."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import asyncpg

from controlplane.composition import projection_runner
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.service import Jobs
from controlplane.queries import Q
from controlplane.searches.events import SearchSubmitted
from controlplane.searches.lifecycle import Cancel, Outcome, Submit, advance, decide, evolve
from controlplane.searches.service import Searches
from controlplane.searches.spec import SearchSpec
from controlplane.searches.streams import search_stream
from controlplane.searches.trials import TrialState
from tests.controlplane.searches.test_search_service import spec
from tests.polling import eventually

USER = Metadata(actor="tenant:acme", tenant="acme")
AT = datetime(2026, 11, 27, tzinfo=UTC)


def submission(**changes: Any) -> SearchSubmitted:
    return SearchSubmitted(
        at=AT, search_id=uuid4(), tenant="acme", spec=SearchSpec.model_validate(spec(**changes))
    )


async def test_decisions_recorded_before_a_crash_get_their_jobs_once(
    pool: asyncpg.Pool, store: EventStore
) -> None:
    jobs = Jobs(store)
    searches = Searches(store, jobs)
    submitted = submission()
    # The control plane died after recording the search and its first trials, before their jobs.
    events = decide(Submit(submitted), None)
    await store.append(search_stream(submitted.search_id), 0, events, USER)
    search = None
    for event in events:
        search = evolve(search, event)
    assert search is not None and len(search.running) == 2
    ids = list(search.jobs)
    assert [await jobs.load(job_id) for job_id in ids] == [None, None]
    for _ in range(3):  # each replica's driver, or one driving again
        await searches.drive(submitted.search_id)
    for number, job_id in enumerate(ids):
        job = await jobs.load(job_id)
        assert job is not None and job.state is JobStatus.QUEUED
        assert job.manifest.trial is not None and job.manifest.trial.number == number
        assert job.manifest.hparams is not None
        assert job.manifest.hparams.values == search.trials[number].point
        assert len(await jobs.history(job_id)) == 1  # submitted once

    # Cancelled, but killed before its trials' jobs were: the next drive cancels them.
    await store.append(
        search_stream(submitted.search_id),
        len(events),
        decide(Cancel("enough", AT), search),
        USER,
    )
    await searches.drive(submitted.search_id)
    for job_id in ids:
        job = await jobs.load(job_id)
        assert job is not None and job.state is JobStatus.CANCELLED


async def test_the_projection_rebuilt_from_the_log_equals_the_one_built_as_it_came(
    db_url: str, pool: asyncpg.Pool, store: EventStore
) -> None:
    submitted = submission(
        searcher={"name": "asha", "min_budget": 1, "reduction": 2, "seed": 3}, max_trials=6
    )
    stream = search_stream(submitted.search_id)
    search = evolve(None, submitted)
    rounds = [[submitted, *advance(search, (), AT)]]
    for event in rounds[0][1:]:
        search = evolve(search, event)
    # The trials finish one round after another, metrics by trial number, one fails.
    while search.state == "running":
        outcomes = [
            Outcome(t.number, failure="boom")
            if t.number == 4
            else Outcome(t.number, metric=t.number + t.rung / 10)
            for t in search.trials
            if t.state is TrialState.RUNNING
        ]
        rounds.append(advance(search, outcomes, AT))
        for event in rounds[-1]:
            search = evolve(search, event)
    runner = projection_runner(pool, store, LogListener(db_url))
    projection = runner.projections["searches"]
    version = 0
    for events in rounds:  # built incrementally, a catch-up after each round
        await store.append(stream, version, events, USER)
        version += len(events)

        async def applied(version: int = version) -> bool:
            await runner.catch_up(projection)
            done = await pool.fetchval(
                "SELECT position FROM projection_checkpoints WHERE name = 'searches'"
            )
            last = await pool.fetchval(
                "SELECT max(position) FROM events WHERE stream_id = $1", stream
            )
            return bool(done is not None and done >= last)

        await eventually(applied)
    query = "SELECT * FROM {} ORDER BY 1, 2"
    before = [await pool.fetch(query.format(t)) for t in ("searches", "search_trials")]
    await runner.rebuild("searches")
    after = [await pool.fetch(query.format(t)) for t in ("searches", "search_trials")]
    assert [list(map(dict, rows)) for rows in before] == [list(map(dict, rows)) for rows in after]
    [row] = before[0]
    assert row["state"] == search.state and row["trials"] == len(search.trials)
    trials = {r["number"]: r for r in before[1]}
    for trial in search.trials:
        assert trials[trial.number]["state"] == trial.state.value
        assert trials[trial.number]["rung"] == trial.rung
    # Nothing of it is left to drive.
    assert await pool.fetch(Q["searches_to_drive"]) == []

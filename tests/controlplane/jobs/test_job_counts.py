"""The jobs' counters (job_counts), which answer the jobs list's `total` and admission's CPUs
and memory held: after any mix of submissions and state changes, applied in batches of any
size, every filter's count equals counting job_status itself, and every counter's CPUs and
memory summing its jobs' own; a rebuild makes the very same rows; and the migrations that add
them count the jobs an existing deployment has."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations
from uuid import UUID

import asyncpg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.records import LogPosition
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.lifecycle import (
    Cancel,
    Command,
    Complete,
    Deploy,
    EnterPhase,
    Fail,
    JobStatus,
    Refused,
    Restart,
    RollBack,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.jobs.views import list_jobs
from controlplane.migrate import available
from controlplane.projections.runner import ProjectionRunner
from tests.conftest import fresh_store
from tests.sim.past import INFERENCE

TENANTS = ("acme", "globex", "initech")
LABELS = st.dictionaries(
    st.sampled_from(["team", "size"]),
    # Values JSON writes in more than one way (an escaped quote, a non-ASCII letter).
    st.sampled_from(["a", "b", 'ü "x"']),
    max_size=2,
)
META = Metadata(actor="test")
NEXT: dict[JobStatus, Callable[[datetime], Command]] = {
    JobStatus.QUEUED: lambda at: Deploy(["n1"], ["GPU-0"], 1, at),
    JobStatus.DEPLOYING: lambda at: EnterPhase(JobStatus.DOWNLOADING, at),
    JobStatus.DOWNLOADING: lambda at: EnterPhase(JobStatus.PROCESSING, at),
    JobStatus.PROCESSING: lambda at: EnterPhase(JobStatus.STORING, at),
    JobStatus.STORING: lambda at: Complete([0], at),
}
"""The command that moves a job on along a run that goes well."""
DETOURS: dict[str, Callable[[datetime], Command]] = {
    "fail": lambda at: Fail("exit 1", at, exit_code=1),
    "cancel": lambda at: Cancel("no longer needed", at),
    "restart": lambda at: Restart("node lost", at),
    "roll back": lambda at: RollBack("learner did not start", at),
}
COUNTERS = (
    "SELECT labels::text, tenant, state, n, cpus::text, memory_mb FROM job_counts ORDER BY 1, 2, 3"
)
"""The counters, as text: a rebuild must make the very same rows, down to a decimal's scale."""
RECOUNT = """
WITH room AS (
    SELECT labels AS job_labels, tenant, state,
           CASE WHEN inference THEN 0
                ELSE round(learners * (doc -> 'manifest' ->> 'cpus')::numeric, 6) END AS cpus,
           CASE WHEN inference THEN 0
                ELSE learners * (doc -> 'manifest' ->> 'memory_mb')::bigint END AS memory_mb
    FROM job_status
)
SELECT labels::text, tenant, state, n, cpus::numeric(24, 6)::text, memory_mb FROM (
    SELECT '{}'::jsonb AS labels, tenant, state, count(*) AS n, sum(cpus) AS cpus,
           sum(memory_mb) AS memory_mb
    FROM room GROUP BY tenant, state
    UNION ALL
    SELECT jsonb_build_object(pair.key, pair.value), tenant, state, count(*), sum(cpus),
           sum(memory_mb)
    FROM room, jsonb_each(job_labels) AS pair GROUP BY 1, 2, 3
) counted ORDER BY 1, 2, 3
"""
"""The counters, counted from job_status (as the migrations fill them)."""
COUNT = """
SELECT count(*) FROM job_status
WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text[] IS NULL OR state = ANY($2))
  AND labels @> $3::jsonb
"""


@dataclass(frozen=True)
class Submit:
    tenant: str
    labels: dict[str, str]
    learners: int = 1
    cpus: float = 1.0
    """Per learner: among them floats a binary fraction does not hold (0.1, a third)."""
    memory_mb: int = 2048
    inference: bool = False
    """An inference job, whose counters hold no CPUs or memory: its replicas hold its room."""


@dataclass(frozen=True)
class Act:
    """A command on the `job`-th job submitted so far (modulo): "next" (see NEXT) or one of
    DETOURS; nothing when it is refused (the job has ended, or cannot take that detour now)."""

    job: int
    command: str


@dataclass(frozen=True)
class Project:
    """Apply what the log holds so far, in batches of `batch` events."""

    batch: int


Step = Submit | Act | Project
STEPS = st.lists(
    st.one_of(
        st.builds(
            Submit,
            st.sampled_from(TENANTS),
            LABELS,
            st.integers(min_value=1, max_value=3),
            st.sampled_from([0.1, 1 / 3, 0.5, 2.0]),
            st.sampled_from([100, 2048]),
            st.sampled_from([False, False, True]),
        ),
        st.builds(
            Act,
            st.integers(min_value=0, max_value=50),
            # Mostly on along the run, so that jobs get far before a detour ends them.
            st.sampled_from(["next"] * len(DETOURS) + sorted(DETOURS)),
        ),
        st.builds(Project, st.integers(min_value=1, max_value=7)),
    ),
    max_size=40,
)


def manifest(submit: Submit) -> JobManifest:
    return JobManifest.model_validate(
        {
            "name": "j",
            "image": "img",
            "command": ["train"],
            "max_restarts": 2,
            "labels": submit.labels,
            "learners": submit.learners,
            "cpus": submit.cpus,
            "memory_mb": submit.memory_mb,
            "inference": INFERENCE if submit.inference else None,
        }
    )


async def run(steps: Sequence[Step], pool: asyncpg.Pool, store: EventStore, url: str) -> None:
    """Carry out the steps, then apply the whole log (in batches of 3)."""
    jobs = Jobs(store)
    states: dict[UUID, JobStatus] = {}
    for step in steps:
        match step:
            case Submit(tenant):
                submitted, _ = await jobs.submit(tenant, manifest(step), META)
                states[submitted.job_id] = submitted.state
            case Act(job, name) if states:
                job_id = list(states)[job % len(states)]
                command = NEXT.get(states[job_id]) if name == "next" else DETOURS[name]
                if command is None:  # the job has ended: nothing is next
                    continue
                with contextlib.suppress(Refused):
                    job_now = await jobs.execute(job_id, command(SYSTEM_CLOCK.now()), META)
                    states[job_id] = job_now.state
            case Project(batch):
                some = runner(pool, store, url, batch)
                await some.catch_up(some.projections["jobs"])
    await project_all(runner(pool, store, url, 3), pool)


def runner(pool: asyncpg.Pool, store: EventStore, url: str, batch: int) -> ProjectionRunner:
    return ProjectionRunner(pool, store, LogListener(url), [JobsProjection()], batch_size=batch)


async def project_all(runner: ProjectionRunner, pool: asyncpg.Pool) -> None:
    """Until every event appended is applied: a transaction open anywhere on the server may hold
    the newest events back for a moment, so the target is the last one written, readable or not
    yet (whether the projection has caught up with what is readable now would pass too soon)."""
    last = await pool.fetchrow(
        "SELECT xid::text::bigint AS xid, position FROM events "
        "ORDER BY xid DESC, position DESC LIMIT 1"
    )
    if last is not None:
        await runner.wait_applied("jobs", LogPosition(last["xid"], last["position"]))


def filters() -> list[tuple[str | None, list[JobStatus], dict[str, str]]]:
    """Every tenant's and everyone's; no state, each, two and all; no label, each pair there
    can be, two pairs (counted job by job) and one no job carries."""
    tenants: list[str | None] = [None, *TENANTS, "nobody"]
    states = [[], *([s] for s in JobStatus), [JobStatus.QUEUED, JobStatus.COMPLETED], [*JobStatus]]
    pairs = [{"team": v} for v in ("a", "b", 'ü "x"')] + [{"size": "a"}, {"nope": "a"}]
    labels = [
        {},
        *pairs,
        *({**p, **q} for p, q in combinations(pairs[:4], 2) if p.keys() != q.keys()),
    ]
    return [(t, s, lab) for t in tenants for s in states for lab in labels]


async def check_every_filter(pool: asyncpg.Pool) -> None:
    for tenant, states, labels in filters():
        _, total = await list_jobs(pool, tenant=tenant, states=states, labels=labels, limit=1)
        counted = await pool.fetchval(
            COUNT, tenant, [s.value for s in states] or None, json.dumps(labels)
        )
        assert total == counted, (tenant, states, labels)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=STEPS)
# A job of a quarter CPU leaves the queue's counter after it was applied: the counter is the
# other job's CPU, written as a rebuild that never counted the first there writes it.
@example(
    steps=[
        Submit("acme", {}, cpus=0.25),
        Submit("acme", {}, cpus=1.0),
        Project(1),
        Act(0, "next"),
    ]
)
async def test_every_filter_s_count_equals_counting_the_jobs_and_survives_a_rebuild(
    pg_server: str, template_db: str, steps: list[Step]
) -> None:
    async with fresh_store(pg_server, template_db, pool_size=4) as (url, pool, store):
        await run(steps, pool, store, url)
        counters = [tuple(r) for r in await pool.fetch(COUNTERS)]
        assert counters == [tuple(r) for r in await pool.fetch(RECOUNT)]
        await check_every_filter(pool)

        await runner(pool, store, url, 5).rebuild("jobs")
        assert [tuple(r) for r in await pool.fetch(COUNTERS)] == counters


async def test_the_migration_counts_the_jobs_already_there(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> None:
    steps: list[Step] = [
        Submit("acme", {"team": "a"}, learners=2, cpus=0.1, memory_mb=100),
        Submit("acme", {"team": "a", "size": "b"}, cpus=1 / 3),
        Submit("globex", {}),
        Act(0, "next"),
        Act(1, "cancel"),
        Act(0, "restart"),
        *[Act(2, "next")] * 5,
    ]
    await run(steps, pool, store, db_url)
    counted = [tuple(r) for r in await pool.fetch(COUNTERS)]
    # CPUs in millionths: a third of a CPU rounded there.
    assert counted == [
        ('{"size": "b"}', "acme", "CANCELLED", 1, "0.333333", 2048),
        ('{"team": "a"}', "acme", "CANCELLED", 1, "0.333333", 2048),
        ('{"team": "a"}', "acme", "QUEUED", 1, "0.200000", 200),  # restarted
        ("{}", "acme", "CANCELLED", 1, "0.333333", 2048),
        ("{}", "acme", "QUEUED", 1, "0.200000", 200),
        ("{}", "globex", "COMPLETED", 1, "1.000000", 2048),
    ]

    # As a deployment that had job_status, and no counters, before the migrations.
    await owner.execute("DROP TABLE job_counts")
    for name in ("job_counts_table", "job_counts_hold_room"):
        (migration,) = [m for m in available() if m.name == name]
        await owner.execute(migration.sql)
    assert [tuple(r) for r in await pool.fetch(COUNTERS)] == counted


@pytest.mark.parametrize(
    ("labels", "total"), [({}, 3), ({"team": "a"}, 2), ({"team": "a", "size": "b"}, 0)]
)
async def test_a_count_reads_the_counters_unless_two_label_pairs_are_asked_for(
    pool: asyncpg.Pool, owner: asyncpg.Connection, labels: dict[str, str], total: int
) -> None:
    # Counters that disagree with job_status (which is empty) show where the count came from.
    await owner.execute(
        "INSERT INTO job_counts VALUES ('{}', 'acme', 'QUEUED', 3, 3, 6144), "
        """('{"team": "a"}', 'acme', 'QUEUED', 2, 2, 4096)"""
    )
    assert (await list_jobs(pool, tenant="acme", labels=labels, limit=1))[1] == total

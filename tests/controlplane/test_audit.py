"""The audit schema: every question of docs/audit.md, run as `trainyard_auditor` against a
database filled by a real scenario (a real agent runs, fails, restarts, completes and cancels
jobs; an operator manages tenants and tokens), must give the answers the event store holds; and
the auditor reads the audit views and nothing else."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import DATABASE_ERRORS
from controlplane.events.metadata import Metadata
from controlplane.jobs.events import (
    JobCancelled,
    JobCompleted,
    JobDeploying,
    JobFailed,
    JobRestarted,
    JobSubmitted,
)
from controlplane.jobs.lifecycle import Cancel, Job, JobStatus, RequestCheckpoint
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.tenants.service import create_tenant, issue_token, revoke_token
from tests.cluster import USER, Plane, RunningAgent
from tests.polling import eventually

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
AUDITOR = "trainyard_auditor"
VIEWS = {
    "actions",
    "checkpoints",
    "gpu_allocations",
    "gpu_hours_by_tenant",
    "inference_queries",
    "job_transitions",
    "jobs",
    "model_versions",
    "pending_reasons",
    "restarts",
    "search_trials",
    "serving_batches",
    "serving_tasks",
    "webhook_attempts",
}

# --- docs/audit.md ------------------------------------------------------------------------

HEADING = re.compile(r"^#{2,}\s+(\d+)\.\s+(.+)$")
VARIABLE = re.compile(r":'(\w+)'")
"""A psql variable interpolated as a quoted literal, as the document's queries use them."""


@dataclass(frozen=True)
class Question:
    number: int
    title: str
    sql: str


def questions() -> list[Question]:
    """The numbered questions of docs/audit.md, each with the ```sql block under its heading."""
    found: list[Question] = []
    heading: tuple[int, str] | None = None
    block: list[str] | None = None
    for line in DOC.read_text().splitlines():
        if block is not None:
            if line.strip() == "```":
                assert heading is not None, (
                    f"a sql block without a question heading of its own: {block}"
                )
                found.append(Question(heading[0], heading[1], "\n".join(block)))
                heading, block = None, None  # one query per question
            else:
                block.append(line)
        elif line.strip() == "```sql":
            block = []
        elif match := HEADING.match(line):
            heading = (int(match[1]), match[2])
    return found


def bind(sql: str, values: Mapping[str, object]) -> str:
    """The query with its psql variables replaced by quoted literals, as `psql -v` does."""
    assert set(VARIABLE.findall(sql)) == set(values), f"variables of {sql!r}"
    return VARIABLE.sub(lambda m: "'" + str(values[m[1]]).replace("'", "''") + "'", sql)


def test_the_document_asks_ten_numbered_questions_each_with_one_query() -> None:
    found = questions()
    assert [q.number for q in found] == list(range(1, 11))
    assert all(q.sql.strip() and q.title.endswith("?") for q in found)
    text = DOC.read_text()
    assert all(f"audit.{view}" in text for view in VIEWS)


# --- the scenario ---------------------------------------------------------------------------

GLOBEX = Metadata(actor="tenant:globex", tenant="globex")
ADMIN = Metadata(actor="admin", tenant="globex")
OPERATOR = "operator:cli"
CHECKPOINT_FILE = "ckpt-00000100.pt"
"""What the resumed job reports saving, in its learner's checkpoint folder."""

QUICK = [sys.executable, "-c", "import time; time.sleep(0.3); print('done')"]
CRASH = [sys.executable, "-c", "raise SystemExit(3)"]
# Saves (reports) a checkpoint and crashes on its first attempt; the restarted attempt succeeds.
RESUMABLE = [
    sys.executable,
    "-c",
    "import datetime, json, os, sys\n"
    "if os.environ['TRAINYARD_ATTEMPT'] == '1':\n"
    "    at = datetime.datetime.now(datetime.UTC).isoformat()\n"
    "    report = {'kind': 'checkpoint_saved', 'at': at, 'step': 100,\n"
    "              'path': os.path.join(os.environ['TRAINYARD_CHECKPOINT_DIR'],\n"
    f"                                   {CHECKPOINT_FILE!r}),\n"
    "              'size_bytes': 1234,\n"
    "              'sha256': '0' * 64, 'duration_s': 0.01}\n"
    "    print('@@trainyard/1 ' + json.dumps(report), flush=True)\n"
    "    sys.exit(1)\n"
    "print('resumed from', os.environ.get('TRAINYARD_RESUME_FROM'))\n",
]
SLEEPER = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: print('checkpoint requested', flush=True))\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.05)\n",
]


@dataclass
class Scenario:
    """What happened, as the test made it happen: the jobs by role, and the tokens."""

    done: UUID
    crashed: UUID
    resumed: UUID
    stuck: UUID
    cancelled: UUID
    running: UUID
    globex_token: str
    extra_acme_token: str
    jobs: dict[UUID, Job] = field(default_factory=dict)


async def submit(plane: Plane, who: Metadata, name: str, command: list[str], **extra: Any) -> UUID:
    manifest = JobManifest.model_validate(
        {"name": name, "image": "img", "command": command, "gpus_per_learner": 1, **extra}
    )
    assert who.tenant is not None
    job, _ = await plane.jobs.submit(who.tenant, manifest, who)
    return job.job_id


async def logged(plane: Plane, job_id: UUID, text: str) -> None:
    async def found() -> bool:
        with contextlib.suppress(*DATABASE_ERRORS):
            return any(text in line for line in await plane.log_text(job_id))
        return False

    await eventually(found)


async def run_scenario(plane: Plane) -> Scenario:
    # An operator creates a tenant, and issues acme a token that it then revokes.
    globex = await create_tenant(plane.store, plane.runner, "globex", gpu_quota=2, actor=OPERATOR)
    extra = await issue_token(plane.store, plane.runner, "acme", actor=OPERATOR)
    await revoke_token(plane.store, plane.runner, "acme", extra.token_id, actor=OPERATOR)

    # acme: one job completes, one fails before any checkpoint (not retried), one checkpoints,
    # crashes, is restarted by its agent and completes on its second attempt.
    done = await submit(plane, USER, "quick", QUICK)
    await plane.state(done, JobStatus.COMPLETED)
    crashed = await submit(plane, USER, "crash", CRASH)
    await plane.state(crashed, JobStatus.FAILED)
    resumed = await submit(plane, USER, "resume", RESUMABLE)
    await plane.state(resumed, JobStatus.COMPLETED)
    # More GPUs than the node has: it waits in the queue until acme cancels it.
    stuck = await submit(plane, USER, "stuck", SLEEPER, gpus_per_learner=3)
    await plane.jobs.execute(stuck, Cancel(reason="not needed", at=SYSTEM_CLOCK.now()), USER)

    # globex: a job asked for a checkpoint by its tenant, then cancelled by the admin; and one
    # left running while the questions are asked.
    cancelled = await submit(plane, GLOBEX, "runaway", SLEEPER)
    await plane.state(cancelled, JobStatus.PROCESSING)
    await logged(plane, cancelled, "ready")
    await plane.jobs.execute(cancelled, RequestCheckpoint(at=SYSTEM_CLOCK.now()), GLOBEX)
    await logged(plane, cancelled, "checkpoint requested")
    await plane.jobs.execute(cancelled, Cancel(reason="runaway job", at=SYSTEM_CLOCK.now()), ADMIN)
    running = await submit(plane, GLOBEX, "steady", SLEEPER)
    await plane.state(running, JobStatus.PROCESSING)

    scenario = Scenario(
        done, crashed, resumed, stuck, cancelled, running, globex.token_id, extra.token_id
    )
    for job_id in (done, crashed, resumed, stuck, cancelled, running):
        job = await plane.jobs.load(job_id)
        assert job is not None
        scenario.jobs[job_id] = job
    return scenario


# --- what the event store says, folded here independently of the views ---------------------


@dataclass(frozen=True)
class AttemptRecord:
    job_id: UUID
    tenant: str
    attempt: int
    gpus: tuple[str, ...]
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None

    def held(self, until: datetime) -> timedelta:
        """How long it held its GPUs, up to `until` if it still runs."""
        return (self.ended_at or until) - self.started_at


ENDINGS = (JobCompleted, JobFailed, JobCancelled, JobRestarted)
OUTCOMES = {
    JobCompleted: "completed",
    JobFailed: "failed",
    JobCancelled: "cancelled",
    JobRestarted: "restarted",
}


async def attempts(plane: Plane, job_ids: list[UUID]) -> list[AttemptRecord]:
    """Every claimed attempt, from its JobDeploying event to the event that ended it."""
    records = []
    for job_id in job_ids:
        history = [r.event for r in await plane.store.read_stream(job_stream(job_id))]
        submitted = history[0]
        assert isinstance(submitted, JobSubmitted)
        for i, event in enumerate(history):
            if not isinstance(event, JobDeploying):
                continue
            # A job is claimed only while queued: the next ending event ends this attempt.
            ends = [e for e in history[i + 1 :] if isinstance(e, ENDINGS)]
            end = ends[0] if ends else None
            records.append(
                AttemptRecord(
                    job_id,
                    submitted.tenant,
                    event.attempt,
                    tuple(event.gpus),
                    event.at,
                    end.at if end else None,
                    OUTCOMES[type(end)] if end else None,
                )
            )
    return records


def hours(span: timedelta) -> Decimal:
    return Decimal(span.total_seconds()) / 3600


def entered(job: Job, state: JobStatus, attempt: int | None = None) -> datetime:
    """When the job first entered `state` (in `attempt`, if given)."""
    return next(
        t.at
        for t in job.transitions
        if t.state is state and (attempt is None or t.attempt == attempt)
    )


# --- the questions ----------------------------------------------------------------------------

Rows = list[asyncpg.Record]
Check = Callable[[Rows], None]


@contextlib.asynccontextmanager
async def as_auditor(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    await conn.execute(f"SET ROLE {AUDITOR}")
    # Another time zone than the server's: no answer may depend on the session's.
    await conn.execute("SET TIME ZONE 'Pacific/Chatham'")
    try:
        yield conn
    finally:
        await conn.execute("RESET ROLE; RESET TIME ZONE")


async def test_every_question_of_the_document_answers_a_real_scenario_correctly(
    plane: Plane, agent: RunningAgent, owner: asyncpg.Connection
) -> None:
    s = await run_scenario(plane)
    resumed, cancelled = s.jobs[s.resumed], s.jobs[s.cancelled]
    records = await attempts(plane, list(s.jobs))
    gpu = resumed.gpus[0]  # the one GPU of the resumed job's second attempt
    processing = entered(cancelled, JobStatus.PROCESSING)
    as_of = processing + (entered(cancelled, JobStatus.CANCELLED) - processing) / 2
    then = await plane.jobs.load(s.cancelled, as_of=as_of)  # what the jobs API would say
    asked_at: list[datetime] = []  # when each question was asked: the running job grows

    def q1(rows: Rows) -> None:
        # Exactly the transitions the job service folds from the same stream.
        assert [(r["attempt"], r["to_state"], r["at"], r["reason"]) for r in rows] == [
            (t.attempt, t.state.value, t.at, t.reason) for t in resumed.transitions
        ]
        assert [r["to_state"] for r in rows] == [
            "QUEUED", "DEPLOYING", "DOWNLOADING", "PROCESSING",
            "QUEUED", "DEPLOYING", "DOWNLOADING", "PROCESSING", "STORING", "COMPLETED",
        ]  # fmt: skip
        assert [r["from_state"] for r in rows] == [None] + [r["to_state"] for r in rows[:-1]]
        assert [r["actor"] for r in rows] == ["tenant:acme"] + ["agent:n1"] * 9
        assert rows[4]["reason"].startswith("learner 0 exited with code 1")
        assert all(r["exit_code"] is None for r in rows)

    def q2(rows: Rows) -> None:
        assert [tuple(r) for r in rows] == [
            (cancelled.submitted_at, "tenant:globex", "submit", None, None),
            (cancelled.checkpoint_requested_at, "tenant:globex", "checkpoint_request", None, None),
            (entered(cancelled, JobStatus.CANCELLED), "admin", "cancel", "runaway job", None),
        ]

    def q3(rows: Rows) -> None:
        restart = next(t for t in resumed.transitions if t.attempt == 2)
        assert resumed.last_checkpoint is not None
        checkpoint = resumed.last_checkpoint.path
        assert checkpoint.endswith(f"/{s.resumed}/checkpoints/learner-0/{CHECKPOINT_FILE}")
        assert [tuple(r) for r in rows] == [
            (
                s.resumed,
                "resume",
                1,
                "PROCESSING",
                restart.at,
                "agent:n1",
                restart.reason,
                checkpoint,
            )
        ]

    def q4(rows: Rows) -> None:
        started = entered(resumed, JobStatus.DEPLOYING, attempt=2)
        ended = entered(resumed, JobStatus.COMPLETED)
        assert [tuple(r) for r in rows] == [
            (0, gpu, ["n1"], started, ended, "completed", ended - started)
        ]

    def q5(rows: Rows) -> None:
        ran = sorted((a for a in records if gpu in a.gpus), key=lambda a: a.started_at)
        assert [tuple(r) for r in rows] == [
            (a.job_id, a.tenant, a.attempt, a.started_at, a.ended_at, a.outcome) for a in ran
        ]
        assert (s.resumed, 2) in [(a.job_id, a.attempt) for a in ran]

    def q6(rows: Rows) -> None:
        by_tenant = {r["tenant"]: r for r in rows}
        assert set(by_tenant) == {"acme", "globex"}  # no other tenant had a GPU
        acme = sum(
            (hours(a.held(SYSTEM_CLOCK.now())) for a in records if a.tenant == "acme"), Decimal(0)
        )
        assert all(a.ended_at is not None for a in records if a.tenant == "acme")
        assert abs(by_tenant["acme"]["gpu_hours"] - acme) <= Decimal("0.000001")
        # done, crashed, and resumed twice; stuck never held a GPU.
        assert tuple(by_tenant["acme"])[2:] == (3, 4, False)
        # globex: the cancelled job's attempt, plus the running one up to the query's now().
        globex = [a for a in records if a.tenant == "globex"]
        assert [a.job_id for a in globex if a.ended_at is None] == [s.running]
        low = sum((hours(a.held(asked_at[-1])) for a in globex), Decimal(0))
        high = sum((hours(a.held(SYSTEM_CLOCK.now())) for a in globex), Decimal(0))
        assert low - Decimal("0.000001") <= by_tenant["globex"]["gpu_hours"]
        assert by_tenant["globex"]["gpu_hours"] <= high + Decimal("0.000001")
        assert tuple(by_tenant["globex"])[2:] == (2, 2, True)

    def q7(rows: Rows) -> None:
        crashed = s.jobs[s.crashed]
        assert crashed.failure_reason is not None
        assert "before any checkpoint" in crashed.failure_reason
        failed_at = entered(crashed, JobStatus.FAILED)
        # The resumed job failed an attempt too, but after a checkpoint, and then completed.
        assert [tuple(r) for r in rows] == [
            (s.crashed, "acme", "crash", 1, failed_at, crashed.failure_reason)
        ]

    def q8(rows: Rows) -> None:
        expected = {
            job_id: entered(job, JobStatus.PROCESSING) - job.submitted_at
            for job_id, job in s.jobs.items()
            if job_id != s.stuck  # never processed
        }
        assert {r["job_id"]: r["waited"] for r in rows} == expected
        assert all(r["processing_at"] - r["submitted_at"] == r["waited"] for r in rows)
        assert [r["waited"] for r in rows] == sorted(expected.values(), reverse=True)

    def q9(rows: Rows) -> None:
        assert [tuple(r)[1:] for r in rows] == [
            (OPERATOR, "tenant_create", "globex", None, None, None),
            (OPERATOR, "token_issue", "globex", None, s.globex_token, None),
            (OPERATOR, "token_issue", "acme", None, s.extra_acme_token, None),
            (OPERATOR, "token_revoke", "acme", None, s.extra_acme_token, None),
            ("admin", "cancel", "globex", s.cancelled, None, "runaway job"),
        ]

    def q10(rows: Rows) -> None:
        assert [tuple(r) for r in rows] == [("PROCESSING", 1, processing, None)]
        assert then is not None and then.state is JobStatus.PROCESSING

    asked: list[tuple[int, Mapping[str, object], Check]] = [
        (1, {"job": s.resumed}, q1),
        (2, {"job": s.cancelled}, q2),
        (3, {"tenant": "acme"}, q3),
        (4, {"job": s.resumed, "attempt": 2}, q4),
        (5, {"gpu": gpu}, q5),
        (6, {}, q6),
        (7, {}, q7),
        (8, {}, q8),
        (9, {}, q9),
        (10, {"job": s.cancelled, "as_of": as_of.isoformat()}, q10),
    ]
    by_number = {q.number: q for q in questions()}
    assert sorted(by_number) == [n for n, _, _ in asked]
    async with as_auditor(owner) as auditor:
        for number, values, check in asked:
            question = by_number[number]
            asked_at.append(SYSTEM_CLOCK.now())
            rows = await auditor.fetch(bind(question.sql, values))
            try:
                check(rows)
            except AssertionError as exc:
                raise AssertionError(f"question {number} ({question.title}): {rows}") from exc

    # The views, read from the events, agree with the jobs projection the API serves.
    async def agree() -> bool:
        projected = await owner.fetch("SELECT job_id, state, attempt, restarts FROM job_status")
        audited = await owner.fetch("SELECT job_id, state, attempt, restarts FROM audit.jobs")
        return sorted(map(tuple, projected)) == sorted(map(tuple, audited))

    await eventually(agree)


# --- the auditor's role -------------------------------------------------------------------------


async def test_the_auditor_reads_the_audit_views_and_nothing_else(
    owner: asyncpg.Connection,
) -> None:
    views = await owner.fetch(
        "SELECT c.relname, c.relkind::text AS relkind FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'audit'"
    )
    assert {v["relname"] for v in views} == VIEWS
    assert {v["relkind"] for v in views} == {"v"}  # views only: nothing stored twice
    privileges = "SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER"
    # Not one privilege on anything in public: tables, views, sequences.
    granted = await owner.fetch(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'm', 'p', 'f')"
        " AND has_table_privilege($1, c.oid, $2)",
        AUDITOR,
        privileges,
    )
    assert granted == []
    assert not await owner.fetchval(
        "SELECT has_sequence_privilege($1, 'claim_epochs', 'USAGE, SELECT, UPDATE')", AUDITOR
    )
    # Reading the views, never writing them or adding to the schema.
    assert not await owner.fetchval(
        "SELECT bool_or(has_table_privilege($1, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE'))"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'audit'",
        AUDITOR,
    )
    assert not await owner.fetchval("SELECT has_schema_privilege($1, 'audit', 'CREATE')", AUDITOR)
    assert not await owner.fetchval("SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", AUDITOR)

    async with as_auditor(owner) as auditor:
        for view in sorted(VIEWS):
            assert await auditor.fetch(f"SELECT * FROM audit.{view}") == []
        for table in ("events", "job_status", "allocations", "api_tokens", "job_logs"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await auditor.fetch(f"SELECT * FROM public.{table}")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await auditor.execute("CREATE VIEW audit.mine AS SELECT 1")


async def test_every_audit_view_and_column_is_documented_in_the_database(
    owner: asyncpg.Connection,
) -> None:
    undocumented = await owner.fetch(
        "SELECT c.relname, a.attname FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'audit'"
        " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0"
        " WHERE obj_description(c.oid, 'pg_class') IS NULL"
        "    OR col_description(c.oid, a.attnum) IS NULL"
    )
    assert [tuple(r) for r in undocumented] == []
    # And docs/audit.md lists each view's columns, in order.
    rows = {
        line.split("|")[1].strip(): line
        for line in DOC.read_text().splitlines()
        if line.startswith("| `audit.")
    }
    for view in VIEWS:
        columns = await owner.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0"
            " ORDER BY attnum",
            f"audit.{view}",
        )
        listed = "`" + ", ".join(c["attname"] for c in columns) + "`"
        assert listed in rows[f"`audit.{view}`"], view


async def test_audit_jobs_shows_how_a_job_s_learners_are_spread_over_its_nodes(
    plane: Plane, owner: asyncpg.Connection
) -> None:
    spread = await plane.submit(["train"], learners=4, learners_per_node=2)
    anywhere = await plane.submit(["train"], learners=2)
    rows = await owner.fetch(
        "SELECT job_id, learners, learners_per_node FROM audit.jobs WHERE job_id = ANY($1)",
        [spread, anywhere],
    )
    assert {row["job_id"]: (row["learners"], row["learners_per_node"]) for row in rows} == {
        spread: (4, 2),
        anywhere: (2, None),
    }

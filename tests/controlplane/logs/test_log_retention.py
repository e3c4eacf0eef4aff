"""Log retention (migrations/0027_log_retention.sql): the logs of jobs that ended longer ago
than the retention go, a batch of jobs at a time, and nothing of a job that lives; the
application may forget them only through the owner's function; and the setting's sources."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

import asyncpg
import pytest

from cli.main import parser
from controlplane.clock import ManualClock
from controlplane.database import AGENT_ROLE, connect
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
    Restart,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import write_lines
from controlplane.projections.runner import ProjectionRunner
from controlplane.queries import Q
from controlplane.server import ServeError, log_retention_s
from controlplane.settings import DAY_S, LOG_RETENTION_ENV, LOG_RETENTION_S
from tests.cli.test_cli import trainyard
from tests.cluster import USER
from tests.polling import eventually

MANIFEST = JobManifest.model_validate(
    {"name": "kept", "image": "img", "command": ["train"], "learners": 2}
)
RETENTION_S = 30 * DAY_S


@dataclass(frozen=True, slots=True)
class History:
    """Jobs whose logs the retention forgets (`old`), and jobs whose logs it keeps."""

    old: dict[str, UUID]
    kept: dict[str, UUID]


async def make_history(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> History:
    """Jobs ended 40 days ago, ended yesterday, and living (one restarted, with lines of both
    attempts), each with lines of two learners; every job's last line stored 40 days ago, but
    for one that ended 40 days ago and logged a line since."""
    now = datetime.now(UTC)
    jobs = Jobs(store, ManualClock(now - timedelta(days=60)))

    def ago(days: float) -> datetime:
        return now - timedelta(days=days)

    def deploy(days: float) -> Deploy:
        return Deploy(["n1", "n1"], ["GPU-0", "GPU-1"], 1, ago(days))

    async def job(*commands: Command) -> UUID:
        submitted, _ = await jobs.submit("acme", MANIFEST, USER)
        for command in commands:
            await jobs.execute(submitted.job_id, command, USER)
        return submitted.job_id

    old = {
        "completed": await job(
            deploy(41), EnterPhase(JobStatus.PROCESSING, ago(41)), Complete([0, 0], ago(40))
        ),
        "failed": await job(deploy(41), Fail("learner 1 exited 1", ago(40), exit_code=1)),
        "cancelled": await job(Cancel("not needed", ago(40))),
    }
    kept = {
        "ended yesterday": await job(Cancel("not needed", ago(1))),
        "logged since it ended": await job(Cancel("not needed", ago(40))),
        "queued": await job(),
        "running": await job(deploy(45), EnterPhase(JobStatus.PROCESSING, ago(45))),
        "restarted": await job(deploy(50), Restart("node_lost: node n1", ago(45))),
    }
    every = {**old, **kept}
    lines = [
        LogLine(job_id, 1, learner, Stream.STDOUT, seq, ago(41), f"step {seq}")
        for job_id in every.values()
        for learner in (0, 1)
        for seq in (1, 2, 3)
    ]
    lines.append(LogLine(kept["restarted"], 2, 0, Stream.STDOUT, 1, ago(44), "resumed"))
    assert await write_lines(pool, lines) == len(lines)
    # Stored long ago: a head's time is when its job's last line was.
    await owner.execute(
        "UPDATE job_log_heads SET updated_at = now() - interval '40 days' WHERE job_id <> $1",
        kept["logged since it ended"],
    )

    runner = ProjectionRunner(pool, store, LogListener(db_url), [JobsProjection()])

    async def projected() -> bool:
        """Every job's every event (a job's version is how many it has)."""
        await runner.catch_up(runner.projections["jobs"])
        return bool(
            await pool.fetchval(
                "SELECT (SELECT sum(version) FROM job_status)"
                " = (SELECT count(*) FROM events WHERE stream_id LIKE 'job-%')"
            )
        )

    await eventually(projected)
    states = {r["job_id"]: r["state"] for r in await pool.fetch("SELECT * FROM job_status")}
    assert states[kept["restarted"]] == JobStatus.QUEUED  # attempt 2 waits; attempt 1's lines stay
    assert states[kept["running"]] == JobStatus.PROCESSING
    return History(old, kept)


@pytest.fixture
async def history(
    pool: asyncpg.Pool, store: EventStore, db_url: str, owner: asyncpg.Connection
) -> History:
    return await make_history(pool, store, db_url, owner)


async def jobs_with_logs(owner: asyncpg.Connection) -> dict[str, set[UUID]]:
    """Which jobs each of the log tables holds rows of."""
    return {
        table: {r["job_id"] for r in await owner.fetch(f"SELECT DISTINCT job_id FROM {table}")}
        for table in ("job_logs", "job_log_heads", "job_log_series")
    }


async def forget(pool: asyncpg.Pool, most: int = 1000) -> int:
    """One call, as the application's role (the pool's)."""
    forgotten: int = await pool.fetchval(Q["forget_job_logs"], RETENTION_S, most)
    return forgotten


async def test_only_the_logs_of_jobs_that_ended_before_the_retention_go(
    pool: asyncpg.Pool, owner: asyncpg.Connection, history: History
) -> None:
    kept = set(history.kept.values())
    before = await owner.fetchval("SELECT count(*) FROM job_logs WHERE job_id = ANY ($1)", kept)

    assert await forget(pool) == len(history.old)

    assert await jobs_with_logs(owner) == dict.fromkeys(
        ("job_logs", "job_log_heads", "job_log_series"), kept
    )
    # Every line of the jobs kept, of every attempt, stays.
    assert await owner.fetchval("SELECT count(*) FROM job_logs") == before
    assert (
        await owner.fetchval(
            "SELECT count(*) FROM job_logs WHERE job_id = $1 AND attempt = 1",
            history.kept["restarted"],
        )
        == 6
    )
    assert await forget(pool) == 0


async def test_a_call_forgets_at_most_its_batch_of_jobs(
    pool: asyncpg.Pool, owner: asyncpg.Connection, history: History
) -> None:
    old = set(history.old.values())

    assert await forget(pool, most=2) == 2
    left = (await jobs_with_logs(owner))["job_logs"] & old
    assert len(left) == 1
    assert await forget(pool, most=2) == 1
    assert (await jobs_with_logs(owner))["job_logs"] == set(history.kept.values())
    assert await forget(pool, most=2) == 0


async def test_a_job_whose_lines_are_being_written_is_left_to_the_next_call(
    pool: asyncpg.Pool, db_url: str, owner: asyncpg.Connection, history: History
) -> None:
    writing = history.old["failed"]
    writer = await connect(db_url)
    try:
        batch = writer.transaction()
        await batch.start()
        # A writer holds the job's head from taking ids until it commits (0007): the call
        # neither waits for it (were it to, the lock timeout would fail it) nor deletes lines
        # under it.
        await writer.fetch(Q["reserve_log_ids"], [writing], [1])
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '10s'")
            forgotten = await conn.fetchval(Q["forget_job_logs"], RETENTION_S, 1000)
        assert forgotten == len(history.old) - 1
        assert writing in (await jobs_with_logs(owner))["job_logs"]
        # Its batch failed: the job's last line is still the one stored 40 days ago.
        await batch.rollback()
    finally:
        await writer.close()
    assert await forget(pool) == 1
    assert writing not in (await jobs_with_logs(owner))["job_logs"]


async def test_the_application_forgets_only_through_the_function_and_agents_not_at_all(
    pool: asyncpg.Pool, db_url: str, owner: asyncpg.Connection, history: History
) -> None:
    for change in (
        "DELETE FROM job_logs",
        "TRUNCATE job_logs",
        "UPDATE job_logs SET line = ''",
        "DELETE FROM job_log_heads",
        "DELETE FROM job_log_series",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pool.execute(change)
    agent = await connect(db_url, role=AGENT_ROLE)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await agent.fetchval(Q["forget_job_logs"], 0.0, 1000)
    finally:
        await agent.close()
    # Nothing went meanwhile.
    assert (await jobs_with_logs(owner))["job_logs"] == {
        *history.old.values(),
        *history.kept.values(),
    }


# The setting: `--log-retention-days`, else the environment, else 30 days.


def serve_args(*words: str) -> argparse.Namespace:
    return parser().parse_args(["serve", *words])


def test_the_flag_wins_over_the_environment_and_the_environment_over_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LOG_RETENTION_ENV, raising=False)
    assert log_retention_s(serve_args().log_retention_days) == LOG_RETENTION_S == 30 * DAY_S
    monkeypatch.setenv(LOG_RETENTION_ENV, "14")
    assert log_retention_s(serve_args().log_retention_days) == 14 * DAY_S
    assert log_retention_s(serve_args("--log-retention-days", "0.5").log_retention_days) == (
        DAY_S / 2
    )
    assert log_retention_s(serve_args("--log-retention-days", "0").log_retention_days) == 0
    monkeypatch.setenv(LOG_RETENTION_ENV, "0")
    assert log_retention_s(serve_args().log_retention_days) == 0
    assert parser().parse_args(["up", "--log-retention-days", "7"]).log_retention_days == 7


@pytest.mark.parametrize("days", ["-1", "soon", "nan", "inf", "36501"])
def test_a_retention_that_is_not_a_number_of_days_is_refused_naming_where_it_came_from(
    days: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        serve_args("--log-retention-days", days)
    assert exited.value.code == 2
    assert "argument --log-retention-days: " in capsys.readouterr().err
    monkeypatch.setenv(LOG_RETENTION_ENV, days)
    with pytest.raises(ServeError, match=f"^{LOG_RETENTION_ENV}: '{days}' is not a number"):
        log_retention_s(None)


@pytest.mark.processes
def test_serve_refuses_a_malformed_retention_before_it_starts() -> None:
    result = trainyard("serve", env={LOG_RETENTION_ENV: "a month"})
    assert result.returncode == 1
    assert result.stderr == (
        f"trainyard: {LOG_RETENTION_ENV}: 'a month' is not a number of days from 0 "
        "(keep logs forever) to 36,500\n"
    )

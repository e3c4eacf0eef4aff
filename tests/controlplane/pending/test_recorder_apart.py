"""The pending-reasons recorder in a process of its own (`pending.apart`), as `trainyard serve`
runs it: it records what the in-process one records, it is started again when it dies, and it
never outlives the control plane that started it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.projection import JobsProjection
from controlplane.jobs.service import Jobs
from controlplane.pending.apart import MODULE, READY, RecorderProcess
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import DATABASE_URL_ENV
from tests.controlplane.pending.test_pending_reasons import MANIFEST
from tests.polling import eventually
from tests.tenancy import Tokens

# A bound on how long a broken test may hang, never an expectation of how fast anything is.
PATIENCE_S = 60.0


@pytest.fixture
async def apart(db_url: str) -> AsyncIterator[RecorderProcess]:
    """The recorder's process, up; stopped (and waited for) after the test."""
    recorder = RecorderProcess(db_url)
    task = asyncio.create_task(recorder.run())
    async with asyncio.timeout(PATIENCE_S):
        await recorder.up.wait()
    yield recorder
    recorder.stop()
    async with asyncio.timeout(PATIENCE_S):
        await task


async def queued(db_url: str, pool: asyncpg.Pool, store: EventStore) -> UUID:
    """A job submitted and shown in the queue: one the recorder judges."""
    job, _ = await Jobs(store).submit(
        "acme", JobManifest.model_validate(MANIFEST), Metadata(actor="tenant:acme", tenant="acme")
    )
    await ProjectionRunner(pool, store, LogListener(db_url), [JobsProjection()]).catch_up(
        JobsProjection()
    )
    return job.job_id


async def reasons(pool: asyncpg.Pool, job_id: UUID) -> list[str]:
    kinds = await pool.fetchval("SELECT kinds FROM pending_reasons WHERE job_id = $1", job_id)
    return list(kinds or [])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has ended: only its status is left for its parent to read.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_it_records_a_queued_job_s_reasons_and_ends_when_stopped(
    db_url: str, pool: asyncpg.Pool, store: EventStore, tokens: Tokens
) -> None:
    recorder = RecorderProcess(db_url)
    task = asyncio.create_task(recorder.run())
    async with asyncio.timeout(PATIENCE_S):
        await recorder.up.wait()
    pid = recorder.pid
    assert pid is not None and alive(pid)
    # Its start-up (its imports: tens of thousands of objects) is out of its collections' walk.
    assert recorder.frozen is not None and recorder.frozen > 10_000
    job_id = await queued(db_url, pool, store)

    async def judged() -> bool:
        return await reasons(pool, job_id) == ["no_nodes"]

    await eventually(judged, PATIENCE_S)
    recorder.stop()
    async with asyncio.timeout(PATIENCE_S):
        await task
    assert not alive(pid)
    assert recorder.pid is None and not recorder.up.is_set()


async def test_a_process_that_dies_is_started_again_and_goes_on_recording(
    db_url: str, pool: asyncpg.Pool, store: EventStore, tokens: Tokens, apart: RecorderProcess
) -> None:
    first = apart.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)

    async def again() -> bool:
        return apart.up.is_set() and apart.pid not in (None, first)

    await eventually(again, PATIENCE_S)
    job_id = await queued(db_url, pool, store)

    async def judged() -> bool:
        return await reasons(pool, job_id) == ["no_nodes"]

    await eventually(judged, PATIENCE_S)


def test_the_process_ends_once_whoever_started_it_is_gone(db_url: str) -> None:
    """Its standard input's end is its parent's: a control plane killed with SIGKILL leaves no
    recorder behind."""
    process = subprocess.Popen(
        [sys.executable, "-m", MODULE],
        env={**os.environ, DATABASE_URL_ENV: db_url},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        word, _, frozen = process.stdout.readline().partition(b" ")
        assert word == READY and int(frozen) > 0
        process.stdin.close()
        assert process.wait(timeout=PATIENCE_S) == 0
    finally:
        process.kill()
        process.wait()

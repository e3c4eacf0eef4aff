"""Learner logs on the node, with a real agent, real learner processes and a real Postgres: an
attempt ends only once its lines are stored, a flood of one job never drops another's lines, and
a job's log limits hold over its attempts (then a marker, never silence)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agent_port.memory import MemoryPort
from controlplane.agent_port.postgres import PostgresPort
from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.http.app import create_app
from controlplane.jobs.lifecycle import JobStatus, Submit, decide
from controlplane.jobs.limits import JobLimits
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.logs.lines import Stream
from controlplane.logs.store import read_lines
from controlplane.tenants.service import create_tenant
from node_agent import attempt as attempt_module
from node_agent.learners import learner_dir
from node_agent.log_shipper import LINE_OVERHEAD, LogShipper
from tests.cluster import Plane, RunningAgent
from tests.controlplane.logs.test_logs import line
from tests.polling import eventually

Client = TestClient[Any, Any]
FLOOD = 20_000
FLOODER = [
    sys.executable,
    "-c",
    f"import sys\nsys.stdout.write(''.join(f'flood {{i}}\\n' for i in range({FLOOD})))\n"
    "sys.exit(3)",
]
"""A learner that prints FLOOD lines at once and fails at once."""


@pytest.fixture
async def token(plane: Plane) -> str:
    return (await create_tenant(plane.store, plane.runner, "flood", actor="test")).plaintext


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        yield client


async def submit(plane: Plane, command: list[str], limits: JobLimits | None = None) -> UUID:
    manifest = JobManifest.model_validate(
        {"name": "flood", "image": "img", "command": command, "gpus_per_learner": 1}
    )
    job_id = uuid4()
    submitted = Submit(
        job_id=job_id,
        tenant="flood",
        manifest=manifest,
        at=SYSTEM_CLOCK.now(),
        limits=limits or JobLimits(),
    )
    metadata = Metadata(actor="tenant:flood", tenant="flood")
    await plane.store.append(job_stream(job_id), 0, decide(submitted, None), metadata)
    return job_id


async def test_a_failed_job_s_logs_hold_every_line_its_learner_printed_at_once(
    plane: Plane, agent: RunningAgent, client: Client, token: str
) -> None:
    # Four floods, two at a time (two GPUs): the agent's shipper is busy when each one ends.
    jobs = [await submit(plane, FLOODER) for _ in range(4)]

    async def check(job_id: UUID) -> None:
        job = await plane.state(job_id, JobStatus.FAILED)
        assert job.exit_codes == [3]
        # Read the moment the job is seen FAILED: nothing may be on its way still.
        response = await client.get(
            f"/v1/jobs/{job_id}/logs", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status == 200
        printed = [
            text.split("] ", 1)[1]
            for text in (await response.text()).splitlines()
            if "stdout] flood " in text
        ]
        assert printed == [f"flood {i}" for i in range(FLOOD)]

    async with asyncio.TaskGroup() as group:
        for job_id in jobs:
            group.create_task(check(job_id))


async def test_one_job_s_flood_never_drops_another_job_s_lines(
    pool: asyncpg.Pool, owner: asyncpg.Connection
) -> None:
    chatty, quiet = uuid4(), uuid4()
    size = len(line(quiet, 1).text) + LINE_OVERHEAD
    shipper = LogShipper(
        PostgresPort(pool), batch_lines=100, flush_interval_s=0.02, job_buffer_chars=50 * size
    )
    running = asyncio.create_task(shipper.run())
    shipper.add(line(chatty, 1))
    await shipper.flush()

    # The database stalls on the chatty job's lines (its log head locked elsewhere): the
    # shipper can store nothing while the chatty job floods and the quiet one logs a little.
    stall = owner.transaction()
    await stall.start()
    await owner.execute("SELECT 1 FROM job_log_heads WHERE job_id = $1 FOR UPDATE", chatty)
    for seq in range(2, 5002):
        shipper.add(line(chatty, seq))
    for seq in range(1, 41):
        shipper.add(line(quiet, seq))
    assert shipper.pending_of(quiet) == 40  # in its own buffer, not dropped
    await stall.rollback()
    shipper.stop()
    await asyncio.wait_for(running, 10)

    assert [s.line for s in await read_lines(pool, quiet)] == [line(quiet, s) for s in range(1, 41)]
    flooded = [s.line.text for s in await read_lines(pool, chatty, limit=100)]
    assert flooded[-1].startswith("[trainyard] ") and "lines dropped" in flooded[-1]


async def test_a_job_s_limits_count_what_is_stored_then_one_marker_and_a_count() -> None:
    job = uuid4()
    port = MemoryPort()
    # An earlier attempt (or agent) stored 3 lines already.
    await port.write_lines([line(job, seq, attempt=1) for seq in range(1, 4)])
    shipper = LogShipper(port)
    await shipper.open(job, 2, JobLimits(log_lines=10, log_bytes=10_000))
    for seq in range(1, 21):
        shipper.add(line(job, seq, attempt=2))
    for seq in range(1, 6):
        shipper.add(line(job, seq, attempt=2, stream=Stream.STDERR))
    await shipper.seal(job)
    assert shipper.pending == 0 and shipper.dropped == 18

    stored = [x for x in port.lines(job) if x.attempt == 2]
    assert [(x.stream, x.seq) for x in stored] == [
        *((Stream.STDOUT, seq) for seq in range(1, 9)),
        (Stream.STDOUT, 20),
        (Stream.STDERR, 5),
    ]
    assert [x.text for x in stored[:7]] == [line(job, seq).text for seq in range(1, 8)]
    assert stored[7].text.startswith("[trainyard] the job's log limit is reached (10 lines")
    assert stored[8].text == (
        "[trainyard] 12 lines dropped (seqs 9-20): the job's log limit was reached"
    )
    assert stored[9].text == (
        "[trainyard] 5 lines dropped (seqs 1-5): the job's log limit was reached"
    )


async def test_a_job_s_byte_limit_counts_utf8_bytes() -> None:
    job = uuid4()
    port = MemoryPort()
    shipper = LogShipper(port)
    await shipper.open(job, 1, JobLimits(log_lines=1000, log_bytes=10))
    shipper.add(line(job, 1, text="☃☃☃"))  # 9 bytes
    shipper.add(line(job, 2, text="ab"))  # 11 in all: past the limit
    shipper.add(line(job, 3, text="a"))  # would fit, but the limit is reached for good
    await shipper.seal(job)
    texts = [x.text for x in port.lines(job)]
    assert texts[0] == "☃☃☃" and "log limit is reached" in texts[1]
    assert texts[2] == "[trainyard] 1 line dropped (seq 3): the job's log limit was reached"


async def test_an_attempt_that_ends_beside_the_job_s_next_one_leaves_that_one_held_to_the_limit(
    pool: asyncpg.Pool,
) -> None:
    # A restart may place the job's next attempt on the node while the last one's learners
    # still end (a CPU job fits beside them: the lost-node chaos test claims attempt 2 there
    # before attempt 1 is released), so the next one's log is opened before the last one's
    # is closed. That close must not forget the job for the attempt that runs on.
    job = uuid4()
    shipper = LogShipper(PostgresPort(pool))
    limits = JobLimits(log_lines=6, log_bytes=10_000)
    await shipper.open(job, 1, limits)
    shipper.add(line(job, 1, attempt=1))
    await shipper.seal(job)  # its learners have ended, their lines are stored
    await shipper.open(job, 2, limits)  # claimed here meanwhile
    shipper.add(line(job, 1, attempt=2))
    await shipper.flush()
    shipper.close(job, 1)  # its learners are removed next, its GPUs given back
    for seq in range(2, 11):
        shipper.add(line(job, seq, attempt=2))
    await shipper.seal(job)

    stored = [s.line for s in await read_lines(pool, job, attempt=2)]
    # 6 lines in all: attempt 1's, then 5 of attempt 2's; the limit's marker in the 6th's
    # place, then how many of the later ones were dropped.
    assert [x.seq for x in stored] == [1, 2, 3, 4, 5, 6, 10]
    assert stored[-2].text.startswith("[trainyard] the job's log limit is reached (6 lines")
    assert stored[-1].text == (
        "[trainyard] 4 lines dropped (seqs 7-10): the job's log limit was reached"
    )


async def test_an_agent_holds_a_job_to_its_log_limit_and_says_how_much_it_dropped(
    plane: Plane, agent: RunningAgent, token: str
) -> None:
    printer = [sys.executable, "-c", "for i in range(500): print(f'line {i}')"]
    job_id = await submit(plane, printer, JobLimits(log_lines=50))
    await plane.state(job_id, JobStatus.COMPLETED)
    stored = await read_lines(plane.pool, job_id, limit=1000)
    # Seen complete, the job's log is complete: its lines within the limit, then the markers.
    texts = [s.line.text for s in stored]
    assert len(texts) == 50 + 2, texts[-3:]
    assert "log limit is reached" in texts[-2]
    # The launcher's first reports and the user's first lines, 50 in all; the limit's marker at
    # seq 51, then the rest (the user's and the launcher's closing reports) counted.
    printed = [text for text in texts[:50] if not text.startswith("@@trainyard/1 ")]
    assert printed == [f"line {i}" for i in range(len(printed))] and len(printed) > 40
    count = texts[-1].removeprefix("[trainyard] ").split(" ", 1)[0]
    assert texts[-1] == (
        f"[trainyard] {count} lines dropped (seqs 52-{51 + int(count)}): "
        "the job's log limit was reached"
    )
    assert int(count) >= 500 - len(printed)


async def test_an_attempt_whose_lines_cannot_be_stored_in_time_ends_and_says_how_many_wait(
    plane: Plane,
    agent: RunningAgent,
    token: str,
    owner: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attempt_module, "LOGS_STORED_WITHIN_S", 1.0)
    printer = [
        sys.executable,
        "-c",
        "import os, time\nwhile not os.path.exists('go'): time.sleep(0.05)\n"
        "for i in range(100): print(f'line {i}')",
    ]
    job_id = await submit(plane, printer)
    await plane.state(job_id, JobStatus.PROCESSING)
    # In its working directory: the only folder of the node's that its sandbox has.
    go = learner_dir(agent.config.work_dir, job_id, 1, 0) / "go"
    # No line can be stored for now (reads go on): the learner prints, and ends.
    stall = owner.transaction()
    await stall.start()
    await owner.execute("LOCK TABLE job_logs IN SHARE MODE")
    go.touch()
    await plane.state(job_id, JobStatus.COMPLETED)  # after the bounded wait, all the same
    await stall.rollback()

    async def stored() -> bool:
        texts = [s.line.text for s in await read_lines(plane.pool, job_id)]
        return any("not yet stored" in text for text in texts)

    await eventually(stored)
    texts = [s.line.text for s in await read_lines(plane.pool, job_id)]
    assert [text for text in texts if text.startswith("line ")] == [f"line {i}" for i in range(100)]
    marker = texts[-1]
    assert marker.startswith("[trainyard] attempt 1 ended with ")
    assert int(marker.split(" with ", 1)[1].split(" ", 1)[0]) >= 100

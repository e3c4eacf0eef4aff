"""SSE of a job's events: resume with Last-Event-ID across a control plane restart, heartbeats,
the end of the stream after a terminal state, and clean closing at shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.http.app import create_app
from controlplane.jobs.lifecycle import Complete, Deploy, EnterPhase, JobStatus
from controlplane.jobs.service import Jobs
from harness.served import ServedControlPlane
from tests.tenancy import Tokens

AGENT = Metadata(actor="agent:test-node")
MANIFEST = {"name": "sse", "image": "img", "command": ["train"]}


@dataclass
class Message:
    id: int | None
    event: str | None
    data: dict[str, Any] | None
    comment: bool = False


async def messages(response: aiohttp.ClientResponse) -> AsyncIterator[Message]:
    """Parse an SSE body into messages (comments included, as heartbeats)."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            yield Message(None, None, None, comment=True)
        elif line:
            name, _, value = line.partition(": ")
            fields[name] = value
        elif fields:
            yield Message(int(fields["id"]), fields["event"], json.loads(fields["data"]))
            fields = {}


async def take(response: aiohttp.ClientResponse, count: int) -> list[Message]:
    taken: list[Message] = []
    async for message in messages(response):
        if not message.comment:
            taken.append(message)
        if len(taken) == count:
            break
    return taken


@pytest.fixture
async def jobs(store: EventStore) -> Jobs:
    return Jobs(store)


async def advance(jobs: Jobs, job_id: UUID, *states: JobStatus) -> None:
    for state in states:
        if state is JobStatus.DEPLOYING:
            command: Deploy | EnterPhase = Deploy(
                nodes=["n1"], gpus=["GPU-1"], epoch=1, at=SYSTEM_CLOCK.now()
            )
        else:
            command = EnterPhase(phase=state, at=SYSTEM_CLOCK.now())
        await jobs.execute(job_id, command, AGENT)


async def test_resume_after_a_control_plane_restart_misses_nothing_and_repeats_nothing(
    db_url: str, tokens: Tokens, jobs: Jobs, tmp_path: Path
) -> None:
    plane = ServedControlPlane(db_url, tmp_path)
    await plane.start()
    headers = {"Authorization": f"Bearer {tokens.acme}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(plane.url + "/v1/jobs", json=MANIFEST) as response:
            assert response.status == 201
            job_id = UUID((await response.json())["id"])
        await advance(jobs, job_id, JobStatus.DEPLOYING)
        async with session.get(f"{plane.url}/v1/jobs/{job_id}/events") as response:
            first = await take(response, 2)
        assert [m.event for m in first] == ["JobSubmitted", "JobDeploying"]

        assert await plane.stop() == 0
        # While nobody serves: the job moves on.
        await advance(jobs, job_id, JobStatus.DOWNLOADING, JobStatus.PROCESSING)
        await plane.start()
        resume = {"Last-Event-ID": str(first[-1].id)}
        async with session.get(f"{plane.url}/v1/jobs/{job_id}/events", headers=resume) as response:
            missed = await take(response, 2)
            await advance(jobs, job_id, JobStatus.STORING)
            live = await take(response, 1)
            await jobs.execute(job_id, Complete(exit_codes=[0], at=SYSTEM_CLOCK.now()), AGENT)
            rest = [m async for m in messages(response) if not m.comment]  # ends by itself
        await plane.stop()

    everything = [m.event for m in first + missed + live + rest]
    assert everything == [
        "JobSubmitted",
        "JobDeploying",
        "JobDownloading",
        "JobProcessing",
        "JobStoring",
        "JobCompleted",
    ]
    ids = [m.id for m in first + missed + live + rest]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert rest[-1].data is not None and rest[-1].data["state"] == "COMPLETED"


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[TestClient[Any, Any]]:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.1)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_idle_streams_get_heartbeats_and_a_finished_job_ends_at_once(
    client: TestClient[Any, Any], tokens: Tokens
) -> None:
    headers = {"Authorization": f"Bearer {tokens.acme}"}
    job = await (await client.post("/v1/jobs", json=MANIFEST, headers=headers)).json()
    response = await client.get(f"/v1/jobs/{job['id']}/events", headers=headers)
    seen: list[Message] = []
    async for message in messages(response):
        seen.append(message)
        if sum(m.comment for m in seen) == 2:
            break
    assert [m.event for m in seen if not m.comment] == ["JobSubmitted"]
    response.close()

    await client.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)
    response = await client.get(f"/v1/jobs/{job['id']}/events", headers=headers)
    events = [m.event async for m in messages(response) if not m.comment]
    assert events == ["JobSubmitted", "JobCancelled"]
    # Resuming after the terminal event: nothing to send, and the stream still ends.
    last = {**headers, "Last-Event-ID": "1000000"}
    response = await client.get(f"/v1/jobs/{job['id']}/events", headers=last)
    assert [m async for m in messages(response) if not m.comment] == []


async def test_shutdown_closes_open_streams(db_url: str, tokens: Tokens) -> None:
    server = TestServer(create_app(db_url, poll_interval=0.2, sse_heartbeat_s=5))
    await server.start_server()
    headers = {"Authorization": f"Bearer {tokens.acme}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(server.make_url("/v1/jobs"), json=MANIFEST) as response:
            job = await response.json()
        async with session.get(server.make_url(f"/v1/jobs/{job['id']}/events")) as response:
            assert [m.event for m in await take(response, 1)] == ["JobSubmitted"]
            closing = asyncio.create_task(server.close())
            # The open stream ends, cleanly and promptly, instead of holding shutdown for its
            # client until the heartbeat or a timeout.
            remaining = await asyncio.wait_for(
                asyncio.shield(_collect(messages(response))), timeout=5
            )
            assert [m for m in remaining if not m.comment] == []
            await asyncio.wait_for(closing, 10)


async def _collect(stream: AsyncIterator[Message]) -> list[Message]:
    return [m async for m in stream]

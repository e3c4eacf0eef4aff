"""A job's ranks in its view (`GET /v1/jobs/{id}`, the list), through a real HTTP server on a
real Postgres, for a two-learner job a real claim placed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agents.claims import claim
from controlplane.agents.events import GpuInfo
from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.clock import SYSTEM_CLOCK
from controlplane.events.metadata import Metadata
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, STORE
from controlplane.jobs.lifecycle import Complete, EnterPhase, JobStatus
from controlplane.jobs.service import Jobs
from tests.controlplane.http.test_jobs_api import auth, projected, submit
from tests.tenancy import Tokens

Client = TestClient[Any, Any]
AGENT = Metadata(actor="agent:n1")


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.2, sse_heartbeat_s=0.2)
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_a_two_learner_jobs_view_shows_each_rank(client: Client, tokens: Tokens) -> None:
    pool, store = client.app[POOL], client.app[STORE]
    gpus = [
        GpuInfo(index=i, uuid=f"GPU-n1-{i}", model="fake", memory_mb=80_000, healthy=True)
        for i in range(2)
    ]
    await Nodes(pool, store).register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus), ttl_s=60)
    job = await submit(client, tokens.acme, learners=2, gpus_per_learner=1)
    assert [(r["rank"], r["node"], r["state"]) for r in job["ranks"]] == [
        (0, None, "QUEUED"),
        (1, None, "QUEUED"),
    ]
    await projected(client)
    [won] = await claim(pool, store, "n1")
    job_id = UUID(job["id"])
    assert won.job.job_id == job_id
    jobs = Jobs(store)
    at = SYSTEM_CLOCK.now()
    # Rank 1 gets ahead, the job follows once rank 0 does; then rank 1 exits 0 first.
    await jobs.execute(job_id, EnterPhase(JobStatus.PROCESSING, at, learners=(1,)), AGENT)
    await jobs.execute(job_id, EnterPhase(JobStatus.PROCESSING, at, learners=(0,)), AGENT)
    await jobs.execute(job_id, Complete([0], at, learners=(1,)), AGENT)

    response = await client.get(f"/v1/jobs/{job_id}", headers=auth(tokens.acme))
    assert response.status == 200
    shown = await response.json()
    assert shown["state"] == "PROCESSING"
    assert shown["ranks"] == [
        {"rank": 0, "node": "n1", "gpus": ["GPU-n1-0"], "state": "PROCESSING", "exit_code": None},
        {"rank": 1, "node": "n1", "gpus": ["GPU-n1-1"], "state": "COMPLETED", "exit_code": 0},
    ]
    # The list shows them too, and the OpenAPI document describes them.
    await projected(client)
    page = await (await client.get("/v1/jobs", headers=auth(tokens.acme))).json()
    assert [j["ranks"] for j in page["jobs"]] == [shown["ranks"]]
    schemas = (await (await client.get("/openapi.json")).json())["components"]["schemas"]
    rank = {"$ref": "#/components/schemas/Rank"}
    assert schemas["JobView"]["properties"]["ranks"]["items"] == rank
    assert set(schemas["Rank"]["properties"]) == set(shown["ranks"][0])
    assert all(p["description"] for p in schemas["Rank"]["properties"].values())

"""One tenant's values never stop the control plane for everyone (issue 32, point 8): a
subnormal `cpus` once reached the pending recorder's floor(free / cpus), OverflowError stopped
every background worker and /healthz answered 503 from then on. Here, over HTTP to the whole
application (its background workers running), the worst values each bound allows are accepted,
the values just past them are refused naming their field, and a job stored before a bound (or
a tenant the judging fails on) is set aside while the others still get their reasons."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.agents.nodes import Nodes, NodeSpec
from controlplane.http.app import create_app
from controlplane.http.keys import POOL, STORE
from controlplane.jobs.manifest import (
    INT4_MAX,
    MAX_CPUS,
    MAX_GPUS_PER_LEARNER,
    MAX_LEARNERS,
    MAX_MEMORY_MB,
    MAX_QUERIES,
    MAX_RESTARTS,
    MAX_TIMEOUT_S,
    MIN_CPUS,
    MIN_MEMORY_MB,
    MIN_TIMEOUT_S,
)
from controlplane.searches.spec import MAX_BUDGET, MAX_TRIALS
from controlplane.tenants.limits import TenantLimits
from tests.controlplane.pending.test_pending_reasons import (
    MANIFEST,
    Client,
    gpus,
    kinds,
    pending,
    submit,
    until_reasons,
)
from tests.polling import eventually
from tests.tenancy import Tokens, auth

SUBNORMAL = 5e-324
"""The least float above 0: what `gt=0` let through."""
SEARCH: dict[str, Any] = {
    "name": "worst",
    "trial": MANIFEST,
    "space": {"params": {"lr": {"type": "log_uniform", "low": 1e-4, "high": 1e-1}}},
    "searcher": {"name": "random"},
    "metric": {"name": "accuracy", "mode": "max"},
    "budget": {"unit": "steps", "max": 10},
    "max_trials": 1,
}
DEPLOYMENT: dict[str, Any] = {"name": "worst", "model": "nothing"}
INFERENCE: dict[str, Any] = {
    "name": "worst",
    "model": "nothing",
    "input": {"generate": {"shape": [1]}},
}


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    app = create_app(db_url, poll_interval=0.1, sse_heartbeat_s=0.2)
    async with TestClient(TestServer(app)) as client:
        yield client


async def healthy(client: Client) -> None:
    response = await client.get("/healthz")
    assert response.status == 200, await response.text()


def nested(path: str, value: Any) -> dict[str, Any]:
    """{"a": {"b": value}} of "a.b"."""
    first, _, rest = path.partition(".")
    return {first: nested(rest, value) if rest else value}


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


REFUSED = [
    # Jobs: below each floor (a subnormal first), above each ceiling.
    ("/v1/jobs", MANIFEST, "cpus", SUBNORMAL),
    ("/v1/jobs", MANIFEST, "cpus", MIN_CPUS / 2),
    ("/v1/jobs", MANIFEST, "cpus", MAX_CPUS + 1),
    ("/v1/jobs", MANIFEST, "memory_mb", MIN_MEMORY_MB - 1),
    ("/v1/jobs", MANIFEST, "memory_mb", MAX_MEMORY_MB + 1),
    ("/v1/jobs", MANIFEST, "learners", MAX_LEARNERS + 1),
    ("/v1/jobs", MANIFEST, "gpus_per_learner", MAX_GPUS_PER_LEARNER + 1),
    ("/v1/jobs", MANIFEST, "deploy_timeout_s", SUBNORMAL),
    ("/v1/jobs", MANIFEST, "deploy_timeout_s", MAX_TIMEOUT_S + 1),
    ("/v1/jobs", MANIFEST, "max_restarts", MAX_RESTARTS + 1),
    ("/v1/jobs", MANIFEST, "deploy_retries", MAX_RESTARTS + 1),
    ("/v1/jobs", MANIFEST, "checkpoint.interval_seconds", 0),
    ("/v1/jobs", MANIFEST, "checkpoint.interval_seconds", INT4_MAX + 1),
    ("/v1/jobs", MANIFEST, "priority", 101),
    # Deployments and inference jobs: refused before their model is looked up.
    ("/v1/deployments", DEPLOYMENT, "resources.cpus", SUBNORMAL),
    ("/v1/deployments", DEPLOYMENT, "serving.task_timeout_s", SUBNORMAL),
    ("/v1/deployments", DEPLOYMENT, "serving.max_wait_ms", SUBNORMAL),
    ("/v1/deployments", DEPLOYMENT, "serving.max_batch_size", 1025),
    ("/v1/deployments", DEPLOYMENT, "replicas", 65),
    ("/v1/inference", INFERENCE, "query_timeout_s", SUBNORMAL),
    ("/v1/inference", INFERENCE, "weight", SUBNORMAL),
    ("/v1/inference", INFERENCE, "resources.cpus", SUBNORMAL),
    ("/v1/inference", INFERENCE, "queries", MAX_QUERIES + 1),
    ("/v1/inference", INFERENCE, "replicas", 65),
    # Searches: their trial template is a manifest, bounded alike.
    ("/v1/searches", SEARCH, "trial.cpus", SUBNORMAL),
    ("/v1/searches", SEARCH, "trial.deploy_timeout_s", SUBNORMAL),
    ("/v1/searches", SEARCH, "max_trials", MAX_TRIALS + 1),
    ("/v1/searches", SEARCH, "budget.max", MAX_BUDGET + 1),
]


async def test_the_worst_values_allowed_never_stop_the_control_plane(
    client: Client, tokens: Tokens
) -> None:
    for path, body, field, value in REFUSED:
        response = await client.post(
            path, json=merged(body, nested(field, value)), headers=auth(tokens.acme)
        )
        text = await response.text()
        assert response.status == 422, f"{path} {field}={value!r}: {response.status} {text}"
        assert field in [f["field"] for f in (await response.json())["fields"]], text

    # The ceilings, accepted while no node is known (a node then bounds a job tighter), once
    # the admin lets acme hold that much in all (the admission policy's totals, where the
    # tenant's limits have them), beside the smallest job and a search's first trial.
    totals = {
        "cpus": MAX_LEARNERS * MAX_CPUS + 1,
        "memory_mb": MAX_LEARNERS * MAX_MEMORY_MB + 2 * MIN_MEMORY_MB,
    }
    raised = {name: value for name, value in totals.items() if name in TenantLimits.model_fields}
    if raised:
        response = await client.put(
            "/v1/tenants/acme/limits", json=raised, headers=auth(tokens.admin)
        )
        assert response.status == 200, await response.text()
    most = {
        "learners": MAX_LEARNERS,
        "gpus_per_learner": MAX_GPUS_PER_LEARNER,
        "cpus": MAX_CPUS,
        "memory_mb": MAX_MEMORY_MB,
        "deploy_timeout_s": MAX_TIMEOUT_S,
        "deploy_retries": MAX_RESTARTS,
        "max_restarts": MAX_RESTARTS,
        "checkpoint": {"interval_seconds": INT4_MAX, "keep": INT4_MAX},
        "priority": 100,
    }
    largest = await submit(client, tokens.acme, **most)
    least = {"cpus": MIN_CPUS, "memory_mb": MIN_MEMORY_MB, "deploy_timeout_s": MIN_TIMEOUT_S}
    smallest = await submit(client, tokens.acme, gpus_per_learner=0, priority=-100, **least)
    search = merged(
        SEARCH,
        {"trial": least, "max_trials": MAX_TRIALS, "budget": {"max": MAX_BUDGET}},
    )
    response = await client.post("/v1/searches", json=search, headers=auth(tokens.acme))
    assert response.status == 201, await response.text()

    nodes = Nodes(client.app[POOL], client.app[STORE])
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 1)), ttl_s=60)
    normal = await submit(client, tokens.globex)
    await until_reasons(client, tokens.globex, normal, {"starting"})
    await until_reasons(client, tokens.acme, largest, {"unschedulable"})
    assert kinds(await pending(client, tokens.acme, smallest)) <= {"starting", "resources"}
    await healthy(client)


async def test_a_job_stored_out_of_bounds_is_set_aside_and_the_others_are_judged(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    """A job projected before the floors were raised holds its subnormal `cpus` in the queue's
    row (the projection is not rebuilt on upgrade): today's code meets it at every round."""
    nodes = Nodes(client.app[POOL], client.app[STORE])
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 2)), ttl_s=60)
    stored = await submit(client, tokens.acme, gpus_per_learner=0)
    await until_reasons(client, tokens.acme, stored, {"starting"})
    await owner.execute(
        "UPDATE job_status SET doc = jsonb_set(doc, '{manifest,cpus}', $2::jsonb) "
        "WHERE job_id = $1",
        stored,
        str(SUBNORMAL),
    )
    other = await submit(client, tokens.globex)
    await until_reasons(client, tokens.globex, other, {"starting"})
    shown = await until_reasons(client, tokens.acme, stored, {"unschedulable"})
    assert shown["reasons"][0]["blocking"] == "never"
    assert "cpus" in shown["reasons"][0]["detail"]
    await healthy(client)


async def test_a_job_the_judging_fails_on_is_recorded_and_the_others_are_judged(
    client: Client, tokens: Tokens, owner: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A tenant whose stored weight the walk cannot divide by (0: no bound the API sets, but a
    row may hold it): its jobs are judged alone, found failing, recorded and left out; the other
    tenants' jobs still get their reasons, and the recorder goes on."""
    nodes = Nodes(client.app[POOL], client.app[STORE])
    await nodes.register(NodeSpec("n1", uuid4(), "process", 8, 65536, gpus("n1", 2)), ttl_s=60)
    await owner.execute("UPDATE tenants SET weight = 0 WHERE name = 'globex'")
    caplog.set_level(logging.ERROR, logger="controlplane.workers")
    failing = await submit(client, tokens.globex)
    judged = await submit(client, tokens.acme)
    await until_reasons(client, tokens.acme, judged, {"starting"})
    shown = await until_reasons(client, tokens.globex, failing, {"unschedulable"})
    assert "could not be judged (ZeroDivisionError" in shown["reasons"][0]["detail"]
    assert f"pending-reasons: its step for job {failing} failed" in caplog.text
    later = await submit(client, tokens.acme, gpus_per_learner=2)

    async def judged_later() -> bool:
        return kinds(await pending(client, tokens.acme, later)) == {"resources"}

    await eventually(judged_later, seconds=10)
    await healthy(client)

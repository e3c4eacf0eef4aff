"""Serving's facade without HTTP: a task followed from the queue to its end, said once per
status with heartbeats between; what it refuses, and that a refused prediction queues nothing;
the inference facade's refusal of a job that is not one. Real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiohttp.resolver import ThreadedResolver

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.deployments.application import ServingApplication, named
from controlplane.deployments.counting import Counting
from controlplane.deployments.direct import DirectPath
from controlplane.deployments.service import Deployments
from controlplane.deployments.spec import PredictRequest
from controlplane.deployments.tasks import Target, Tasks
from controlplane.events.store import EventStore
from controlplane.inference.application import InferenceApplication
from controlplane.inference.service import Inference
from controlplane.jobs.application import JobsApplication
from controlplane.jobs.images import ImageAllowlist
from controlplane.jobs.locations import Roots
from controlplane.models.service import Models
from controlplane.refusals import Refusal, Refused
from controlplane.tenants.principals import Principal
from controlplane.tenants.submissions import SubmissionRates
from controlplane.webhooks.targets import CheckingResolver
from tests.cluster import Plane

ACME = Principal(tenant="acme", is_admin=False)


@pytest.fixture
async def tasks(pool: asyncpg.Pool, db_url: str) -> AsyncIterator[Tasks]:
    tasks = Tasks(pool, db_url, poll_interval=0.05)
    running = asyncio.create_task(tasks.run())
    yield tasks
    tasks.stop()
    await running


@pytest.fixture
def models(store: EventStore, plane: Plane, tmp_path: Path) -> Models:
    return Models(store, FileArtifactStore(tmp_path / "artifacts"), plane.jobs, roots=Roots())


@pytest.fixture
def serving(
    plane: Plane, store: EventStore, models: Models, tasks: Tasks, pool: asyncpg.Pool
) -> ServingApplication:
    deployments = Deployments(store, plane.jobs, models)
    return ServingApplication(
        deployments,
        tasks,
        pool,
        images=ImageAllowlist.parse("img"),
        direct=DirectPath(pool, deployments),
        counting=Counting(pool),
    )


async def test_a_followed_task_is_said_at_each_status_with_heartbeats_between_until_it_ends(
    serving: ServingApplication, tasks: Tasks, pool: asyncpg.Pool
) -> None:
    task_id = uuid.uuid4()
    assert await tasks.answer_or_queue(Target(tenant="acme", steps=("dbl",)), task_id, [1]) is None
    first = await serving.task("acme", str(task_id))
    said: list[str] = []
    heartbeats = 0
    changes = serving.changes("acme", first, heartbeat_s=0.05)
    async with asyncio.timeout(10), contextlib.aclosing(changes):
        async for change in changes:
            if change is not None:
                said.append(change.status)
                last = change
                continue
            heartbeats += 1
            # What a replica does, a status at a time, each after a heartbeat said nothing did.
            if said == ["queued"]:
                await pool.execute(
                    "UPDATE serving_tasks SET state = 'running', tries = 1 WHERE task_id = $1",
                    task_id,
                )
            elif said == ["queued", "running"]:
                await pool.execute(
                    "UPDATE serving_tasks SET state = 'succeeded', output = '[2]', "
                    'finished_at = now(), step_times = \'[{"invocation_ms": 1.5, '
                    '"inference_ms": 0.5}]\' WHERE task_id = $1',
                    task_id,
                )
    assert said == ["queued", "running", "succeeded"]
    assert heartbeats >= 2
    assert last.outputs == [2] and last.times.invocation_ms == 1.5 and last.deployment == "dbl"


async def test_a_task_is_found_only_by_its_tenant_and_a_malformed_id_names_the_parameter(
    serving: ServingApplication, tasks: Tasks
) -> None:
    task_id = uuid.uuid4()
    await tasks.answer_or_queue(Target(tenant="acme", steps=("dbl",)), task_id, [1])
    with pytest.raises(Refusal) as other:
        await serving.task("globex", str(task_id))
    assert (other.value.kind, other.value.message) == (Refused.NOT_FOUND, f"no task {task_id}")
    with pytest.raises(Refusal) as malformed:
        await serving.task("acme", "not-a-uuid")
    assert (malformed.value.kind, malformed.value.field) == (Refused.NOT_FOUND, "task_id")


async def test_predictions_for_what_is_not_there_are_refused_before_anything_is_queued(
    serving: ServingApplication, pool: asyncpg.Pool
) -> None:
    asked = PredictRequest(inputs=[1])
    with pytest.raises(Refusal) as deployment:
        await serving.predict("acme", "dbl", asked, None)
    assert (deployment.value.kind, deployment.value.message) == (
        Refused.NOT_FOUND,
        "no deployment dbl",
    )
    with pytest.raises(Refusal) as pipeline:
        await serving.predict_pipeline("acme", "chain", asked, "k")
    assert (pipeline.value.kind, pipeline.value.message) == (Refused.NOT_FOUND, "no pipeline chain")
    with pytest.raises(Refusal) as name:
        named("Not_A_Name")
    assert name.value.kind is Refused.NOT_FOUND and name.value.field is None
    assert await pool.fetchval("SELECT count(*) FROM serving_tasks") == 0


async def test_the_inference_facade_refuses_a_job_that_has_no_queries(
    plane: Plane,
    store: EventStore,
    models: Models,
    tasks: Tasks,
    pool: asyncpg.Pool,
) -> None:
    images = ImageAllowlist.parse("img")
    jobs = JobsApplication(
        plane.jobs,
        pool,
        store,
        images=images,
        roots=Roots(),
        submissions=SubmissionRates(),
        webhook_targets=CheckingResolver(ThreadedResolver(), ()),
    )
    deployments = Deployments(store, plane.jobs, models)
    inference = InferenceApplication(
        Inference(pool, plane.jobs, models, deployments), jobs, tasks, pool, images=images
    )
    job_id = await plane.submit(["true"])
    with pytest.raises(Refusal) as refused:
        await inference.job(ACME, str(job_id))
    assert (refused.value.kind, refused.value.message) == (
        Refused.NOT_FOUND,
        f"job {job_id} is not an inference job: it has no queries",
    )
    with pytest.raises(Refusal) as hidden:
        await inference.job(Principal(tenant="globex", is_admin=False), str(job_id))
    assert (hidden.value.kind, hidden.value.message) == (Refused.NOT_FOUND, "no such job")

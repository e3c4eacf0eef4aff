"""Each agent login reaches its own node's work only (migrations/0032_agent_node_scope.sql): two
nodes' agents, logged in as operators set them up (one login a node), each running a replica of
its own deployment; node A's agent tries everything an agent's statements can do on node B's job
and deployment, and is refused each, while B's agent does each for its own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.agents.claims import claim
from controlplane.agents.drains import Drains
from controlplane.agents.events import GpuInfo, NodeDeregistered
from controlplane.agents.nodes import Nodes, NodeSpec, node_stream
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import AGENT_ROLE, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.events import CheckpointSaved, JobCompleted, JobDownloading
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import COLUMNS as LOG_COLUMNS
from controlplane.logs.store import write_lines
from controlplane.queries import Q
from harness.agent_login import agent_login_url
from tests.cluster import USER, Plane
from tests.controlplane.agents.test_agent_role import queued_row

SECRET = {"HF_TOKEN": "tenant-b-secret"}
RLS = "row-level security"


@dataclass
class Agent:
    """One node's agent as its database sees it: its login's pool and event store, and the
    replica job it runs."""

    node: str
    agent_id: UUID
    pool: asyncpg.Pool
    store: EventStore
    job_id: UUID
    deployment: str

    def actor(self) -> Metadata:
        return Metadata.capture(f"agent:{self.node}")


async def start_agent(
    plane: Plane, db_url: str, node: str, inference_job: UUID | None = None
) -> Agent:
    """Register `node` as its own login, submit a replica of deployment `dep-<node>` (with a
    secret; running `inference_job`'s queries, if given) and claim it there."""
    pool = await create_pool(
        await agent_login_url(db_url, node), min_size=1, max_size=2, role=AGENT_ROLE
    )
    store = EventStore(pool, EVENT_REGISTRY)
    agent_id = uuid4()
    gpu = GpuInfo(index=0, uuid=f"GPU-{node}-0", model="fake", memory_mb=1024, healthy=True)
    spec = NodeSpec(node, agent_id, "process", cpus=4, memory_mb=4096, gpus=[gpu])
    await Nodes(pool, store).register(spec, ttl_s=60)
    deployment = f"dep-{node}"
    manifest = JobManifest.model_validate(
        {
            "name": f"{deployment}-replica",
            "image": "img",
            "command": ["serve"],
            "gpus_per_learner": 1,
            "servable": {
                "deployment": deployment,
                "artifact_sha256": "0" * 64,
                "entry_point": "model:predict",
                "max_batch_size": 8,
                "max_wait_ms": 0,
                "task_timeout_s": 60,
                "inference_job": inference_job,
            },
        }
    )
    job, _ = await plane.jobs.submit("acme", manifest, USER, secret_env=SECRET)
    await queued_row(plane, job.job_id)
    [won] = await claim(pool, store, node)
    assert won.job.job_id == job.job_id
    return Agent(node, agent_id, pool, store, job.job_id, deployment)


@pytest.fixture
async def agents(plane: Plane, db_url: str) -> AsyncIterator[tuple[Agent, Agent]]:
    """Node A's agent and node B's, each running its own replica."""
    a = await start_agent(plane, db_url, "node-a")
    b = await start_agent(plane, db_url, "node-b")
    yield a, b
    for agent in (a, b):
        await agent.store.close()
        await agent.pool.close()


async def test_an_agent_cannot_undrain_its_own_node(
    agents: tuple[Agent, Agent], plane: Plane, owner: asyncpg.Connection
) -> None:
    a, _ = agents
    await Drains(plane.pool, plane.store).drain(a.node, "admin", "maintenance")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await a.pool.execute("UPDATE nodes SET draining = false WHERE name = $1", a.node)
    renewal = await Nodes(a.pool, a.store).renew(a.node, a.agent_id, ttl_s=60)
    assert renewal is not None and renewal.draining
    assert await owner.fetchval("SELECT draining FROM nodes WHERE name = $1", a.node)
    # Its own node's events it still records, holding the node's row as the drain did.
    sick = GpuInfo(index=0, uuid=f"GPU-{a.node}-0", model="fake", memory_mb=1024, healthy=False)
    await Nodes(a.pool, a.store).mark_unhealthy(a.node, sick)
    types = [r.event.type_name for r in await a.store.read_stream(node_stream(a.node))]
    assert types[-2:] == ["NodeDrained", "NodeGpuUnhealthy"]


async def test_a_claim_places_each_job_on_its_own_node(
    agents: tuple[Agent, Agent], owner: asyncpg.Connection
) -> None:
    a, b = agents
    rows = await owner.fetch("SELECT job_id, node, released_at FROM allocations ORDER BY node")
    assert [(r["job_id"], r["node"], r["released_at"]) for r in rows] == [
        (a.job_id, "node-a", None),
        (b.job_id, "node-b", None),
    ]


async def test_an_agent_reads_the_secrets_of_its_nodes_jobs_only(
    agents: tuple[Agent, Agent],
) -> None:
    a, b = agents
    assert json.loads(await b.pool.fetchval(Q["job_secret_env"], b.job_id)) == SECRET
    assert await a.pool.fetchval(Q["job_secret_env"], b.job_id) is None
    assert await a.pool.fetchval("SELECT count(*) FROM job_secret_env") == 1  # its own


async def test_an_agent_appends_to_its_nodes_streams_only(
    agents: tuple[Agent, Agent], owner: asyncpg.Connection
) -> None:
    a, b = agents
    at = SYSTEM_CLOCK.now()
    stream = job_stream(b.job_id)
    version = await b.store.version(stream)
    forged = [
        (stream, version, JobCompleted(attempt=1, exit_codes=[0], at=at)),
        (
            stream,
            version,
            CheckpointSaved(attempt=1, step=9, path="x", size_bytes=1, duration_s=0, at=at),
        ),
        (node_stream(b.node), 1, NodeDeregistered(agent_id=b.agent_id, at=at)),
    ]
    before = await owner.fetchval("SELECT count(*) FROM events")
    for target, expected, event in forged:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
            await a.store.append(target, expected, [event], a.actor())
    assert await owner.fetchval("SELECT count(*) FROM events") == before
    # Its own job's stream and its own node's, and B's for B.
    own = job_stream(a.job_id)
    await a.store.append(
        own, await a.store.version(own), [JobDownloading(attempt=1, at=at)], a.actor()
    )
    await b.store.append(stream, version, [JobDownloading(attempt=1, at=at)], b.actor())
    await a.store.append(
        node_stream(a.node), 1, [NodeDeregistered(agent_id=a.agent_id, at=at)], a.actor()
    )


async def fetch_one(
    db: asyncpg.Pool | asyncpg.Connection, query: str, *args: Any
) -> asyncpg.Record:
    """The one row `query` returns."""
    row = await db.fetchrow(query, *args)
    assert row is not None, query
    return row


def line(job_id: UUID, seq: int, text: str) -> LogLine:
    return LogLine(job_id, 1, 0, Stream.STDOUT, seq, datetime.now(UTC), text)


async def test_an_agent_writes_the_log_lines_of_its_nodes_learners_only(
    agents: tuple[Agent, Agent], owner: asyncpg.Connection
) -> None:
    a, b = agents
    # As the agent writes lines: the job's head (its line ids) is refused first.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
        await write_lines(a.pool, [line(b.job_id, 1, "forged by node A")])
    # Mixed with its own lines, the batch is refused whole.
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
        await write_lines(a.pool, [line(a.job_id, 1, "mine"), line(b.job_id, 1, "forged")])
    # Lines copied in directly, under ids of their own, are refused too.
    forged = (b.job_id, 1, 0, "stdout", 1, 1000, datetime.now(UTC), "forged")
    async with a.pool.acquire() as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="learners that ran on"):
            await conn.copy_records_to_table("job_logs", records=[forged], columns=LOG_COLUMNS)
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="learners that ran on"):
            await conn.execute(
                "INSERT INTO job_logs (job_id, attempt, learner, stream, seq, id, at, line)"
                " VALUES ($1, 1, 0, 'stdout', 1, 1000, now(), 'forged')",
                b.job_id,
            )
    assert await owner.fetchval("SELECT count(*) FROM job_logs") == 0
    assert await write_lines(b.pool, [line(b.job_id, 1, "from node B")]) == 1
    assert await write_lines(a.pool, [line(a.job_id, 1, "from node A")]) == 1
    rows = await owner.fetch("SELECT job_id, line FROM job_logs ORDER BY line")
    assert [(r["job_id"], r["line"]) for r in rows] == [
        (a.job_id, "from node A"),
        (b.job_id, "from node B"),
    ]


async def test_an_agent_moves_its_own_lease_and_frees_its_own_gpus_only(
    agents: tuple[Agent, Agent], owner: asyncpg.Connection
) -> None:
    a, b = agents
    lease = await owner.fetchval("SELECT lease_until FROM nodes WHERE name = $1", b.node)
    # B's agent id is no secret (the nodes are every agent's to read, for claims).
    assert await a.pool.fetchval(Q["renew_lease"], b.node, b.agent_id, 3600) is None
    await a.pool.execute(Q["deregister_node"], b.node, b.agent_id)
    await a.pool.execute(Q["release_allocations"], [b.job_id], [1], b.node)
    await a.pool.execute(Q["forget_node_gpus"], b.node)
    await a.pool.execute("DELETE FROM allocated_gpus WHERE job_id = $1", b.job_id)
    await a.pool.execute("UPDATE node_gpus SET healthy = false WHERE node = $1", b.node)
    node = await fetch_one(owner, "SELECT state, lease_until FROM nodes WHERE name = $1", b.node)
    assert (node["state"], node["lease_until"]) == ("READY", lease)
    assert await owner.fetchval(
        "SELECT released_at IS NULL FROM allocations WHERE job_id = $1", b.job_id
    )
    assert await owner.fetchval("SELECT job_id FROM allocated_gpus WHERE gpu_uuid = 'GPU-node-b-0'")
    assert await owner.fetchval("SELECT healthy FROM node_gpus WHERE node = $1", b.node)
    # Nor forget B's job folders (which would free the job's uid while its files exist).
    await owner.execute(
        "INSERT INTO job_folders (job_id, node, uid, checkpoints) VALUES ($1, $2, NULL, $1)",
        b.job_id,
        b.node,
    )
    await a.pool.execute("DELETE FROM job_folders WHERE node = $1", b.node)
    assert await owner.fetchval("SELECT count(*) FROM job_folders WHERE node = $1", b.node) == 1
    refused: list[tuple[str, list[Any]]] = [
        # A node of B's name, or an allocation giving node A B's running job.
        (
            "INSERT INTO nodes (name, agent_id, state, lease_until, heartbeat_at, registered_at,"
            " runtime, cpus, memory_mb) VALUES ('node-c', $1, 'READY', now(), now(), now(),"
            " 'process', 1, 1)",
            [a.agent_id],
        ),
        (
            "INSERT INTO allocations (job_id, attempt, learner, tenant, node, epoch, gpus, cpus,"
            " memory_mb) VALUES ($1, 1, 7, 'acme', 'node-a', 1, '{}', 1, 1)",
            [b.job_id],
        ),
        (
            "INSERT INTO allocated_gpus (gpu_uuid, job_id, attempt, learner)"
            " VALUES ('GPU-node-a-9', $1, 1, 7)",
            [b.job_id],
        ),
        (
            "INSERT INTO job_folders (job_id, node, uid, checkpoints) VALUES ($1, 'node-b', 1, $1)",
            [a.job_id],
        ),
    ]
    for statement, args in refused:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
            await a.pool.execute(statement, *args)
    # An allocation is released, never moved to another job or node, nor brought back.
    for change in (
        "UPDATE allocations SET node = 'node-a' WHERE job_id = $1",
        "UPDATE allocations SET job_id = $1 WHERE node = 'node-a'",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await a.pool.execute(change, b.job_id)
    # B's own: its lease renewed, its GPUs freed.
    assert await b.pool.fetchval(Q["renew_lease"], b.node, b.agent_id, 3600) is not None
    await b.pool.execute(Q["release_allocations"], [b.job_id], [1], b.node)
    assert not await owner.fetchval(
        "SELECT count(*) FROM allocated_gpus WHERE job_id = $1", b.job_id
    )
    # Released, its job is no longer B's: neither its secrets nor its stream, and the
    # allocation cannot be brought back.
    assert await b.pool.fetchval(Q["job_secret_env"], b.job_id) is None
    stream = job_stream(b.job_id)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
        await b.store.append(
            stream,
            await b.store.version(stream),
            [JobDownloading(attempt=1, at=SYSTEM_CLOCK.now())],
            b.actor(),
        )
    await b.pool.execute("UPDATE allocations SET released_at = NULL WHERE job_id = $1", b.job_id)
    assert await owner.fetchval(
        "SELECT released_at IS NOT NULL FROM allocations WHERE job_id = $1", b.job_id
    )


async def queue_task(plane: Plane, deployment: str) -> UUID:
    """A task for `deployment`, as the control plane queues one (memoized: it has a key)."""
    task_id = uuid4()
    await plane.pool.execute(
        "INSERT INTO serving_tasks (task_id, tenant, steps, deployment, items, input, state,"
        " memo, memo_key, submitted_at)"
        " VALUES ($1, 'acme', ARRAY[$2], $2, 1, '[1]', 'queued', 'miss', '\\x01', now())",
        task_id,
        deployment,
    )
    return task_id


async def finish(agent: Agent, deployment: str, task_id: UUID, claim_token: UUID) -> int:
    """finish_tasks, as the agent records a batch's results."""
    recorded: int = await agent.pool.fetchval(
        Q["finish_tasks"],
        [task_id],
        ['["forged"]' if deployment != agent.deployment else '["ok"]'],
        [None],
        claim_token,
        [uuid4()],
        "acme",
        deployment,
        1.0,
        0.5,
        agent.job_id,
        [1],
        "full",
        "succeeded",
        [1.0],
        [0.5],
    )
    return recorded


async def test_an_agent_claims_and_finishes_its_deployments_tasks_only(
    agents: tuple[Agent, Agent], plane: Plane, owner: asyncpg.Connection
) -> None:
    a, b = agents
    task = await queue_task(plane, b.deployment)
    # Node A cannot see B's deployment's tasks, claim them, nor record their results.
    assert await a.pool.fetchval("SELECT count(*) FROM serving_tasks") == 0
    assert (
        await a.pool.fetch(Q["claim_tasks"], "acme", b.deployment, 8, uuid4(), a.job_id, []) == []
    )
    token = uuid4()
    [claimed] = await b.pool.fetch(Q["claim_tasks"], "acme", b.deployment, 8, token, b.job_id, [])
    assert claimed["task_id"] == task
    assert await finish(a, b.deployment, task, token) == 0  # even with B's claim token
    await a.pool.execute(Q["requeue_replica"], b.job_id, 3)
    await a.pool.execute("UPDATE serving_tasks SET output = '[\"forged\"]'")
    row = await fetch_one(owner, "SELECT state, output FROM serving_tasks WHERE task_id = $1", task)
    assert (row["state"], row["output"]) == ("running", None)
    # Nor write B's deployment's memo or batches.
    for statement in (
        "INSERT INTO serving_memo (tenant, deployment, key, output, created_at, used_at)"
        " VALUES ('acme', $1, '\\x01', '[\"forged\"]', now(), now())",
        "INSERT INTO serving_batches (batch_id, tenant, deployment, replica, tasks, items,"
        " reason, outcome, invocation_ms, at)"
        " VALUES (gen_random_uuid(), 'acme', $1, gen_random_uuid(), 1, 1, 'full', 'succeeded',"
        " 1, now())",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
            await a.pool.execute(statement, b.deployment)
    assert await owner.fetchval("SELECT count(*) FROM serving_memo") == 0
    # B records its results, memo and batch.
    assert await finish(b, b.deployment, task, token) == 1
    row = await fetch_one(owner, "SELECT state, output FROM serving_tasks WHERE task_id = $1", task)
    assert (row["state"], json.loads(row["output"])) == ("succeeded", ["ok"])
    memo = await owner.fetch("SELECT deployment FROM serving_memo")
    assert [r["deployment"] for r in memo] == [b.deployment]
    assert await owner.fetchval("SELECT count(*) FROM serving_batches") == 1
    # A task is never moved out of its own steps (to another tenant's deployment, say).
    own = await queue_task(plane, a.deployment)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
        await a.pool.execute(
            "UPDATE serving_tasks SET deployment = $2 WHERE task_id = $1", own, b.deployment
        )
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await a.pool.execute("UPDATE serving_tasks SET tenant = 'other' WHERE task_id = $1", own)


async def test_a_login_bound_to_no_node_reaches_no_nodes_work(
    agents: tuple[Agent, Agent], owner: asyncpg.Connection
) -> None:
    _, b = agents
    # B's login unbound (as logins made before 0032 are): nothing of node B's is its any more.
    login = await owner.fetchval("SELECT login FROM agent_logins WHERE node = $1", b.node)
    await owner.execute("DELETE FROM agent_logins WHERE login = $1", login)
    assert await b.pool.fetchval(Q["job_secret_env"], b.job_id) is None
    assert await b.pool.fetchval(Q["renew_lease"], b.node, b.agent_id, 60) is None
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
        await write_lines(b.pool, [line(b.job_id, 1, "unbound")])
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="bound to no node"):
        await b.pool.execute(
            "INSERT INTO job_logs (job_id, attempt, learner, stream, seq, id, at, line)"
            " VALUES ($1, 1, 0, 'stdout', 1, 1, now(), 'unbound')",
            b.job_id,
        )


async def test_an_agent_claims_and_finishes_the_queries_of_its_nodes_inference_jobs_only(
    agents: tuple[Agent, Agent], plane: Plane, db_url: str, owner: asyncpg.Connection
) -> None:
    a, _ = agents
    job = uuid4()
    await plane.pool.execute(
        "INSERT INTO inference_jobs (job_id, tenant, deployment, weight, batch_size, queries,"
        " input, created_at) VALUES ($1, 'acme', 'dep-node-c', 1, 1, 10, '{\"items\": [1]}',"
        " now())",
        job,
    )
    c = await start_agent(plane, db_url, "node-c", inference_job=job)
    try:
        # Node A asks for the job's queries: it finds no job (the row is not its to lock), so
        # it takes none and is not counted as the job's replica.
        asked = await fetch_one(a.pool, Q["claim_query"], job, a.job_id, uuid4(), a.node, 30)
        assert (asked["outcome"], asked["index"]) == ("wait", None)
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match=RLS):
            await a.pool.execute(
                "INSERT INTO inference_queries (job_id, index, state, replica, node, tries,"
                " started_at, claimed_at) VALUES ($1, 5, 'running', $2, $3, 1, now(), now())",
                job,
                a.job_id,
                a.node,
            )
        token = uuid4()
        claimed = await fetch_one(c.pool, Q["claim_query"], job, c.job_id, token, c.node, 30)
        assert (claimed["outcome"], claimed["index"]) == ("claimed", 0)
        # Node A can neither see the query nor record its result, give it back or fail the job.
        assert await a.pool.fetchval("SELECT count(*) FROM inference_queries") == 0
        forged = await fetch_one(a.pool, Q["finish_query"], job, 0, '["forged"]', None, 1.0, token)
        assert forged["recorded"] == 0
        await a.pool.execute(Q["give_back_queries"], c.job_id, 3)
        await a.pool.execute(Q["record_load_error"], job, "forged")
        row = await fetch_one(
            owner,
            "SELECT q.state, q.output, j.load_error FROM inference_queries q"
            " JOIN inference_jobs j USING (job_id) WHERE q.job_id = $1",
            job,
        )
        assert (row["state"], row["output"], row["load_error"]) == ("running", None, None)
        assert await owner.fetchval("SELECT array_agg(node) FROM inference_replicas") == [c.node]
        done = await fetch_one(c.pool, Q["finish_query"], job, 0, '["ok"]', None, 1.0, token)
        assert done["recorded"] == 1
    finally:
        await c.store.close()
        await c.pool.close()

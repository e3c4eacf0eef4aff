"""Agents' database role (migrations/0014_agent_role.sql): an agent login does the agent's whole
work (the cluster's agents all log in as one, see harness/agent_login.py) and nothing more: no
tokens, no webhook secrets, no tenants' events, no changes to the log."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest

from controlplane.agents.events import NodeRegistered
from controlplane.agents.login_cli import agent_url
from controlplane.agents.logins import login_excess, scram_verifier
from controlplane.clock import SYSTEM_CLOCK
from controlplane.database import AGENT_ROLE, Role, connect, create_pool
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.events import JobCancelled
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.streams import job_stream
from controlplane.queries import Q
from controlplane.tenants.events import TokenIssued
from harness.agent_login import AGENT_PASSWORD, agent_login_name, agent_login_url
from tests.cluster import A_WHOLE_RUN, USER, Plane, RunningAgent, learner_space
from tests.node_agent.test_agent import wait_for_line
from tests.polling import eventually

AGENT_RIGHTS = {
    # What trainyard_agent may do, relation by relation; the test below finds exactly these.
    # A migration that grants agents more adds its line here (and says why there).
    "SELECT ON schema_migrations",
    "SELECT ON nodes",
    "INSERT ON nodes",
    "UPDATE (agent_id) ON nodes",  # every column but draining, the operator's
    "UPDATE (state) ON nodes",
    "UPDATE (lease_until) ON nodes",
    "UPDATE (heartbeat_at) ON nodes",
    "UPDATE (registered_at) ON nodes",
    "UPDATE (runtime) ON nodes",
    "UPDATE (cpus) ON nodes",
    "UPDATE (memory_mb) ON nodes",
    "UPDATE (address) ON nodes",
    "UPDATE (job_plan) ON nodes",
    "SELECT ON node_gpus",
    "INSERT ON node_gpus",
    "UPDATE ON node_gpus",
    "DELETE ON node_gpus",
    "SELECT ON job_status",
    "UPDATE (not_before) ON job_status",  # to lock queue rows; row-level security refuses updates
    "SELECT ON tenants",
    "SELECT ON scheduling_policy",  # claims follow the operator's claim policy (0043)
    "SELECT ON node_capacity",
    "SELECT ON allocations",
    "INSERT ON allocations",
    "UPDATE (released_at) ON allocations",  # releases only (row-level security: its node's)
    "SELECT ON allocated_gpus",
    "INSERT ON allocated_gpus",
    "DELETE ON allocated_gpus",
    "USAGE ON SEQUENCE claim_epochs",
    "INSERT ON job_logs",
    "SELECT ON job_log_heads",
    "INSERT ON job_log_heads",
    "UPDATE ON job_log_heads",
    "SELECT ON job_log_series",
    "INSERT ON job_log_series",
    "UPDATE ON job_log_series",
    "SELECT ON events",  # job and node streams only (row-level security)
    "INSERT ON events",  # the agents' event types only (row-level security)
    "SELECT ON agent_event_types",
    "SELECT ON job_secret_env",  # to give an attempt's learners their secret_env
    "SELECT ON serving_tasks",  # to claim a deployment's tasks for its replica
    # and record their results, fenced by the claim: never a task's tenant, steps or memo key
    "UPDATE (state) ON serving_tasks",
    "UPDATE (step) ON serving_tasks",
    "UPDATE (deployment) ON serving_tasks",
    "UPDATE (input) ON serving_tasks",
    "UPDATE (output) ON serving_tasks",
    "UPDATE (error) ON serving_tasks",
    "UPDATE (claim) ON serving_tasks",
    "UPDATE (replica) ON serving_tasks",
    "UPDATE (claimed_at) ON serving_tasks",
    "UPDATE (tries) ON serving_tasks",
    "UPDATE (finished_at) ON serving_tasks",
    "UPDATE (step_times) ON serving_tasks",
    "INSERT ON serving_batches",  # each batch a replica ran
    "INSERT ON serving_memo",  # results to memoize
    # Its replicas offered on its serving channel (0040): its own node's rows only.
    "SELECT ON serving_channels",
    "INSERT ON serving_channels",
    "UPDATE ON serving_channels",
    "DELETE ON serving_channels",
    "SELECT ON inference_jobs",  # an inference job's input and its fair time
    "UPDATE (started) ON inference_jobs",  # a claim makes the job's next query
    "UPDATE (vtime) ON inference_jobs",  # and moves its fair time on
    "UPDATE (load_error) ON inference_jobs",  # a model that cannot be loaded fails the job
    "SELECT ON inference_replicas",  # which jobs share the node now
    "INSERT ON inference_replicas",  # a replica asking for queries is present on its node
    "UPDATE ON inference_replicas",
    "SELECT ON inference_queries",  # to claim a job's queries for its replica
    "INSERT ON inference_queries",  # the claim makes the query
    "UPDATE ON inference_queries",  # and records its result, fenced by the claim
    "SELECT ON job_folders",  # the folders it made, to remove at their retention's end
    "INSERT ON job_folders",  # recorded before they are made
    "DELETE ON job_folders",  # and forgotten once removed
    # learner_uids, warm_uids: none. Uids only through definer functions (WARM_UID_FUNCTIONS).
}

WARM_UID_FUNCTIONS = [
    # What agents may execute of 0047: each acts for the session's own node only.
    "hold_warm_uid(text, bigint, bigint)",
    "adopt_warm_uid(uuid, text, uuid)",
    "release_warm_uids(text, uuid[])",
]

TABLE_PRIVILEGES = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"]
AGENT_ACTOR = Metadata(actor="agent:n1")


async def held_rights(owner: asyncpg.Connection, role: str) -> set[str]:
    """Every right `role` holds on the public schema's relations, as AGENT_RIGHTS spells them."""
    tables = await owner.fetch(
        """SELECT c.relname, p.privilege FROM pg_class c, unnest($2::text[]) AS p(privilege)
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
             AND has_table_privilege($1, c.oid, p.privilege)""",
        role,
        TABLE_PRIVILEGES,
    )
    columns = await owner.fetch(
        """SELECT c.relname, a.attname, p.privilege
           FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid,
                unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p(privilege)
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
             AND a.attnum > 0 AND NOT a.attisdropped
             AND has_column_privilege($1, c.oid, a.attnum, p.privilege)
             AND NOT has_table_privilege($1, c.oid, p.privilege)""",
        role,
    )
    sequences = await owner.fetch(
        """SELECT c.relname, p.privilege FROM pg_class c,
                  unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) AS p(privilege)
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
             AND has_sequence_privilege($1, c.oid, p.privilege)""",
        role,
    )
    return (
        {f"{r['privilege']} ON {r['relname']}" for r in tables}
        | {f"{r['privilege']} ({r['attname']}) ON {r['relname']}" for r in columns}
        | {f"{r['privilege']} ON SEQUENCE {r['relname']}" for r in sequences}
    )


async def test_the_agent_role_holds_exactly_its_rights(owner: asyncpg.Connection) -> None:
    assert await held_rights(owner, AGENT_ROLE) == AGENT_RIGHTS
    assert not await owner.fetchval("SELECT has_schema_privilege($1, 'audit', 'USAGE')", AGENT_ROLE)


@pytest.fixture(params=[AGENT_ROLE, None], ids=["as-agent-role", "after-reset-role"])
async def agent_conn(
    request: pytest.FixtureRequest, db_url: str
) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the agent login: as the agent's sessions run, and with the login's own
    rights (what RESET ROLE gives back, which must be no more)."""
    role: Role | None = request.param
    conn = await connect(await agent_login_url(db_url, "n1"), role=role)
    yield conn
    await conn.close()


@pytest.mark.parametrize(
    "statement",
    [
        # An admin token: one node would be the whole service.
        "INSERT INTO api_tokens (token_sha256, token_id, tenant, is_admin, issued_at) "
        "VALUES ('x', 'tok-x', NULL, true, now())",
        "SELECT * FROM api_tokens",
        "SELECT secret FROM webhook_secrets",
        "SELECT * FROM webhook_deliveries",
        "UPDATE events SET type = 'x'",
        "DELETE FROM events",
        "TRUNCATE events",
        "INSERT INTO agent_event_types VALUES ('tenant', 'TokenIssued')",
        "DELETE FROM projection_checkpoints",
        "SELECT * FROM audit.jobs",
    ],
)
async def test_an_agent_login_is_refused_what_agents_never_need(
    agent_conn: asyncpg.Connection, owner: asyncpg.Connection, statement: str
) -> None:
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await agent_conn.execute(statement)
    assert await owner.fetchval("SELECT count(*) FROM api_tokens") == 0


async def test_an_agent_login_holds_and_gives_back_warm_uids_of_its_own_node_only(
    agent_conn: asyncpg.Connection, owner: asyncpg.Connection
) -> None:
    for function in WARM_UID_FUNCTIONS:
        assert await owner.fetchval(
            "SELECT has_function_privilege($1, $2, 'EXECUTE')", AGENT_ROLE, function
        )
    assert not await owner.fetchval(
        "SELECT has_function_privilege($1, 'agent_acts_for(text)', 'EXECUTE')", AGENT_ROLE
    )
    warm = await agent_conn.fetchrow(Q["hold_warm_uid"], "n1", 9000, 4)
    assert warm is not None
    theirs = await owner.fetchrow(Q["hold_warm_uid"], "n2", 9000, 4)  # unconfined: any node
    assert theirs is not None
    for query, args in [
        ("hold_warm_uid", ("n2", 9000, 4)),
        ("adopt_warm_uid", (uuid4(), "n2", theirs["placeholder"], uuid4())),
        ("release_warm_uids", ("n2", None)),
    ]:
        with pytest.raises(
            asyncpg.InsufficientPrivilegeError, match="works for node 'n1', not 'n2'"
        ):
            await agent_conn.fetch(Q[query], *args)
    for table in ("warm_uids", "learner_uids"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await agent_conn.fetch(f"SELECT * FROM {table}")
    assert await agent_conn.fetchval(Q["release_warm_uids"], "n1", None) == 1
    held = await owner.fetch("SELECT node, uid FROM warm_uids")
    assert [(r["node"], r["uid"]) for r in held] == [("n2", theirs["uid"])]
    assert await owner.fetchval("SELECT count(*) FROM learner_uids") == 1


@pytest.fixture
async def agent_store(db_url: str) -> AsyncIterator[EventStore]:
    """The event store as an agent uses it: its pool runs as trainyard_agent."""
    pool = await create_pool(
        await agent_login_url(db_url, "n1"), min_size=1, max_size=2, role=AGENT_ROLE
    )
    store = EventStore(pool, EVENT_REGISTRY)
    yield store
    await store.close()
    await pool.close()


async def test_an_agent_appends_its_own_events_through_group_commit(
    agent_store: EventStore, owner: asyncpg.Connection
) -> None:
    registered = NodeRegistered(
        agent_id=uuid4(), runtime="process", cpus=1, memory_mb=64, gpus=[], at="2026-01-01T00:00Z"
    )
    appended = await agent_store.append("node-n1", 0, [registered], AGENT_ACTOR)
    assert appended.version == 1
    assert [e.event for e in await agent_store.read_stream("node-n1")] == [registered]
    assert await owner.fetchval("SELECT count(*) FROM events") == 1


async def test_an_agent_cannot_append_tenants_events_nor_read_tenants_streams(
    plane: Plane, agent_store: EventStore, owner: asyncpg.Connection
) -> None:
    job_id = await plane.submit(["true"])
    before = await owner.fetchval("SELECT count(*) FROM events")
    tenant_events = await plane.store.read_stream("tenant-acme")
    assert tenant_events  # TenantCreated, written by the control plane
    assert await agent_store.read_stream("tenant-acme") == []
    submitted = (await plane.store.read_stream(job_stream(job_id)))[0].event
    node_event = NodeRegistered(
        agent_id=uuid4(), runtime="process", cpus=1, memory_mb=64, gpus=[], at=SYSTEM_CLOCK.now()
    )
    refused = [
        (job_stream(uuid4()), 0, submitted),  # JobSubmitted: tenants' and the admin's alone
        (job_stream(job_id), 1, JobCancelled(reason="by a node", at=SYSTEM_CLOCK.now())),
        # To the agent the tenant's stream is empty: version 0 is all it can expect.
        (
            "tenant-acme",
            0,
            TokenIssued(token_id="tok-1", token_sha256="0" * 64, at=SYSTEM_CLOCK.now()),
        ),
        (job_stream(job_id), 1, node_event),  # an agent's type, in the wrong category
    ]
    for stream, version, event in refused:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            await agent_store.append(stream, version, [event], AGENT_ACTOR)
    assert await owner.fetchval("SELECT count(*) FROM events") == before


async def queued_row(plane: Plane, job_id: UUID) -> None:
    """Until the jobs projection has the job's queue row."""

    async def projected() -> bool:
        query = "SELECT count(*) FROM job_status WHERE job_id = $1"
        return bool(await plane.pool.fetchval(query, job_id))

    await eventually(projected)


async def test_an_agent_locks_queue_rows_but_cannot_change_them(
    plane: Plane, agent_conn: asyncpg.Connection
) -> None:
    job_id = await plane.submit(["true"])
    await queued_row(plane, job_id)
    async with agent_conn.transaction():
        locked = await agent_conn.fetch("SELECT job_id FROM job_status FOR UPDATE SKIP LOCKED")
    assert [r["job_id"] for r in locked] == [job_id]
    for change in ("UPDATE job_status SET not_before = now()", "UPDATE job_status SET state = 'X'"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await agent_conn.execute(change)
    assert await plane.pool.fetchval("SELECT not_before FROM job_status") is None


async def test_an_agent_logged_in_as_an_agent_login_runs_a_job_whole(
    plane: Plane, agent: RunningAgent, owner: asyncpg.Connection
) -> None:
    job_id = await plane.submit(["sh", "-c", "echo hello from the learner"])
    job = await plane.state(job_id, JobStatus.COMPLETED, JobStatus.FAILED)
    assert [t.state for t in job.transitions] == A_WHOLE_RUN
    await wait_for_line(plane, job_id, "hello from the learner")  # shipped by the agent
    # The agent's sessions: the agent login, acting as trainyard_agent.
    sessions = await owner.fetch(
        "SELECT DISTINCT usename FROM pg_stat_activity "
        "WHERE datname = current_database() AND usename = $1",
        agent_login_name("n1"),
    )
    assert len(sessions) == 1
    actors = await owner.fetch(
        "SELECT DISTINCT metadata ->> 'actor' AS actor FROM events WHERE stream_id = $1",
        job_stream(job_id),
    )
    assert {r["actor"] for r in actors} == {USER.actor, "agent:n1"}


async def test_login_excess_names_what_a_login_has_beyond_the_agent_role(
    db_url: str, owner: asyncpg.Connection, roles: list[str]
) -> None:
    assert await login_excess(await agent_login_url(db_url, "n1")) == []
    assert await login_excess(db_url)  # the owner's (a superuser, for the embedded database)
    name = f"ty_t_{uuid4().hex[:10]}"
    roles.append(name)
    await owner.execute(
        f"CREATE ROLE {name} LOGIN PASSWORD '{AGENT_PASSWORD}' IN ROLE trainyard_agent, "
        "trainyard_app"
    )
    url = agent_url(db_url, name, password=AGENT_PASSWORD)
    assert await login_excess(url) == ["member of trainyard_app"]


@pytest.fixture
async def roles(owner: asyncpg.Connection) -> AsyncIterator[list[str]]:
    """Names of roles the test creates: dropped afterwards (roles outlive the database)."""
    names: list[str] = []
    yield names
    for name in names:
        await owner.execute(f"DROP ROLE IF EXISTS {name}")


def trainyard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


async def test_the_agent_refuses_to_start_with_the_owners_login(
    db_url: str, owner: asyncpg.Connection, tmp_path: Path
) -> None:
    # A work directory its learners could reach, so that the login check is what stops it.
    work = learner_space()
    result = trainyard(
        "agent", "--runtime", "process", "--fake-gpus", "1", "--work-dir", str(work),
        env={"TRAINYARD_DATABASE_URL": db_url, "TRAINYARD_HOME": str(work)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "error: the database login has more rights than the trainyard_agent role" in (
        result.stderr
    )
    assert "trainyard agent-login create NAME --node NODE --password-file FILE" in result.stderr
    assert "--allow-privileged-login" in result.stderr
    assert await owner.fetchval("SELECT count(*) FROM nodes") == 0


async def test_the_agent_refuses_to_start_as_another_nodes_login(
    db_url: str, owner: asyncpg.Connection
) -> None:
    work = learner_space()
    login = await agent_login_url(db_url, "n1")
    result = trainyard(
        "agent", "--name", "n2", "--runtime", "process", "--fake-gpus", "1",
        "--work-dir", str(work),
        env={"TRAINYARD_DATABASE_URL": login, "TRAINYARD_HOME": str(work)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "error: the database login works for node 'n1', not 'n2'" in result.stderr
    assert "trainyard agent-login bind NAME --node n2" in result.stderr
    assert await owner.fetchval("SELECT count(*) FROM nodes") == 0


async def test_agent_login_create_makes_a_member_of_the_agent_role_only(
    db_url: str, owner: asyncpg.Connection, roles: list[str], tmp_path: Path
) -> None:
    name = f"ty_t_{uuid4().hex[:10]}"
    roles.append(name)
    password = "a-long-enough-password-1"
    secret = tmp_path / "password"
    secret.write_text(password + "\n")
    env = {"TRAINYARD_DATABASE_URL": db_url}
    result = trainyard(
        "agent-login", "create", name, "--node", "gpu-7", "--password-file", str(secret), env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == agent_url(db_url, name) + "\n"
    assert password not in result.stdout + result.stderr
    member_of = await owner.fetch(
        "SELECT m.roleid::regrole::text AS role FROM pg_auth_members m "
        "WHERE m.member = $1::regrole",
        name,
    )
    assert [r["role"] for r in member_of] == [AGENT_ROLE]
    assert await owner.fetchval("SELECT node FROM agent_logins WHERE login = $1", name) == "gpu-7"
    assert await login_excess(agent_url(db_url, name, password=password)) == []
    if await owner.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
        stored = await owner.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", name)
        assert stored.startswith("SCRAM-SHA-256$4096:")

    again = trainyard(
        "agent-login", "create", name, "--node", "gpu-8",
        env={**env, "TRAINYARD_AGENT_PASSWORD": password},
    )  # fmt: skip
    assert again.returncode == 1
    assert f"a database role named {name!r} exists already" in again.stderr
    assert await owner.fetchval("SELECT node FROM agent_logins WHERE login = $1", name) == "gpu-7"


async def test_agent_login_bind_moves_a_login_to_another_node(
    db_url: str, owner: asyncpg.Connection, roles: list[str]
) -> None:
    name = f"ty_t_{uuid4().hex[:10]}"
    roles.append(name)
    # A login made before logins were bound: a member of the agent role, of no node.
    await owner.execute(
        f"CREATE ROLE {name} LOGIN PASSWORD '{AGENT_PASSWORD}' IN ROLE {AGENT_ROLE}"
    )
    env = {"TRAINYARD_DATABASE_URL": db_url}
    result = trainyard("agent-login", "bind", name, "--node", "gpu-7", env=env)
    assert result.returncode == 0, result.stderr
    assert f"database login {name!r} works for node 'gpu-7'" in result.stderr
    moved = trainyard("agent-login", "bind", name, "--node", "gpu-8", env=env)
    assert moved.returncode == 0, moved.stderr
    assert "(was 'gpu-7')" in moved.stderr
    assert await owner.fetchval("SELECT node FROM agent_logins WHERE login = $1", name) == "gpu-8"
    # Binding gives node rights: only to logins of the agent role.
    refused = trainyard("agent-login", "bind", "postgres", "--node", "gpu-7", env=env)
    assert refused.returncode == 1
    assert "no login of that name is a member of trainyard_agent" in refused.stderr
    assert not await owner.fetchval("SELECT count(*) FROM agent_logins WHERE login = 'postgres'")


@pytest.mark.parametrize(
    ("name", "password", "message"),
    [
        ("Bad-Name", "a-long-enough-password-1", "NAME 'Bad-Name'"),
        ("trainyard_x", "a-long-enough-password-1", "reserved"),
        ("ty_ok", "short", "at least 16 characters"),
        ("ty_ok", "", "no password: pass --password-file FILE or set $TRAINYARD_AGENT_PASSWORD"),
        ("ty_ok", "pässword-pässword-1", "printable ASCII"),
        ("ty_ok", "a-long-enough-password-1", "--node ' n1': a node's name"),
    ],
)
async def test_bad_agent_login_input_is_a_usage_error_that_creates_nothing(
    db_url: str, owner: asyncpg.Connection, name: str, password: str, message: str
) -> None:
    env = {"TRAINYARD_DATABASE_URL": db_url, "TRAINYARD_AGENT_PASSWORD": password}
    node = " n1" if message.startswith("--node") else "n1"
    result = trainyard("agent-login", "create", name, "--node", node, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert not await owner.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", name)


async def test_the_verifier_is_the_one_postgres_computes(
    owner: asyncpg.Connection, roles: list[str]
) -> None:
    if not await owner.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
        pytest.skip("reading pg_authid needs a superuser")
    name = f"ty_t_{uuid4().hex[:10]}"
    roles.append(name)
    password = "a-long-enough-password-1"
    await owner.execute("SET password_encryption = 'scram-sha-256'")
    await owner.execute(f"CREATE ROLE {name} PASSWORD '{password}'")
    stored = await owner.fetchval("SELECT rolpassword FROM pg_authid WHERE rolname = $1", name)
    salt = base64.b64decode(stored.split("$")[1].split(":")[1])
    assert scram_verifier(password, salt=salt) == stored

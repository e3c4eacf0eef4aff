"""The manifest's `secret_env`: given to the learners, and nowhere else. Never in the event log,
the audit views, the job's status or history, or the control plane's logs; stored apart, and
gone once the job has ended. Bad names and sizes are a 422 that writes nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from controlplane.http.app import create_app
from controlplane.jobs.manifest import MAX_SECRET_ENV
from node_agent.learners import learner_dir
from tests.cluster import RunningAgent, agent_config
from tests.polling import eventually
from tests.tenancy import Tokens, auth

Client = TestClient[Any, Any]


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Client]:
    async with TestClient(TestServer(create_app(db_url, poll_interval=0.2))) as client:
        yield client


def manifest(command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "secretive", "image": "img", "command": command, **extra}


async def state_of(client: Client, token: str, job_id: str) -> str:
    response = await client.get(f"/v1/jobs/{job_id}", headers=auth(token))
    state: str = (await response.json())["state"]
    return state


async def stored_secrets(owner: asyncpg.Connection, job_id: str) -> str | None:
    value: str | None = await owner.fetchval(
        "SELECT env::text FROM job_secret_env WHERE job_id = $1", uuid.UUID(job_id)
    )
    return value


async def everything_recorded(owner: asyncpg.Connection) -> str:
    """The event log, every audit view and every read model, as one text."""
    texts = [str(await owner.fetch("SELECT data, metadata FROM events"))]
    views = await owner.fetch(
        "SELECT table_name FROM information_schema.views WHERE table_schema = 'audit'"
    )
    assert views  # the audit schema is there to be searched
    for view in views:
        texts.append(str(await owner.fetch(f'SELECT * FROM audit."{view["table_name"]}"')))
    for table in ("job_status", "job_history", "job_logs"):
        texts.append(str(await owner.fetch(f"SELECT * FROM {table}")))
    return "\n".join(texts)


async def test_the_learner_gets_the_secret_and_nothing_else_keeps_it(
    client: Client,
    tokens: Tokens,
    owner: asyncpg.Connection,
    db_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = f"s3cret-{uuid.uuid4().hex}"
    # In its working directory: where the learner, in its sandbox, may write.
    learner = [
        sys.executable,
        "-c",
        "import json, os, pathlib\npathlib.Path('seen').write_text(json.dumps({**os.environ}))",
    ]
    body = manifest(learner, env={"MODE": "plain"}, secret_env={"API_KEY": secret})
    config = agent_config(tmp_path)
    agent = await RunningAgent(db_url, config, fake_gpus=0).started()
    try:
        response = await client.post("/v1/jobs", json=body, headers=auth(tokens.acme))
        assert response.status == 201, await response.text()
        submitted = await response.text()
        job_id = (await response.json())["id"]

        async def ended() -> bool:
            return await state_of(client, tokens.acme, job_id) == "COMPLETED"

        await eventually(ended, 60)
    finally:
        await agent.finish()
    seen = learner_dir(config.work_dir, uuid.UUID(job_id), 1, 0) / "seen"
    assert json.loads(seen.read_text())["API_KEY"] == secret  # the learner had it

    # Gone once the job ended (the `jobs` projection deletes it).
    async def forgotten() -> bool:
        return await stored_secrets(owner, job_id) is None

    await eventually(forgotten)

    shown = [submitted]
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/history", "/v1/jobs"):
        response = await client.get(path, headers=auth(tokens.acme))
        assert response.status == 200
        shown.append(await response.text())
    shown.append(await (await client.get("/openapi.json")).text())
    assert "API_KEY" not in "".join(shown)
    assert "MODE" in shown[1]  # the plain env is still shown, as before
    recorded = await everything_recorded(owner)
    assert "API_KEY" not in recorded and secret not in recorded
    assert secret not in caplog.text


async def test_secrets_are_stored_apart_until_the_job_is_cancelled(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    body = manifest(["true"], secret_env={"TOKEN": secret})
    response = await client.post("/v1/jobs", json=body, headers=auth(tokens.acme))
    assert response.status == 201, await response.text()
    job_id = (await response.json())["id"]
    assert await stored_secrets(owner, job_id) == f'{{"TOKEN": "{secret}"}}'
    # The auditor reads the audit views only, never this table.
    async with owner.transaction():
        await owner.execute("SET LOCAL ROLE trainyard_auditor")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await owner.fetch("SELECT * FROM job_secret_env")
    response = await client.post(f"/v1/jobs/{job_id}/cancel", headers=auth(tokens.acme))
    assert response.status == 200, await response.text()

    async def forgotten() -> bool:
        return await stored_secrets(owner, job_id) is None

    await eventually(forgotten)
    assert secret not in await everything_recorded(owner)


async def test_an_idempotent_retry_keeps_one_job_and_its_secrets(
    client: Client, tokens: Tokens, owner: asyncpg.Connection
) -> None:
    headers = {**auth(tokens.acme), "Idempotency-Key": "with-secrets"}
    body = manifest(["true"], secret_env={"TOKEN": "first"})
    first = await client.post("/v1/jobs", json=body, headers=headers)
    assert first.status == 201, await first.text()
    retry = await client.post("/v1/jobs", json=body, headers=headers)
    assert retry.status == 201 and retry.headers["Idempotent-Replayed"] == "true"
    job_id = (await first.json())["id"]
    assert (await retry.json())["id"] == job_id
    assert await owner.fetchval("SELECT count(*) FROM job_secret_env") == 1
    assert await stored_secrets(owner, job_id) == '{"TOKEN": "first"}'


@pytest.mark.parametrize(
    ("secret_env", "env", "message"),
    [
        ({"A=B": "x"}, {}, "invalid environment variable name"),
        ({"": "x"}, {}, "invalid environment variable name"),
        ({"KEY": "x"}, {"KEY": "y"}, "names in both env and secret_env: KEY"),
        ({f"K{i}": "x" for i in range(MAX_SECRET_ENV + 1)}, {}, "at most"),
        ({"BIG": "x" * 70_000}, {}, "bytes together"),
        ({"NUL": "a\0b"}, {}, "NUL"),
    ],
)
async def test_bad_secret_env_is_a_422_naming_it_and_writes_nothing(
    client: Client,
    tokens: Tokens,
    owner: asyncpg.Connection,
    secret_env: dict[str, str],
    env: dict[str, str],
    message: str,
) -> None:
    events = await owner.fetchval("SELECT count(*) FROM events")
    body = manifest(["true"], env=env, secret_env=secret_env)
    response = await client.post("/v1/jobs", json=body, headers=auth(tokens.acme))
    assert response.status == 422
    problem = await response.json()
    [field] = problem["fields"]
    assert field["field"].startswith("secret_env")
    assert message in field["message"]
    assert "x" * 100 not in await response.text()  # values are not echoed
    await asyncio.sleep(0.3)
    assert await owner.fetchval("SELECT count(*) FROM events") == events
    assert await owner.fetchval("SELECT count(*) FROM job_secret_env") == 0

"""The Python SDK against a served control plane (a real process) with a real agent: a script's
blocking `Client`, and the `AsyncClient` it runs on."""

from __future__ import annotations

import asyncio
import inspect
import sys
import typing
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.tenants.service import issue_token
from harness.served import ServedControlPlane
from tests.cluster import Plane, RunningAgent
from trainyard import ApiError, AsyncClient, Client, NotFound

PRINT = [sys.executable, "-c", "print('hello from the learner')"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def manifest(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    body = {"name": name, "image": "img", "command": command, "gpus_per_learner": 1}
    return {**body, "labels": {"suite": "sdk"}, **extra}


@pytest.fixture
async def server(
    db_url: str, plane: Plane, agent: RunningAgent, tmp_path: Path
) -> AsyncIterator[tuple[str, str]]:
    served = ServedControlPlane(db_url, tmp_path / "server")
    await served.start()
    token = await issue_token(plane.store, plane.runner, "acme", actor="test")
    yield served.url, token.plaintext
    await served.stop()


async def test_a_script_submits_a_job_follows_its_logs_and_finds_it(
    server: tuple[str, str],
) -> None:
    def script() -> dict[str, Any]:
        with Client(*server) as client:
            job = client.submit(manifest("hello", PRINT))
            followed = [line["line"] for line in client.logs(job["id"], follow=True)]
            return {
                "job": job,
                "followed": followed,
                "state": client.wait(job["id"]),
                "stored": list(client.logs(job["id"])),
                "listed": client.jobs(labels={"suite": "sdk"}, states=["COMPLETED"]),
                "history": client.history(job["id"])["history"],
            }

    # In a thread, as a script would be: the agent runs on this test's event loop.
    seen = await asyncio.to_thread(script)
    job_id = seen["job"]["id"]
    assert seen["job"]["state"] == "QUEUED"
    assert seen["followed"] == ["hello from the learner"]
    assert seen["state"] == "COMPLETED"
    assert seen["stored"] == [
        {"attempt": 1, "learner": 0, "stream": "stdout", "line": "hello from the learner"}
    ]
    assert [job["id"] for job in seen["listed"]] == [job_id]
    assert [entry["state"] for entry in seen["history"]][-1] == "COMPLETED"


async def test_a_job_cancelled_ends_its_events_and_errors_are_exceptions(
    server: tuple[str, str],
) -> None:
    async with AsyncClient(*server) as client:
        job = await client.submit(manifest("sleepy", SLEEP))
        events = client.events(job["id"])
        first = await anext(events)
        assert (first["type"], first["state"]) == ("JobSubmitted", "QUEUED")
        cancelled = await client.cancel(job["id"], reason="not needed")
        assert cancelled["id"] == job["id"]
        rest = [event["state"] async for event in events]
        assert rest[-1] == "CANCELLED"
        assert await client.wait(job["id"]) == "CANCELLED"
        with pytest.raises(ApiError) as refused:
            await client.checkpoint(job["id"])
        assert refused.value.status == 409
        missing = str(uuid.uuid4())
        with pytest.raises(NotFound, match=f"no job {missing}"):
            await client.job(missing)
        assert [node["name"] for node in await client.nodes()] == ["n1"]


def test_the_blocking_client_offers_every_call_of_the_async_one_with_its_signature() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("_")}

    calls = {
        name
        for name in public(AsyncClient)
        if inspect.iscoroutinefunction(getattr(AsyncClient, name))
        or inspect.isasyncgenfunction(getattr(AsyncClient, name))
    }
    assert len(calls) > 40
    assert calls - public(Client) == set(), "missing from Client"
    for name in calls:
        asynchronous = getattr(AsyncClient, name)
        blocking = inspect.signature(getattr(Client, name), eval_str=True)
        expected = inspect.signature(asynchronous, eval_str=True)
        assert blocking.parameters == expected.parameters, name
        returned = blocking.return_annotation
        if inspect.isasyncgenfunction(asynchronous):
            # A stream is a plain iterator of the same items.
            item = typing.get_args(expected.return_annotation)[0]
            assert (typing.get_origin(returned), typing.get_args(returned)) == (Iterator, (item,))
        else:
            assert returned == expected.return_annotation, name
        assert getattr(Client, name).__doc__ == asynchronous.__doc__, name
    # What the blocking client has beyond the calls: its own life (close, with) and `server`.
    assert public(Client) - calls == {"close", "server"}

"""Streaming against a hostile servable, on a real Postgres with real replicas behind a real
agent: an exception whose text holds a NUL and a lone surrogate is a failed task that can be
read back (stream and plain request alike), and outputs nested deeper than the interpreter's
stack are an `error` event, not a stalled reader or a replica that is no longer fed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from controlplane.http.deployments import PREDICTION_STREAMS
from node_agent.inference import stored
from runners.frames import FrameError, decode_message
from tests.controlplane.deployments.serving import (
    Client,
    deploy,
    predict,
    publish,
    serving_cluster,
)
from tests.controlplane.deployments.serving import until_serving as until_running
from tests.controlplane.deployments.test_direct_path import until_offered
from tests.controlplane.deployments.test_streaming import (
    events,
    eventually_row,
    open_stream,
    streaming_deployment,
)
from tests.polling import eventually
from tests.tenancy import Tokens, auth

HOSTILE = b'''
def bad_text(item):
    yield 1
    raise ValueError("bad\\x00nul " + chr(0xD800))


def deep(item):
    """One output: a list nested item["depth"] deep around a string of item["pad"] bytes (past
    the size the agent decodes in a thread), then "after"."""
    value = ["x" * item["pad"]]
    for _ in range(item["depth"]):
        value = [value]
    yield value
    yield "after"


def endless(item):
    while True:
        yield "x" * 1_000_000
'''

DEPTH = 980
"""Near the interpreter's default recursion limit of 1000: the replica encodes it and the agent
decodes it (in a thread, with little stack used), but the agent's event loop, deeper in its
stack, cannot encode it again."""


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_past_the_stack_is_a_frame_error_and_an_output_not_stored() -> None:
    payload = b'{"op":"chunk","output":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(FrameError, match="nested"):
        decode_message(payload)
    text, why = stored([nested(100_000)])
    assert text is None and why is not None and "nested" in why


async def hostile_deployment(
    client: Client,
    pool: asyncpg.Pool,
    token: str,
    name: str,
    entry_point: str,
    **serving: object,
) -> None:
    await publish(client, token, name, HOSTILE, f"hostile:{entry_point}")
    await deploy(client, token, name=name, model=name, serving={"memo": False, **serving})
    await until_running(client, token, name, 1)
    await until_offered(pool, name)


async def test_an_error_text_with_a_nul_and_a_lone_surrogate_is_a_task_read_back(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await hostile_deployment(client, pool, tokens.acme, "bad", "bad_text")
        response = await open_stream(client, tokens.acme, "bad", [1])
        received = [(m.event, m.json()) async for m in events(response)]
        assert [kind for kind, _ in received] == ["output", "error"]
        ended = received[-1][1]
        row = await eventually_row(pool, ended["task_id"])
        assert row["state"] == "failed"
        assert "bad\\x00nul \\ud800" in row["error"]
        response = await client.get(f"/v1/tasks/{ended['task_id']}", headers=auth(tokens.acme))
        assert response.status == 200

        status, body = await predict(client, tokens.acme, "bad", [1])
        assert status == 200, body
        assert "bad\\x00nul \\ud800" in body["error"]
        row = await eventually_row(pool, body["task_id"])
        assert row["state"] == "failed"
        response = await client.get(f"/v1/tasks/{body['task_id']}", headers=auth(tokens.acme))
        assert response.status == 200


async def test_an_output_nested_past_the_stack_ends_the_stream_and_the_replica_serves_on(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await hostile_deployment(client, pool, tokens.acme, "deep", "deep")
        response = await open_stream(
            client, tokens.acme, "deep", [{"depth": DEPTH, "pad": 300_000}]
        )
        assert response.status == 200, await response.text()
        # Bounded: before the fix the reader waited for the deployment's task timeout.
        async with asyncio.timeout(60):
            received = [m.event async for m in events(response)]
        assert received == ["error"]

        # The replica is fed again (the same one, or its replacement): a shallow stream runs.
        async def streams() -> bool:
            await until_offered(pool, "deep")
            response = await open_stream(client, tokens.acme, "deep", [{"depth": 2, "pad": 1}])
            if response.status != 200:
                return False
            return [m.event async for m in events(response)] == ["output", "output", "done"]

        await eventually(streams, seconds=120)


async def test_a_client_that_stops_reading_has_its_stream_ended(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await hostile_deployment(
            client, pool, tokens.acme, "endless", "endless", task_timeout_s=1.0
        )
        assert client.app is not None
        streams = client.app[PREDICTION_STREAMS]
        response = await open_stream(client, tokens.acme, "endless", [1])
        assert response.status == 200

        # It reads nothing. The stream ends within the deployment's task timeout of taking
        # nothing (a bound on a hang: before, the control plane waited to write for good).
        async def ended() -> bool:
            return not streams._open

        await eventually(ended, seconds=60)
        response.close()


async def test_a_deployment_streams_no_more_at_once_than_it_has_replicas(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    """A second stream to a replica already streaming would wait at its agent, holding one of
    the stream connections every tenant shares: it is refused (503, retry) instead."""
    async with serving_cluster(db_url, tmp_path) as cluster:
        client = cluster[0]
        folder = await streaming_deployment(cluster, pool, tokens.acme, "words", "words")
        first = await open_stream(
            client, tokens.acme, "words", [{"text": "a b", "after_first": "go"}]
        )
        received = events(first)
        assert (await anext(received)).json() == "a"  # it holds the replica
        second = await open_stream(
            client, tokens.acme, "words", [{"text": "c", "after_first": "-"}]
        )
        assert second.status == 503, await second.text()
        assert "Retry-After" in second.headers
        (folder / "go").touch()
        assert [m.event async for m in received] == ["output", "done"]

        # Once the first ended, a stream is taken again.
        async def taken() -> bool:
            response = await open_stream(
                client, tokens.acme, "words", [{"text": "c", "after_first": "-"}]
            )
            return response.status == 200 and [m.event async for m in events(response)] == [
                "output",
                "done",
            ]

        await eventually(taken, seconds=30)

"""Streaming predictions (issue 35, 6), on a real Postgres with real replicas (the process
runtime) behind a real agent's serving channel: a generator servable's outputs reach the client
one by one as they are yielded (the servable blocks after its first until the test, having
received it, lets it go on), an error mid-stream is an `error` event, a client that goes away
closes the generator within 200 ms and frees the replica, a streaming request to a plain model
is a 409 (and a plain request to a streaming model collects its outputs), and every stream that
ended is counted as a task; the SDK's `stream_predict`, both clients."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientResponse

from controlplane.http.deployments import PREDICTION_STREAMS
from tests.cluster import RunningAgent, agent_config
from tests.controlplane.deployments.serving import (
    Client,
    deploy,
    predict,
    publish,
    serving_cluster,
)
from tests.controlplane.deployments.serving import until_serving as until_running
from tests.controlplane.deployments.test_direct_path import until_offered
from tests.controlplane.deployments.test_serving import DOUBLE
from tests.polling import eventually
from tests.tenancy import Tokens, auth
from tests.trainyard.test_models_cli import user
from trainyard import AsyncClient, PredictionFailed
from trainyard import Client as BlockingClient
from trainyard.api import SseMessage, lines, sse_messages

STREAMING = b'''
import os
import time


def words(item):
    """The words of item["text"], one by one; before the second, it waits for the file
    item["after_first"] to appear in the replica's folder (the test makes it)."""
    for n, word in enumerate(item["text"].split()):
        if n == 1:
            while not os.path.exists(item["after_first"]):
                time.sleep(0.005)
        yield word


def counting(item):
    """0, 1, 2... every 10 ms: item of them, or without end for null; the instant its
    generator was closed written to the file `closed`."""
    n = 0
    try:
        while item is None or n < item:
            yield n
            n += 1
            time.sleep(0.01)
    finally:
        with open("closed", "w") as file:
            file.write(repr(time.time()))


def failing(item):
    yield "first"
    raise ValueError(f"broken after one output of {item}")
'''


async def streaming_deployment(
    cluster: tuple[Client, list[RunningAgent]],
    pool: asyncpg.Pool,
    token: str,
    name: str,
    entry_point: str,
) -> Path:
    """Deploy the STREAMING model's `entry_point` as `name`; the replica's folder (where it
    runs, and the servable's files are), once its agent offers it on its channel."""
    client, (agent,) = cluster
    await publish(client, token, name, STREAMING, f"streaming:{entry_point}")
    await deploy(client, token, name=name, model=name, serving={"memo": False})
    await until_running(client, token, name, 1)
    replica = str((await until_offered(pool, name))["replica"])
    sockets = await asyncio.to_thread(lambda: list(agent.config.work_dir.rglob("serve.sock")))
    (socket,) = [path for path in sockets if replica in path.parts]
    return socket.parent


async def open_stream(client: Client, token: str, name: str, inputs: list[Any]) -> ClientResponse:
    return await client.post(
        f"/v1/deployments/{name}/predict/stream", json={"inputs": inputs}, headers=auth(token)
    )


async def events(response: ClientResponse) -> AsyncIterator[SseMessage]:
    async for message in sse_messages(lines(response.content)):
        yield message


async def test_outputs_arrive_one_by_one_as_yielded_and_the_stream_is_counted(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as cluster:
        client = cluster[0]
        folder = await streaming_deployment(cluster, pool, tokens.acme, "words", "words")
        item = {"text": "one two three", "after_first": "go-1"}
        response = await open_stream(client, tokens.acme, "words", [item])
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "text/event-stream"
        received = events(response)
        first = await anext(received)
        # The first output, while the generator is still blocked before its second: it was
        # sent as it was yielded, not gathered to the end.
        assert (first.event, first.json()) == ("output", "one")
        assert not (folder / "go-1").exists()
        (folder / "go-1").touch()
        rest = [message async for message in received]
        assert [(m.event, m.json()) for m in rest[:2]] == [("output", "two"), ("output", "three")]
        assert [m.event for m in rest[2:]] == ["done"]
        done = rest[2].json()
        assert done["chunks"] == 3
        assert done["times"]["first_output_ms"] <= done["times"]["request_ms"]

        # Counted: a task as a plain request's, its outputs the one item's list of outputs.
        response = await client.get(f"/v1/tasks/{done['task_id']}", headers=auth(tokens.acme))
        task = await response.json()
        assert (task["status"], task["items"], task["memo"]) == ("succeeded", 1, "off")
        assert task["outputs"] == [["one", "two", "three"]]
        assert task["times"]["steps"][0]["chunks"] == 3
        # No batch: a stream runs alone.
        assert await pool.fetchval("SELECT count(*) FROM serving_batches") == 0
        response = await client.get("/v1/deployments/words/metrics", headers=auth(tokens.acme))
        figures = await response.json()
        assert (figures["requests"], figures["succeeded"]) == (1, 1)

        # A plain request to the streaming model: each item's outputs, collected.
        status, plain = await predict(
            client,
            tokens.acme,
            "words",
            [
                {"text": "a b", "after_first": "go-1"},
                {"text": "c", "after_first": "go-1"},
            ],
        )
        assert (status, plain["outputs"]) == (200, [["a", "b"], ["c"]])


async def test_an_error_mid_stream_is_an_error_event_and_a_failed_task(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as cluster:
        client = cluster[0]
        await streaming_deployment(cluster, pool, tokens.acme, "failing", "failing")
        response = await open_stream(client, tokens.acme, "failing", ["x"])
        received = [(m.event, m.json()) async for m in events(response)]
        assert received[0] == ("output", "first")
        kind, ended = received[1]
        assert kind == "error" and len(received) == 2
        assert "ValueError: broken after one output of x" in ended["error"]
        assert ended["chunks"] == 1
        row = await eventually_row(pool, ended["task_id"])
        assert (row["state"], row["output"]) == ("failed", None)
        assert "ValueError" in row["error"]


async def eventually_row(pool: asyncpg.Pool, task_id: str) -> asyncpg.Record:
    found: asyncpg.Record | None = None

    async def written() -> bool:
        nonlocal found
        found = await pool.fetchrow(
            "SELECT * FROM serving_tasks WHERE task_id = $1", uuid.UUID(task_id)
        )
        return found is not None

    await eventually(written, seconds=10)
    assert found is not None
    return found


async def test_a_client_that_goes_away_closes_the_generator_and_frees_the_replica(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path, as_deployed=True) as cluster:
        client = cluster[0]
        folder = await streaming_deployment(cluster, pool, tokens.acme, "count", "counting")
        response = await open_stream(client, tokens.acme, "count", [None])
        received = events(response)
        assert [(await anext(received)).json() for _ in range(3)] == [0, 1, 2]
        left = time.time()
        response.close()  # the client goes away mid-stream; the model would yield for ever
        closed = folder / "closed"

        async def was_closed() -> bool:
            return closed.exists()

        await eventually(was_closed, seconds=5)
        assert float(closed.read_text()) - left < 0.2
        # The replica serves the next request at once.
        response = await open_stream(client, tokens.acme, "count", [2])
        assert [(m.event, m.data) for m in [m async for m in events(response)][:2]] == [
            ("output", "0"),
            ("output", "1"),
        ]
        await client.get("/v1/deployments/count/metrics", headers=auth(tokens.acme))  # flushed
        # The stream that went away is no task; the one that ended is.
        assert await pool.fetchval("SELECT count(*) FROM serving_tasks") == 1


async def test_what_cannot_stream_is_refused_clearly(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as (client, _):
        await publish(client, tokens.acme, "double", DOUBLE, "double:predict")
        await deploy(client, tokens.acme, name="dbl", model="double", serving={"memo": False})
        await until_running(client, tokens.acme, "dbl", 1)
        await until_offered(pool, "dbl")
        response = await open_stream(client, tokens.acme, "dbl", [1])
        assert response.status == 409
        assert "does not stream" in (await response.json())["error"]
        response = await open_stream(client, tokens.acme, "dbl", [1, 2])
        assert response.status == 422
        response = await open_stream(client, tokens.acme, "nothing", [1])
        assert response.status == 404
        response = await open_stream(client, tokens.globex, "dbl", [1])
        assert response.status == 404  # another tenant's deployment is none of its own
        assert await pool.fetchval("SELECT count(*) FROM serving_tasks") == 0


async def test_without_a_channel_a_stream_is_503_with_retry_after(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    config = dataclasses.replace(agent_config(tmp_path, "n1"), serving_listen=None)
    async with serving_cluster(db_url, tmp_path, configs=[config]) as (client, _):
        await publish(client, tokens.acme, "count", STREAMING, "streaming:counting")
        await deploy(client, tokens.acme, name="count", model="count", serving={"memo": False})
        await until_running(client, tokens.acme, "count", 1)
        response = await open_stream(client, tokens.acme, "count", [2])
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert "predict without streaming" in (await response.json())["error"]
        # The queue's path takes the plain request, its outputs collected.
        status, task = await predict(client, tokens.acme, "count", [2, 1])
        assert (status, task["outputs"]) == (200, [[0, 1], [0]])


async def test_the_sdk_streams_with_both_clients(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as cluster:
        client = cluster[0]
        await streaming_deployment(cluster, pool, tokens.acme, "count", "counting")
        await streaming_deployment(cluster, pool, tokens.acme, "failing", "failing")
        server = str(client.make_url(""))
        async with AsyncClient(server, tokens.acme) as sdk:
            assert [o async for o in sdk.stream_predict("count", [3])] == [0, 1, 2]
            with pytest.raises(PredictionFailed) as failed:
                async for _ in sdk.stream_predict("failing", ["y"]):
                    pass
            assert "ValueError" in str(failed.value) and failed.value.chunks == 1

        def blocking() -> list[Any]:
            with BlockingClient(server, tokens.acme) as sdk:
                return list(sdk.stream_predict("count", [4]))

        assert await asyncio.to_thread(blocking) == [0, 1, 2, 3]


@pytest.mark.processes
async def test_the_cli_prints_each_output_as_it_comes(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as cluster:
        client = cluster[0]
        await streaming_deployment(cluster, pool, tokens.acme, "count", "counting")
        await streaming_deployment(cluster, pool, tokens.acme, "failing", "failing")
        cli = user(tmp_path, str(client.make_url("")), tokens.acme)
        streamed = await cli("predict", "count", "[3]", "--stream")
        assert (streamed.rc, streamed.stdout) == (0, "0\n1\n2\n"), streamed.stderr
        failed = await cli("predict", "failing", '["z"]', "--stream")
        assert (failed.rc, failed.stdout) == (1, '"first"\n')
        assert "failed after 1 outputs" in failed.stderr and "ValueError" in failed.stderr
        both = await cli("predict", "count", "[3]", "--stream", "--async")
        assert both.rc == 2 and "--stream takes none of" in both.stderr


async def test_a_graceful_shutdown_ends_open_streams_with_an_error_counted(
    db_url: str, tmp_path: Path, tokens: Tokens, pool: asyncpg.Pool
) -> None:
    async with serving_cluster(db_url, tmp_path) as cluster:
        client = cluster[0]
        folder = await streaming_deployment(cluster, pool, tokens.acme, "count", "counting")
        response = await open_stream(client, tokens.acme, "count", [None])
        received = events(response)
        assert (await anext(received)).json() == 0
        # What the app's shutdown does first (on_shutdown), before it waits for requests.
        client.server.app[PREDICTION_STREAMS].stop()
        rest = [message async for message in received]
        assert [m.event for m in rest[:-1]] == ["output"] * (len(rest) - 1)
        assert rest[-1].event == "error"
        ended = rest[-1].json()
        assert "shutting down" in ended["error"] and ended["chunks"] == len(rest)
        row = await eventually_row(pool, ended["task_id"])
        assert row["state"] == "failed"

        async def was_closed() -> bool:
            return (folder / "closed").exists()

        await eventually(was_closed, seconds=5)  # the model stopped too
        response = await open_stream(client, tokens.acme, "count", [1])
        assert response.status == 503  # and no new stream opens

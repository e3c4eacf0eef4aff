"""The agent's side of a stream against a replica that ignores the protocol (a tenant's code may
write any frame to its socket): told to stop, a replica that sends another output, or nothing
at all, loses its connection (ReplicaGone) rather than holding the agent's work for as long as
it likes. The replica is a fake on a socket pair; the agent's channel and feed are real."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from controlplane.agent_port.vocabulary import ServableSpec
from node_agent import replica_client
from node_agent.replica_client import ReplicaClient, ReplicaGone
from node_agent.serving_channel import DirectFeed, ServingChannel
from runners.frames import encode_frame, read_message

Replica = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


class Counts:
    chunks_after_stop = 0
    stops = 0


@asynccontextmanager
async def fake_replica(replica: Replica) -> AsyncIterator[ReplicaClient]:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    their_reader, their_writer = await asyncio.open_connection(sock=theirs)
    running = asyncio.create_task(replica(their_reader, their_writer))
    try:
        yield ReplicaClient(reader, writer)
    finally:
        running.cancel()
        writer.close()
        their_writer.close()


def ignoring_stop(counts: Counts, *, silent: bool) -> Replica:
    """A replica that streams outputs without end: after a stop, it goes on (or, `silent`,
    says nothing more)."""

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_message(reader)
        assert request is not None
        output = json.dumps(["x" * 1000] * 100)
        frame = encode_frame(f'{{"op":"chunk","id":{request["id"]},"output":{output}}}'.encode())
        while True:
            writer.write(frame)
            await writer.drain()
            if counts.stops:
                counts.chunks_after_stop += 1
            reply = await read_message(reader)
            if reply is None:
                return
            if reply["op"] == "stop":
                counts.stops += 1
                if silent:
                    await asyncio.Event().wait()

    return replica


@pytest.mark.parametrize("silent", [False, True])
async def test_a_replica_that_ignores_stop_loses_its_connection(
    silent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The end's deadline, short: the silent replica's test would otherwise wait it out.
    monkeypatch.setattr(replica_client, "STOP_S", 0.5)
    counts = Counts()
    spec = ServableSpec(
        deployment="d",
        artifact_sha256="0" * 64,
        entry_point="m:f",
        max_batch_size=4,
        max_wait_ms=5,
        task_timeout_s=5,
    )
    replica = uuid.uuid4()
    feed = DirectFeed(replica, "t", spec, streams=True)
    channel = ServingChannel("")
    channel.feeds[replica] = feed
    async with (
        fake_replica(ignoring_stop(counts, silent=silent)) as client,
        TestServer(channel.app()) as server,
        aiohttp.ClientSession() as session,
    ):
        fed = asyncio.create_task(feed.run(client))
        response = await session.post(
            server.make_url(f"/v1/replicas/{replica}/stream"),
            params={"tenant": "t", "deployment": "d"},
            data=b"1",
            headers={"Authorization": f"Bearer {channel.token}"},
        )
        await response.content.readexactly(4)
        response.close()  # the reader goes away: the agent tells the replica to stop
        # A bound on a hang: before, the agent took the replica's outputs without end.
        async with asyncio.timeout(60):
            with pytest.raises(ReplicaGone, match="stop"):
                await fed
    assert counts.stops == 1
    assert counts.chunks_after_stop == (0 if silent else 1)

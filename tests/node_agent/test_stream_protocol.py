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
from controlplane.jobs.manifest import MIN_TIMEOUT_S
from node_agent import replica_client
from node_agent.replica_client import ReplicaClient, ReplicaGone
from node_agent.serving_channel import MAX_STREAM_BYTES, DirectFeed, ServingChannel
from runners.frames import encode_frame, message_frame, read_message
from tests.polling import eventually

Replica = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


class Counts:
    chunks_after_stop = 0
    stops = 0
    sent = 0


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


def streaming_without_end(counts: Counts, size: int) -> Replica:
    """A replica whose generator yields strings of `size` bytes without end (`counts.stops`
    once told to stop, then it ends as the protocol says)."""

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_message(reader)
        assert request is not None
        frame = encode_frame(
            f'{{"op":"chunk","id":{request["id"]},"output":"{"x" * size}"}}'.encode()
        )
        sent = 0
        while True:
            writer.write(frame)
            await writer.drain()
            sent += 1
            counts.sent = sent
            reply = await read_message(reader)
            assert reply is not None
            if reply["op"] == "stop":
                counts.stops += 1
                end = {"op": "end", "id": request["id"], "chunks": sent, "stopped": True}
                writer.write(message_frame({**end, "inference_ms": 1.0}))
                await writer.drain()
                return

    return replica


@asynccontextmanager
async def channel_of(replica: Replica) -> AsyncIterator[tuple[str, aiohttp.ClientSession, str]]:
    """A feed of the fake `replica` behind a real channel (its task timeout the least, 1 s):
    the stream's URL, a session, and the channel's token."""
    spec = ServableSpec(
        deployment="d",
        artifact_sha256="0" * 64,
        entry_point="m:f",
        max_batch_size=4,
        max_wait_ms=5,
        task_timeout_s=MIN_TIMEOUT_S,
    )
    replica_id = uuid.uuid4()
    feed = DirectFeed(replica_id, "t", spec, streams=True)
    channel = ServingChannel("")
    channel.feeds[replica_id] = feed
    async with (
        fake_replica(replica) as client,
        TestServer(channel.app()) as server,
        aiohttp.ClientSession() as session,
    ):
        fed = asyncio.create_task(feed.run(client))
        try:
            yield str(server.make_url(f"/v1/replicas/{replica_id}/stream")), session, channel.token
        finally:
            fed.cancel()


async def test_a_reader_that_stops_reading_holds_little_and_its_stream_ends() -> None:
    counts = Counts()
    async with channel_of(streaming_without_end(counts, 3 * 1024 * 1024)) as (url, session, token):
        response = await session.post(
            url,
            params={"tenant": "t", "deployment": "d"},
            data=b"1",
            headers={"Authorization": f"Bearer {token}"},
        )

        # It reads nothing more. A bound on a hang: before, the agent held the outputs and the
        # replica for as long as the reader stayed.
        async def stopped() -> bool:
            return counts.stops == 1

        await eventually(stopped, seconds=60)
        response.close()
    # Held: the window's 4 MiB (two of these outputs), and what the sockets buffer; before, the
    # window's 16 outputs (48 MiB) and more.
    assert counts.sent <= 8


async def test_a_stream_past_the_most_a_task_keeps_is_stopped_at_the_agent() -> None:
    counts = Counts()
    size = 3 * 1024 * 1024
    async with channel_of(streaming_without_end(counts, size)) as (url, session, token):
        response = await session.post(
            url,
            params={"tenant": "t", "deployment": "d"},
            data=b"1",
            headers={"Authorization": f"Bearer {token}"},
        )
        messages = []
        async with asyncio.timeout(120):  # a bound on a hang: before, it streamed without end
            while (message := await read_message(response.content)) is not None:
                messages.append(message["op"])
    assert counts.stops == 1
    assert messages[-1] == "error"
    assert messages[:-1] == ["chunk"] * (MAX_STREAM_BYTES // (size + 2))

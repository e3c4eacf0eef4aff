"""A streaming servable (an entry point that is a generator function) in a real replica process
(`python -m runners.serve`), driven by the agent's `ReplicaClient`: outputs come one by one,
each taken before the next is made; a stop closes the generator (its `finally` runs) and leaves
the replica serving; errors mid-stream come back as errors; a plain request collects each
item's outputs; what cannot stream is refused with what was wrong."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from learner_process import PATIENCE_S, PYTHON, StartLearner

from node_agent.replica_client import ReplicaClient, ReplicaError
from runners.config import SERVE_DIR

STREAMS = b"""
def words(item):
    for word in item.split():
        yield word


def endless(item):
    n = 0
    try:
        while True:
            yield n
            n += 1
    finally:
        with open("closed", "w") as file:
            file.write(str(n))


def failing(item):
    yield 1
    raise KeyError(item)


def not_json(item):
    yield {1, 2}


async def asynchronous(item):
    yield item


def plain(items):
    return items
"""


@pytest.fixture
async def client(start_learner: StartLearner, tmp_path: Path) -> Any:
    """A client of a replica (its folder `tmp_path/replica/serve`) that has STREAMS's module
    at hand: `await load(client, entry)`."""
    directory = tmp_path / "replica" / "serve"
    directory.mkdir(parents=True, mode=0o700)
    start_learner((PYTHON, "-m", "runners.serve"), {SERVE_DIR: directory})
    connected = await ReplicaClient.connect(tmp_path, directory, timeout_s=PATIENCE_S)
    yield connected
    await connected.close()


async def load(client: ReplicaClient, tmp_path: Path, function: str) -> None:
    path = tmp_path / "streams.py"
    path.write_bytes(STREAMS)
    await client.load(path, hashlib.sha256(STREAMS).hexdigest(), f"streams:{function}")


class Taker:
    """`deliver` for a stream: keeps each output; answers False (stop) once it holds `most`."""

    def __init__(self, most: int | None = None) -> None:
        self.outputs: list[Any] = []
        self.most = most

    async def __call__(self, output: Any, size: int) -> bool:
        self.outputs.append(output)
        return self.most is None or len(self.outputs) < self.most


async def test_outputs_come_one_by_one_and_a_plain_request_collects_them(
    client: ReplicaClient, tmp_path: Path
) -> None:
    await load(client, tmp_path, "words")
    assert client.streams
    taken = Taker()
    end = await client.stream("one two three", taken)
    assert taken.outputs == ["one", "two", "three"]
    assert (end.chunks, end.stopped) == (3, False)
    assert end.inference_ms >= 0
    outputs, _ = await client.predict(["a b", "c"])
    assert outputs == [["a", "b"], ["c"]]
    # An agent that reconnects learns it from `hello`.
    assert await client.hello() is True and client.streams


async def test_a_stop_closes_the_generator_and_the_replica_serves_on(
    client: ReplicaClient, tmp_path: Path
) -> None:
    await load(client, tmp_path, "endless")
    taken = Taker(most=3)
    end = await client.stream(None, taken)
    assert (taken.outputs, end.chunks, end.stopped) == ([0, 1, 2], 3, True)
    # Closed at the yield of its third output: its `finally` ran before the answer came.
    assert (tmp_path / "replica" / "serve" / "closed").read_text() == "2"
    again = Taker(most=1)
    assert (await client.stream(None, again)).chunks == 1


async def test_errors_mid_stream_come_back_and_serving_goes_on(
    client: ReplicaClient, tmp_path: Path
) -> None:
    await load(client, tmp_path, "failing")
    taken = Taker()
    with pytest.raises(ReplicaError, match="KeyError: 'x'"):
        await client.stream("x", taken)
    assert taken.outputs == [1]
    with pytest.raises(ReplicaError, match="KeyError"):  # a plain request fails as a batch
        await client.predict(["y"])
    await load(client, tmp_path, "not_json")
    with pytest.raises(ReplicaError, match="output 0 is a set, not JSON"):
        await client.stream("x", Taker())
    await load(client, tmp_path, "words")
    assert (await client.stream("still serving", Taker())).chunks == 2


async def test_what_cannot_stream_is_refused_with_what_was_wrong(
    client: ReplicaClient, tmp_path: Path
) -> None:
    await load(client, tmp_path, "plain")
    assert not client.streams
    with pytest.raises(ReplicaError, match="does not stream: it is not a generator function"):
        await client.stream("x", Taker())
    assert (await client.predict([1, 2]))[0] == [1, 2]
    with pytest.raises(ReplicaError, match="is an async function"):
        await load(client, tmp_path, "asynchronous")
    assert not client.streams

"""A serving replica's share of its node's CPUs around its model's load (`serving.loading`):
no quota while it loads, for a bounded time, and its own CPUs at a low weight once the load
has ended, however it ended."""

from __future__ import annotations

import asyncio

import pytest

from node_agent.replica_client import ReplicaError
from node_agent.runtime import CpuShare
from node_agent.serving import loading
from tests.polling import eventually


class Shares:
    """What a replica's learner was given, in order."""

    def __init__(self) -> None:
        self.given: list[CpuShare] = []

    async def __call__(self, share: CpuShare) -> None:
        self.given.append(share)


async def test_a_replica_loads_unbounded_and_serves_within_its_own_cpus() -> None:
    shares = Shares()
    async with loading(shares, 10.0):
        assert shares.given == [CpuShare.LOADING]
    assert shares.given == [CpuShare.LOADING, CpuShare.SERVING]


async def test_a_load_that_outlasts_the_boost_goes_on_within_its_own_cpus() -> None:
    shares = Shares()
    async with loading(shares, 0.05):

        async def bounded() -> bool:
            return shares.given == [CpuShare.LOADING, CpuShare.SERVING]

        await eventually(bounded, seconds=10)
    assert shares.given == [CpuShare.LOADING, CpuShare.SERVING, CpuShare.SERVING]


async def test_a_failed_or_cancelled_load_ends_the_boost() -> None:
    shares = Shares()
    with pytest.raises(ReplicaError):
        async with loading(shares, 10.0):
            raise ReplicaError("the model failed to load")
    assert shares.given == [CpuShare.LOADING, CpuShare.SERVING]

    shares = Shares()
    started = asyncio.Event()

    async def load() -> None:
        async with loading(shares, 10.0):
            started.set()
            await asyncio.Future()  # a load its attempt's end cancels

    task = asyncio.create_task(load())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert shares.given == [CpuShare.LOADING, CpuShare.SERVING]

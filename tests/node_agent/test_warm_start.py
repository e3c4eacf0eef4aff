"""What a warm start asks of the port before its learner starts, on the in-memory twin with real
sandboxes: the job's secrets, the warm uid's adoption (its folders recorded with it) and the
job's log usage go out side by side, all answered before the learner starts; a secret that a
warm sandbox cannot honour starts the job cold as the uid it adopted; and a round trip that
fails leaves no sandbox behind and the agent claiming on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from uuid import UUID

import pytest

from controlplane.agent_port.memory import MemoryPort
from controlplane.agent_port.values import WarmUid
from controlplane.jobs.lifecycle import Command, EnterPhase, Job, JobStatus
from controlplane.jobs.manifest import JobManifest
from node_agent.agent import AgentConfig
from node_agent.warm import FOLDER
from tests.cluster import agent_config
from tests.node_agent.test_warm_agent import REPORT, ready_sandboxes
from tests.node_agent.twin import TENANT, Twin, TwinAgent, TwinJobs
from tests.polling import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only an agent that is root sandboxes")

GATED = ("secret_env", "adopt_warm_uid", "log_usage")
TOGETHER_S = 2.0
"""How long a gated call waits for the others to be asked too, before it answers alone."""


class GatedPort(MemoryPort):
    """The twin, recording when the calls of a start are asked and answered: each of GATED waits
    (up to TOGETHER_S) until all of them are in flight, so that calls made one after another show
    as never more than one in flight. `failing` names one that fails once, as a database away."""

    def __init__(self, failing: str | None = None) -> None:
        super().__init__()
        self.failing = failing
        self.in_flight: set[str] = set()
        self.most_in_flight = 0
        self.order: list[str] = []
        self.held: list[int] = []
        """The warm uids held, in order."""
        self._all_asked = asyncio.Event()

    async def _gate(self, name: str) -> None:
        self.in_flight.add(name)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        if self.in_flight >= set(GATED):
            self._all_asked.set()
        try:
            async with asyncio.timeout(TOGETHER_S):
                await self._all_asked.wait()
        except TimeoutError:
            pass  # asked one after another: answered all the same, and `most_in_flight` tells
        finally:
            self.in_flight.discard(name)
        self.order.append(f"{name} answered")
        if self.failing == name:
            self.failing = None
            raise ConnectionResetError(f"{name}: the database went away")

    async def hold_warm_uid(self, node: str, uids: range) -> WarmUid | None:
        warm = await super().hold_warm_uid(node, uids)
        if warm is not None:
            self.held.append(warm.uid)
            self.order.append("warm uid held")
        return warm

    async def secret_env(self, job_id: UUID) -> dict[str, str]:
        answer = await super().secret_env(job_id)
        await self._gate("secret_env")
        return answer

    async def adopt_warm_uid(
        self, job_id: UUID, node: str, placeholder: UUID, checkpoints: UUID
    ) -> int | None:
        await self._gate("adopt_warm_uid")
        return await super().adopt_warm_uid(job_id, node, placeholder, checkpoints)

    async def log_usage(self, job_id: UUID) -> tuple[int, int]:
        answer = await super().log_usage(job_id)
        await self._gate("log_usage")
        return answer

    async def execute(self, job_id: UUID, command: Command, actor: str) -> Job:
        if isinstance(command, EnterPhase):
            self.order.append(f"{command.phase.value} recorded")
        return await super().execute(job_id, command, actor)


ADOPTION_S = 0.5


class SlowAdoptionPort(GatedPort):
    """The gated twin whose adoption of a warm uid takes ADOPTION_S more: the start of a learner
    in a warm sandbox lasts that long."""

    async def adopt_warm_uid(
        self, job_id: UUID, node: str, placeholder: UUID, checkpoints: UUID
    ) -> int | None:
        await asyncio.sleep(ADOPTION_S)
        return await super().adopt_warm_uid(job_id, node, placeholder, checkpoints)


def gated_twin(port: GatedPort) -> Twin:
    twin = Twin()
    twin.port, twin.jobs = port, TwinJobs(port)
    return twin


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    return replace(agent_config(tmp_path), warm=1, warm_imports=("colorsys",))


async def one_ready(config: AgentConfig) -> None:
    """Until the agent's pool holds one ready sandbox (made at its start, or made again)."""

    async def ready() -> bool:
        return len(ready_sandboxes(config.work_dir)) == 1

    await eventually(ready, seconds=60)


@contextlib.asynccontextmanager
async def warm_agent(twin: Twin, config: AgentConfig) -> AsyncIterator[TwinAgent]:
    """An agent on `twin` keeping one warm sandbox, once it has one ready."""
    agent = await TwinAgent(twin, config, fake_gpus=1).started()
    try:
        await one_ready(config)
        yield agent
    finally:
        await agent.finish()


def submit_report(port: MemoryPort, secret_env: dict[str, str] | None = None) -> UUID:
    """A job printing its uid and whether the warm imports were there."""
    manifest = JobManifest.model_validate(
        {
            "name": "t",
            "image": "img",
            "command": [sys.executable, "-c", REPORT],
            "gpus_per_learner": 1,
        }
    )
    return port.submit(TENANT, manifest, secret_env=secret_env)


async def run_report(twin: Twin) -> list[str]:
    """`submit_report`'s job run to its end: its log."""
    return await finished_log(twin, submit_report(twin.port))


async def finished_log(twin: Twin, job_id: UUID) -> list[str]:
    """The job's log once it has completed and its report is stored."""
    await twin.state(job_id, JobStatus.COMPLETED)

    async def logged() -> bool:
        return any("preloaded" in line for line in await twin.log_text(job_id))

    await eventually(logged)
    return await twin.log_text(job_id)


async def test_a_warm_start_s_round_trips_go_together_and_end_before_its_learner_starts(
    config: AgentConfig,
) -> None:
    twin = gated_twin(port := GatedPort())
    async with warm_agent(twin, config):
        log = await run_report(twin)
        assert any("preloaded True" in line for line in log)  # it started warm
    assert port.most_in_flight == len(GATED)
    downloading = port.order.index("DOWNLOADING recorded")
    assert {f"{name} answered" for name in GATED} <= set(port.order[:downloading])


async def test_a_secret_a_warm_sandbox_cannot_honour_starts_the_job_cold_as_its_adopted_uid(
    config: AgentConfig,
) -> None:
    twin = gated_twin(port := GatedPort())
    async with warm_agent(twin, config):
        [taken] = ready_sandboxes(config.work_dir)
        job_id = submit_report(port, secret_env={"OMP_NUM_THREADS": "1"})
        log = await finished_log(twin, job_id)
        assert any("preloaded False" in line for line in log)  # cold: nothing imported ahead
        # The sandbox it adopted went, and another is made for the next claim.
        assert not taken.exists()

        await one_ready(config)
    uid = await port.allocate_uid(job_id, config.learner_uids.uids)
    assert uid == port.held[0]  # the job's own: the one its sandbox was made as
    assert any(f"uid {uid} " in line for line in log)


@pytest.mark.parametrize("failing", GATED)
async def test_a_round_trip_that_fails_leaves_no_sandbox_and_the_start_is_taken_up_again(
    config: AgentConfig, failing: str
) -> None:
    twin = gated_twin(port := GatedPort(failing))
    async with warm_agent(twin, config):
        job_id = submit_report(port)
        # Retried (the log's usage), or taken up again by the next round's accounting of the
        # node's allocations that no attempt runs (the secrets, the adoption).
        await twin.state(job_id, JobStatus.COMPLETED)
        assert port.failing is None

        # The sandbox taken for it is not left taken: used, given back or gone.
        async def settled() -> bool:
            sandboxes = list((config.work_dir / FOLDER).iterdir())
            return len(ready_sandboxes(config.work_dir)) == 1 and len(sandboxes) == 1

        await eventually(settled, seconds=60)
        log = await run_report(twin)
        assert any("preloaded True" in line for line in log)  # the next job starts warm


async def test_the_next_warm_sandbox_is_made_once_the_learner_that_took_the_last_has_started(
    config: AgentConfig,
) -> None:
    twin = gated_twin(port := SlowAdoptionPort())
    async with warm_agent(twin, config):
        log = await run_report(twin)
        assert any("preloaded True" in line for line in log)  # it started warm

        await one_ready(config)
    # The first sandbox's uid held as the agent started, the next one's only after the claim's
    # start got what it needed of the port (not as the claim took the first).
    first, second = (i for i, step in enumerate(port.order) if step == "warm uid held")
    assert first < port.order.index("adopt_warm_uid answered") < second

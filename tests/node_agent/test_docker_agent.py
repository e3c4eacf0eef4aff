"""The node agent with the Docker runtime: real Postgres, a real engine, fake GPUs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID

import aiodocker
import asyncpg
import pytest

from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import Cancel, JobStatus, RequestCheckpoint
from controlplane.logs.store import read_lines
from harness.agent_process import AgentProcess
from node_agent.containers import LearnerLabels
from node_agent.images import LEARNER_IMAGE
from tests.cluster import USER, Plane, RunningAgent, learner_space
from tests.docker_engine import Engine, containers_of, kill_from_outside, require_engine
from tests.node_agent.test_agent import SIGNALLED, wait_for_line
from tests.polling import eventually

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = pytest.mark.docker


async def submit(plane: Plane, code: str, **extra: Any) -> UUID:
    return await plane.submit(["python3", "-c", code], image=LEARNER_IMAGE, **extra)


async def released(owner: asyncpg.Connection) -> bool:
    return not await owner.fetchval("SELECT count(*) FROM allocated_gpus")


async def test_a_job_runs_in_a_container_to_completion_with_its_logs(
    plane: Plane, docker_agent: RunningAgent, docker_node: str, owner: asyncpg.Connection
) -> None:
    code = (
        "import os, sys\n"
        "print('gpus=' + os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "for i in range(50): print(f'tick {i}')\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    job_id = await submit(plane, code)
    job = await plane.state(job_id, JobStatus.COMPLETED)
    assert job.exit_codes == [0]
    assert [t.state for t in job.transitions][-4:] == [
        JobStatus.DOWNLOADING,
        JobStatus.PROCESSING,
        JobStatus.STORING,
        JobStatus.COMPLETED,
    ]
    assert job.nodes == [docker_node]
    await wait_for_line(plane, job_id, "to stderr")
    lines = await plane.log_text(job_id)
    assert f"gpus={job.gpus[0]}" in lines  # exactly its GPU
    assert [line for line in lines if line.startswith("tick")] == [f"tick {i}" for i in range(50)]
    # Its GPU went back, and its container is gone (after its lines were stored).
    await eventually(lambda: released(owner))
    assert containers_of(docker_node) == []


async def test_a_running_learner_is_labelled_pinned_and_a_kill_from_outside_fails_it(
    plane: Plane,
    docker_agent: RunningAgent,
    docker_node: str,
    docker: aiodocker.Docker,
    owner: asyncpg.Connection,
) -> None:
    job_id = await submit(
        plane, "import time\nprint('ready', flush=True)\ntime.sleep(120)", max_restarts=0
    )
    job = await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")
    [container] = containers_of(docker_node)
    info = await docker.containers.container(container).show()
    assert LearnerLabels.from_labels(info["Config"]["Labels"]) == LearnerLabels(
        job_id, attempt=1, learner=0, node=docker_node, epoch=job.epoch or 0
    )
    assert f"NVIDIA_VISIBLE_DEVICES={job.gpus[0]}" in info["Config"]["Env"]
    assert info["HostConfig"]["NetworkMode"] == "none"

    await kill_from_outside(container)
    job = await plane.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None and "SIGKILL" in job.failure_reason
    await eventually(lambda: released(owner))
    assert containers_of(docker_node) == []


async def test_checkpoint_requests_and_cancel_reach_the_container(
    plane: Plane, docker_agent: RunningAgent, docker_node: str, owner: asyncpg.Connection
) -> None:
    job_id = await submit(plane, SIGNALLED)
    await plane.state(job_id, JobStatus.PROCESSING)
    await wait_for_line(plane, job_id, "ready")
    await plane.jobs.execute(job_id, RequestCheckpoint(at=SYSTEM_CLOCK.now()), USER)
    await wait_for_line(plane, job_id, "checkpoint requested")
    await plane.jobs.execute(job_id, Cancel(reason="enough", at=SYSTEM_CLOCK.now()), USER)
    await wait_for_line(plane, job_id, "terminating")
    await eventually(lambda: released(owner))
    assert containers_of(docker_node) == []


EMPTY_IMAGE = "trainyard-test-empty:latest"


@pytest.fixture(scope="module")
def empty_image(docker_engine: Engine) -> str:
    """An image with no files at all: not even the launcher's interpreter."""
    subprocess.run(
        ["docker", "import", "-", EMPTY_IMAGE], input=EMPTY_TAR, check=True, capture_output=True
    )
    return EMPTY_IMAGE


EMPTY_TAR = bytes(1024)  # a tar archive's end: two zero blocks


@pytest.mark.parametrize(
    ("manifest", "error"),
    [
        ({"image": "trainyard-no-such-image:1"}, "is not on this node"),
        ({"image": EMPTY_IMAGE}, 'could not start it: .*"python3": executable file not found'),
        # More CPUs than the machine has (the test agent offers one more).
        (
            {"cpus": float(os.cpu_count() or 1) + 1, "image": LEARNER_IMAGE},
            "refused to create its container",
        ),
    ],
    ids=["missing-image", "launcher-not-in-image", "refused"],
)
async def test_a_learner_that_cannot_start_fails_the_job_with_the_error(
    plane: Plane,
    docker_agent: RunningAgent,
    docker_node: str,
    owner: asyncpg.Connection,
    empty_image: str,
    manifest: dict[str, Any],
    error: str,
) -> None:
    job_id = await plane.submit(["python3", "-c", "print('never runs')"], **manifest)
    job = await plane.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None and re.search(error, job.failure_reason)

    async def logged() -> bool:
        return any(re.search(error, line) for line in await plane.log_text(job_id))

    await eventually(logged)
    assert "never runs" not in await plane.log_text(job_id)
    await eventually(lambda: released(owner))
    assert containers_of(docker_node) == []


async def test_a_command_missing_from_the_image_fails_the_job_with_the_error(
    plane: Plane, docker_agent: RunningAgent, docker_node: str, owner: asyncpg.Connection
) -> None:
    job_id = await plane.submit(["no-such-program-anywhere", "--flag"], image=LEARNER_IMAGE)
    job = await plane.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None and "no-such-program-anywhere" in job.failure_reason
    await wait_for_line(plane, job_id, "no-such-program-anywhere")
    await eventually(lambda: released(owner))
    assert containers_of(docker_node) == []


async def test_a_killed_agent_s_container_runs_on_and_is_re_adopted(
    plane: Plane, tmp_path: Path, docker_engine: Engine, docker_node: str
) -> None:
    agent = AgentProcess(plane.url, learner_space() / "agent", docker_node, runtime="docker")
    await agent.start(plane.pool)
    try:
        code = (
            "import time\n"
            "for i in range(60):\n"
            "    print('line', i, flush=True)\n"
            "    time.sleep(0.05)\n"
        )
        job_id = await plane.submit(
            ["python3", "-c", code], image=LEARNER_IMAGE, gpus_per_learner=0
        )
        await plane.state(job_id, JobStatus.PROCESSING)
        await agent.kill()
        await asyncio.sleep(0.5)
        await agent.start(plane.pool)
        job = await plane.state(job_id, JobStatus.COMPLETED)
        assert job.attempt == 1 and job.restarts == 0  # the same container, not a rerun

        async def every_line_once() -> bool:
            lines = await plane.pool.fetch(
                "SELECT seq, line FROM job_logs WHERE job_id = $1 AND stream = 'stdout' "
                "ORDER BY seq",
                job_id,
            )
            numbered = [r["line"] for r in lines if r["line"].startswith("line ")]
            assert [r["seq"] for r in lines] == list(range(1, len(lines) + 1))
            return numbered == [f"line {i}" for i in range(60)]

        await eventually(every_line_once)
    finally:
        await agent.stop()


async def test_a_mount_path_naming_a_file_of_the_image_fails_the_job_with_the_reason(
    plane: Plane, docker_agent: RunningAgent, docker_node: str
) -> None:
    # `mount_path` is a place inside the container only; one the engine cannot mount there
    # (an existing file of the image) fails the deployment at once, never waits for the
    # deploy timeout, and leaves nothing on the node.
    job_id = await submit(
        plane,
        "print('never runs')",
        data={"source": "https://example.invalid/d", "mount_path": "/etc/passwd"},
        deploy_retries=0,
        deploy_timeout_s=3600,
    )
    job = await plane.state(job_id, JobStatus.FAILED)
    assert job.failure_reason is not None and "failed to start" in job.failure_reason
    await wait_for_line(plane, job_id, "learner 0 failed to start")

    async def removed() -> bool:
        return containers_of(docker_node) == []

    await eventually(removed)


async def test_a_container_runs_as_its_job_s_user_and_sees_its_data_at_mount_path(
    plane: Plane, docker_agent: RunningAgent, tmp_path: Path
) -> None:
    os.chmod(tmp_path, 0o755)  # the data root (the operator's): learners may read it
    data = tmp_path / "data.bin"
    data.write_text("the data\n")
    data.chmod(0o644)
    code = (
        "import os\n"
        "print('uid', os.getuid())\n"
        "print('data', open('/mnt/in/data.bin').read().strip())\n"
    )
    job_id = await submit(plane, code, data={"source": data.as_uri(), "mount_path": "/mnt/in"})
    job = await plane.state(job_id, JobStatus.COMPLETED, JobStatus.FAILED)
    assert job.state is JobStatus.COMPLETED, await plane.log_text(job_id)
    await wait_for_line(plane, job_id, "data the data")
    lines = await plane.log_text(job_id)
    [uid] = [int(line.split()[1]) for line in lines if line.startswith("uid ")]
    assert uid >= 200000


async def test_a_failed_container_s_logs_hold_every_line_it_printed_at_once(
    plane: Plane, docker_agent: RunningAgent
) -> None:
    code = (
        "import sys\nsys.stdout.write(''.join(f'flood {i}\\n' for i in range(20000)))\nsys.exit(3)"
    )
    jobs = [await submit(plane, code, max_restarts=0) for _ in range(2)]
    for job_id in jobs:
        await plane.state(job_id, JobStatus.FAILED)
        # Read the moment the job is seen FAILED: its attempt ended only once they were stored.
        lines = await read_lines(plane.pool, job_id, limit=30_000)
        flood = [s.line.text for s in lines if s.line.text.startswith("flood ")]
        assert flood == [f"flood {i}" for i in range(20000)]

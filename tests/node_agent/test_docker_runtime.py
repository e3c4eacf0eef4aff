"""The Docker runtime against a real engine, in what only it does: long lines from the log
driver, limits, isolation, labels, GPU requests, images, and finding a node's containers again.
What every runtime does is in test_runtime_contract.py."""

from __future__ import annotations

import os
import signal
from contextlib import aclosing
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiodocker
import pytest

from controlplane.jobs.images import ImageAllowlist
from node_agent.cli import choose_runtime
from node_agent.containers import PIDS_LIMIT, LearnerLabels
from node_agent.docker_runtime import DockerLearner, DockerRuntime
from node_agent.images import LEARNER_IMAGE
from node_agent.networks import network_name
from node_agent.runtime import (
    LOADED_WEIGHT,
    CpuShare,
    ExitStatus,
    Folder,
    LearnerSpec,
    LearnerStartError,
    Mount,
)
from tests.cluster import TEST_IMAGES
from tests.docker_engine import (
    Engine,
    containers_of,
    kill_from_outside,
    require_engine,
    require_gpu_driver,
)

require_engine()  # or the whole module skips (on CI: fails)
pytestmark = pytest.mark.docker

LEARNER_UID = 200123
"""The job's user (see node_agent.users), which its container runs as."""
GPUS = ["GPU-0b6b7c4e-0000-4000-8000-000000000001", "GPU-0b6b7c4e-0000-4000-8000-000000000002"]


def spec(tmp_path: Path, node: str, command: list[str], **changes: Any) -> LearnerSpec:
    values: dict[str, Any] = {
        "job_id": uuid4(),
        "attempt": 2,
        "learner": 1,
        "epoch": 7,
        "node": node,
        "image": LEARNER_IMAGE,
        "command": command,
        "env": {},
        "workdir": tmp_path / "work",
        "gpus": [],
        "cpus": 1.0,
        "memory_mb": 512,
        "user": (LEARNER_UID, LEARNER_UID),
        "folders": [Folder(tmp_path, tmp_path / "work")],
    }
    return LearnerSpec(**{**values, **changes})


def python(code: str) -> list[str]:
    return ["python3", "-c", code]


SLEEPER = python("print('ready', flush=True)\nimport time\ntime.sleep(120)")


async def show(docker: aiodocker.Docker, learner: DockerLearner) -> dict[str, Any]:
    info: dict[str, Any] = await docker.containers.container(learner.id).show()
    return info


async def first_line(learner: DockerLearner) -> str:
    async with aclosing(learner.lines()) as lines:
        async for line in lines:
            return line.text
    raise AssertionError("the learner ended without a line")


async def test_a_line_longer_than_the_log_drivers_messages_arrives_whole(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    # The engine's log driver cuts lines into 16 KiB messages; the runtime joins them again.
    code = "print('x' * 40000)\nprint('after', end='')\n"
    learner = await DockerRuntime(docker).start(spec(tmp_path, docker_node, python(code)))
    lines = [line.text async for line in learner.lines()]
    assert await learner.wait() == ExitStatus(code=0)
    assert lines == ["x" * 40000, "after"]
    await learner.remove()
    assert containers_of(docker_node) == []


async def test_inspect_shows_the_gpus_limits_isolation_and_labels(
    docker: aiodocker.Docker, docker_engine: Engine, docker_node: str, tmp_path: Path
) -> None:
    require_gpu_driver(docker_engine)
    checkpoints = tmp_path / "checkpoints"
    wanted = spec(
        tmp_path,
        docker_node,
        SLEEPER,
        gpus=GPUS,
        cpus=0.5,
        memory_mb=300,
        mounts=[Mount.same(checkpoints, writable=True)],
        folders=[Folder(tmp_path, tmp_path / "work"), Folder(tmp_path, checkpoints)],
    )
    learner = await DockerRuntime(docker, request_gpus=True).start(wanted)
    assert await first_line(learner) == "ready"
    info = await show(docker, learner)
    assert info["State"]["Running"]
    host = info["HostConfig"]
    [request] = host["DeviceRequests"]
    assert (request["Driver"], request["DeviceIDs"], request["Capabilities"]) == (
        "nvidia",
        GPUS,
        [["gpu"]],
    )
    assert "NVIDIA_VISIBLE_DEVICES=" + ",".join(GPUS) in info["Config"]["Env"]
    assert "CUDA_VISIBLE_DEVICES=" + ",".join(GPUS) in info["Config"]["Env"]
    assert (host["NanoCpus"], host["Memory"], host["MemorySwap"]) == (
        5 * 10**8,
        300 << 20,
        300 << 20,
    )
    assert host["PidsLimit"] == PIDS_LIMIT
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True
    assert info["Config"]["User"] == f"{LEARNER_UID}:{LEARNER_UID}"
    assert {(m["Destination"], m["RW"]) for m in info["Mounts"]} == {
        (str(wanted.workdir), True),
        (str(checkpoints), True),
    }
    assert LearnerLabels.from_labels(info["Config"]["Labels"]) == LearnerLabels(
        wanted.job_id, attempt=2, learner=1, node=docker_node, epoch=7
    )
    learner.signal(signal.SIGKILL)
    await learner.wait()


ISOLATION_CHECK = """
import os, pathlib
print('uid', os.getuid())
for path in ['/usr/x', '/tmp/x', os.environ['HOME'] + '/x', os.environ['CHECKPOINTS'] + '/x']:
    try:
        pathlib.Path(path).write_text('x')
        print('writable', path)
    except OSError:
        print('read-only', path)
print('interfaces', ' '.join(sorted(os.listdir('/sys/class/net'))))
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())
print('capabilities', status['CapEff'].strip(), 'no-new-privs', status['NoNewPrivs'].strip())
"""


async def test_inside_the_learner_is_a_non_root_user_without_network_or_privileges(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    wanted = spec(
        tmp_path,
        docker_node,
        python(ISOLATION_CHECK),
        env={"CHECKPOINTS": str(checkpoints)},
        mounts=[Mount.same(checkpoints, writable=True)],
        folders=[Folder(tmp_path, tmp_path / "work"), Folder(tmp_path, checkpoints)],
    )
    learner = await DockerRuntime(docker).start(wanted)
    lines = [line.text async for line in learner.lines()]
    assert await learner.wait() == ExitStatus(code=0), lines
    assert lines == [
        f"uid {LEARNER_UID}",
        "read-only /usr/x",
        "writable /tmp/x",
        f"writable {wanted.workdir}/x",
        f"writable {checkpoints}/x",
        "interfaces lo",
        "capabilities 0000000000000000 no-new-privs 1",
    ]
    # The learner's files are on the node, owned by the learner's user.
    assert (checkpoints / "x").stat().st_uid == LEARNER_UID
    await learner.remove()


async def test_a_tenant_allowed_the_network_gets_one(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    code = "import os; print(' '.join(sorted(os.listdir('/sys/class/net'))))"
    wanted = spec(tmp_path, docker_node, python(code), network=True)
    learner = await DockerRuntime(docker).start(wanted)
    # Its job's own (tests/node_agent/test_networks.py has what it reaches).
    assert (await show(docker, learner))["HostConfig"]["NetworkMode"] == network_name(wanted.job_id)
    assert await first_line(learner) == "eth0 lo"
    await learner.wait()
    await learner.remove()


async def test_killing_the_container_from_outside_is_a_kill(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    learner = await DockerRuntime(docker).start(spec(tmp_path, docker_node, SLEEPER))
    assert await first_line(learner) == "ready"
    await kill_from_outside(learner.id)
    status = await learner.wait()
    assert (status.signal, status.succeeded) == ("SIGKILL", False)
    await learner.remove()


async def test_a_replica_s_container_loads_on_every_cpu_then_serves_within_its_own(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    runtime = DockerRuntime(docker)
    wanted = spec(tmp_path, docker_node, SLEEPER, cpus=0.5)
    learner = await runtime.start(wanted)
    assert await first_line(learner) == "ready"

    def cpu(info: dict[str, Any]) -> tuple[int, int]:
        return info["HostConfig"]["NanoCpus"], info["HostConfig"]["CpuShares"]

    await learner.share_cpu(CpuShare.LOADING)
    assert cpu(await show(docker, learner)) == ((os.cpu_count() or 1) * 10**9, 1024)
    await learner.share_cpu(CpuShare.SERVING)
    assert cpu(await show(docker, learner)) == (5 * 10**8, round(1024 * LOADED_WEIGHT))
    # A restarted agent's hold on it does the same (its quota comes from its spec).
    await learner.share_cpu(CpuShare.LOADING)
    adopted = await runtime.adopt(wanted, None)
    assert adopted is not None
    await adopted.share_cpu(CpuShare.SERVING)
    assert cpu(await show(docker, learner)) == (5 * 10**8, round(1024 * LOADED_WEIGHT))
    learner.signal(signal.SIGKILL)
    await learner.wait()
    await learner.remove()
    # A container gone cannot be changed: said, not raised (the replica is gone too).
    await learner.share_cpu(CpuShare.LOADING)


async def test_a_learner_over_its_memory_limit_is_reported_oom_killed(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    hog = python("blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))")
    learner = await DockerRuntime(docker).start(spec(tmp_path, docker_node, hog, memory_mb=64))
    status = await learner.wait()
    assert status.oom_killed
    assert status.describe() == "killed for using too much memory (OOM)"
    await learner.remove()


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        (
            {"image": "trainyard-no-such-image:1"},
            "image 'trainyard-no-such-image:1' is not on this node",
        ),
        ({"cpus": float(os.cpu_count() or 1) + 1}, "refused to create its container: .*CPU"),
    ],
    ids=["missing-image", "refused"],
)
async def test_a_learner_that_cannot_start_says_why_and_leaves_no_container(
    docker: aiodocker.Docker,
    docker_node: str,
    tmp_path: Path,
    changes: dict[str, Any],
    error: str,
) -> None:
    command = changes.pop("command", SLEEPER)
    with pytest.raises(LearnerStartError, match=error):
        runtime = DockerRuntime(docker, images=ImageAllowlist.parse(TEST_IMAGES))
        await runtime.start(spec(tmp_path, docker_node, command, **changes))
    assert containers_of(docker_node) == []


async def test_a_node_s_learners_are_found_again_by_their_labels(
    docker: aiodocker.Docker, docker_node: str, tmp_path: Path
) -> None:
    runtime = DockerRuntime(docker)
    code = (
        "import os, time\n"
        "print('one'); print('two', flush=True)\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
        "print('three')\n"
        "raise SystemExit(4)\n"
    )
    wanted = spec(tmp_path, docker_node, python(code))
    started = await runtime.start(wanted)
    async with aclosing(started.lines()) as lines:
        seen = [await anext(lines), await anext(lines)]
    assert [line.text for line in seen] == ["one", "two"]

    [found] = await runtime.find(docker_node)
    labels = LearnerLabels.of(wanted)
    assert (found.job_id, found.attempt, found.learner, found.epoch) == (
        labels.job_id,
        labels.attempt,
        labels.learner,
        labels.epoch,
    )
    assert found.handle == started.id
    assert await runtime.find("another-node") == []
    adopted = await runtime.adopt(wanted, found)
    assert isinstance(adopted, DockerLearner)
    (wanted.workdir / "go").touch()
    # From the last line read on (inclusive), to the end, and how it ended.
    again = [line.text async for line in adopted.lines(since=seen[-1].at)]
    assert again == ["two", "three"]
    assert await adopted.wait() == ExitStatus(code=4)

    # Ended while no agent watched: no longer running, found again by its name.
    assert await runtime.find(docker_node) == []
    ended = await runtime.adopt(wanted, None)
    assert ended is not None
    assert [line.text async for line in ended.lines()] == ["one", "two", "three"]
    await ended.remove()
    assert await runtime.adopt(wanted, None) is None


async def test_an_agent_not_told_otherwise_runs_learners_in_containers() -> None:
    assert (await choose_runtime(None))[0] == "docker"
    assert await choose_runtime("process") == ("process", "--runtime")

"""The contract of every learner runtime (`LearnerRuntime`): the process runtime and the Docker
runtime pass the same tests. Output, exit status, signals, the learner's user and environment,
a start that fails, and a restarted agent finding and adopting its learners. What only one
runtime does is tested with it (test_process_runtime.py, test_docker_runtime.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiodocker
import pytest

from node_agent.docker_runtime import DockerRuntime
from node_agent.images import LEARNER_IMAGE
from node_agent.learners import learner_dir
from node_agent.process_runtime import ProcessRuntime
from node_agent.runtime import (
    ExitStatus,
    Folder,
    Learner,
    LearnerRuntime,
    LearnerSpec,
    LearnerStartError,
)
from tests.docker_engine import containers_of, node_name, remove_containers_of
from tests.node_agent.test_agent import SIGNALLED

LEARNER_UID = 200456
"""The job's user (see node_agent.users): a container always runs as one, a process when the
agent is root."""


@dataclass
class Node:
    """A runtime on a node of the test's own, and how learners are written for it."""

    runtime: LearnerRuntime
    name: str
    work_dir: Path
    python: str
    """The learner's Python: the agent's own for processes, the image's in a container."""
    user: tuple[int, int] | None
    leftovers: Callable[[], list[str]]
    """What the node's learners left behind (containers); a process leaves nothing."""

    def spec(self, code: str, **changes: Any) -> LearnerSpec:
        job_id = uuid4()
        workdir = learner_dir(self.work_dir, job_id, 2, 1)
        values: dict[str, Any] = {
            "job_id": job_id,
            "attempt": 2,
            "learner": 1,
            "epoch": 7,
            "node": self.name,
            "image": LEARNER_IMAGE,
            "command": [self.python, "-c", code],
            "env": {},
            "workdir": workdir,
            "folders": [Folder(self.work_dir, workdir)],
            "user": self.user,
            "gpus": [],
            "cpus": 1.0,
            "memory_mb": 512,
        }
        return LearnerSpec(**{**values, **changes})


@pytest.fixture(params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def kind(request: pytest.FixtureRequest) -> str:
    """The runtime under test. Docker's is looked for here, outside the tests' event loop."""
    if request.param == "docker":
        request.getfixturevalue("docker_engine")  # skips (on CI: fails) without an engine
    kind: str = request.param
    return kind


@pytest.fixture
async def node(kind: str, tmp_path: Path) -> AsyncIterator[Node]:
    name = node_name()
    if kind == "process":
        user = (LEARNER_UID, LEARNER_UID) if os.geteuid() == 0 else None
        yield Node(ProcessRuntime(tmp_path), name, tmp_path, sys.executable, user, lambda: [])
        return
    async with aiodocker.Docker() as docker:
        yield Node(
            DockerRuntime(docker),
            name,
            tmp_path,
            "python3",
            (LEARNER_UID, LEARNER_UID),
            lambda: containers_of(name),
        )
    remove_containers_of(name)


async def first_lines(learner: Learner, count: int) -> list[str]:
    async with aclosing(learner.lines()) as lines:
        return [(await anext(lines)).text for _ in range(count)]


async def test_lines_arrive_in_order_with_the_exit_code(node: Node) -> None:
    code = (
        "import sys\n"
        "for i in range(300):\n"
        "    print(f'out {i}')\n"
        "    print(f'err {i}', file=sys.stderr)\n"
        "print('tschüß ✓')\n"
        "print('no newline at the end', end='')\n"
        "raise SystemExit(3)\n"
    )
    learner = await node.runtime.start(node.spec(code))
    lines = [line async for line in learner.lines()]
    assert await learner.wait() == ExitStatus(code=3)
    out = [line.text for line in lines if line.stream == "stdout"]
    err = [line.text for line in lines if line.stream == "stderr"]
    assert out == [f"out {i}" for i in range(300)] + ["tschüß ✓", "no newline at the end"]
    assert err == [f"err {i}" for i in range(300)]
    for stream in ("stdout", "stderr"):
        times = [line.at for line in lines if line.stream == stream]
        assert times == sorted(times)
    await learner.remove()
    assert node.leftovers() == []


async def test_signals_reach_the_learner_in_order(node: Node) -> None:
    learner = await node.runtime.start(node.spec(SIGNALLED))
    async with aclosing(learner.lines()) as lines:
        assert (await anext(lines)).text == "ready"
        learner.signal(signal.SIGUSR1)
        learner.signal(signal.SIGTERM)
        rest = [line.text async for line in lines]
    assert rest == ["checkpoint requested", "terminating"]
    assert await asyncio.wait_for(learner.wait(), 10) == ExitStatus(code=0)
    await learner.remove()


async def test_a_killed_learner_ends_killed(node: Node) -> None:
    learner = await node.runtime.start(node.spec(SIGNALLED))
    assert await first_lines(learner, 1) == ["ready"]
    learner.signal(signal.SIGKILL)
    status = await asyncio.wait_for(learner.wait(), 10)
    assert (status.signal, status.succeeded) == ("SIGKILL", False)
    await learner.remove()


async def test_the_learner_runs_as_its_user_with_its_environment(node: Node) -> None:
    code = (
        "import os\n"
        "print(os.getuid(), os.getgid())\n"
        "for name in ('TRAINYARD_JOB_ID', 'TRAINYARD_ATTEMPT', 'TRAINYARD_LEARNER', 'GREETING'):\n"
        "    print(os.environ[name])\n"
    )
    wanted = node.spec(code, env={"GREETING": "hello"})
    learner = await node.runtime.start(wanted)
    lines = [line.text async for line in learner.lines()]
    assert await learner.wait() == ExitStatus(code=0)
    uid, gid = wanted.user or (os.geteuid(), os.getegid())
    assert lines == [f"{uid} {gid}", str(wanted.job_id), "2", "1", "hello"]
    await learner.remove()


async def test_a_command_that_is_not_there_cannot_start_and_leaves_nothing(node: Node) -> None:
    wanted = node.spec("", command=["no-such-program", "--flag"])
    with pytest.raises(LearnerStartError, match="no-such-program"):
        await node.runtime.start(wanted)
    assert node.leftovers() == []
    assert await node.runtime.find(node.name) == []


async def test_a_learner_that_never_started_is_not_adopted(node: Node) -> None:
    assert await node.runtime.adopt(node.spec("pass"), None) is None


async def test_a_restarted_agent_finds_and_adopts_its_learners(node: Node) -> None:
    code = (
        "import os, time\n"
        "print('one'); print('two', flush=True)\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
        "print('three')\n"
        "raise SystemExit(4)\n"
    )
    wanted = node.spec(code)
    started = await node.runtime.start(wanted)
    assert await first_lines(started, 2) == ["one", "two"]

    # The agent that started it is gone; the next one finds it running, by its node's name.
    [found] = await node.runtime.find(node.name)
    assert (found.job_id, found.attempt, found.learner, found.epoch) == (wanted.job_id, 2, 1, 7)
    assert await node.runtime.find(f"{node.name}-other") == []
    adopted = await node.runtime.adopt(wanted, found)
    assert adopted is not None
    (wanted.workdir / "go").touch()
    assert [line.text async for line in adopted.lines()] == ["one", "two", "three"]
    # A process adopted without its launcher (which leaves the exit status in a file, see
    # test_reconcile.py) is known to have ended, not how.
    assert await adopted.wait() in (ExitStatus(code=4), ExitStatus(code=None))

    # Ended while no agent watched: no longer found running, but adopted with what it wrote.
    assert await node.runtime.find(node.name) == []
    ended = await node.runtime.adopt(wanted, None)
    assert ended is not None
    assert [line.text async for line in ended.lines()] == ["one", "two", "three"]
    await ended.remove()

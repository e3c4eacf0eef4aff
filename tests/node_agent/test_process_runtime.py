"""The process runtime's output files: read as they grow, and read again the same way by an
agent that adopts the learner; and only its own agent's learners found. What every runtime does
is in test_runtime_contract.py."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

from node_agent.learners import learner_dir
from node_agent.process_runtime import LINE_LIMIT, ProcessRuntime, find_learners
from node_agent.runtime import Folder, Learner, LearnerSpec

LEARNER_UID = 200321


def spec(tmp_path: Path, code: str) -> LearnerSpec:
    """A learner of a job of the agent working in `tmp_path`."""
    job_id = uuid4()
    workdir = learner_dir(tmp_path, job_id, 1, 0)
    return LearnerSpec(
        job_id=job_id,
        attempt=1,
        learner=0,
        epoch=1,
        node="n-test",
        image="unused",
        command=[sys.executable, "-c", code],
        env={},
        workdir=workdir,
        folders=[Folder(tmp_path, workdir)],
        # As the agent, when it is not root; else a job's user, as an agent that is root gives.
        user=(LEARNER_UID, LEARNER_UID) if os.geteuid() == 0 else None,
        gpus=[],
        cpus=1,
        memory_mb=4096,
    )


async def collect(learner: Learner) -> list[tuple[str, str]]:
    return [(line.stream, line.text) async for line in learner.lines()]


async def test_long_lines_come_in_pieces_and_an_adopter_reads_the_same_lines(
    tmp_path: Path,
) -> None:
    code = (
        "import sys\n"
        "print('first')\n"
        f"print('x' * {LINE_LIMIT * 2 + 5})\n"
        "print('oops', file=sys.stderr)\n"
        "sys.stdout.write('no newline at the end')\n"
    )
    runtime = ProcessRuntime(tmp_path)
    learner_spec = spec(tmp_path, code)
    started = await runtime.start(learner_spec)
    lines = await collect(started)
    assert (await started.wait()).code == 0
    stdout = [text for stream, text in lines if stream == "stdout"]
    assert stdout[0] == "first"
    assert [len(piece) for piece in stdout[1:4]] == [LINE_LIMIT, LINE_LIMIT, 5]
    assert stdout[4] == "no newline at the end"
    assert [text for stream, text in lines if stream == "stderr"] == ["oops"]
    # An agent that restarts finds no such process any more, and reads what it left.
    adopted = await runtime.adopt(learner_spec, None)
    assert adopted is not None
    assert sorted(await collect(adopted)) == sorted(lines)


async def test_an_agent_finds_only_the_learners_of_its_own_work_directory(
    tmp_path: Path,
) -> None:
    # Two agents of one node name on one machine (two clusters' agents both named after the
    # host, or two test runs): a starting agent kills the learners it finds that its database
    # does not know, so it must never find the other's.
    runtime = ProcessRuntime(tmp_path)
    node = f"n-{uuid4().hex[:8]}"
    mine, theirs = (
        replace(spec(tmp_path / agent, "import time; time.sleep(60)"), node=node)
        for agent in ("mine", "theirs")
    )
    (tmp_path / "mine").mkdir()
    (tmp_path / "theirs").mkdir()
    started = [await runtime.start(learner_spec) for learner_spec in (mine, theirs)]
    try:
        found = find_learners(node, tmp_path / "mine")
        assert [f.job_id for f in found] == [mine.job_id]
    finally:
        for learner in started:
            learner.signal(signal.SIGKILL)
            await learner.wait()

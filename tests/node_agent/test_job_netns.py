"""A job's network namespace on a node (the process runtime's sandboxed learners): made for its
first learner, with loopback up and nothing else; taken with its last; swept by a restarted agent
when no learner of its job runs here, and never another agent's."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from node_agent.job_links import DEFAULT_RANGE, INSIDE, AddressPlan, job_link
from node_agent.job_netns import JobNamespaces
from node_agent.learners import learner_dir
from node_agent.process_runtime import ProcessRuntime
from node_agent.runtime import ExitStatus, Folder, LearnerSpec
from node_agent.sandbox import Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def namespaces(work_dir: Path) -> JobNamespaces:
    made = JobNamespaces.open(work_dir)
    assert isinstance(made, JobNamespaces), made
    return made


def links(path: Path) -> str:
    return subprocess.run(
        ["nsenter", f"--net={path}", "ip", "-o", "link"], check=True, capture_output=True, text=True
    ).stdout


async def test_the_namespace_holds_loopback_alone_and_goes_with_the_job_s_last_learner(
    tmp_path: Path,
) -> None:
    ours = namespaces(tmp_path)
    job = uuid.uuid4()
    first = await ours.acquire(job)
    second = await ours.acquire(job)  # the job's second learner: the same namespace
    assert first.path == second.path
    listed = links(first.path).splitlines()
    assert len(listed) == 1 and ": lo: " in listed[0] and "UP" in listed[0]
    await first.release()
    await first.release()  # once: a learner that ended, then was removed
    assert first.path.exists()
    await second.release()
    assert not first.path.exists()


async def test_a_restarted_agent_sweeps_its_jobs_that_left_and_no_other_agent_s(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    earlier, other = namespaces(tmp_path / "a"), namespaces(tmp_path / "b")
    gone, running = await earlier.acquire(uuid.uuid4()), await earlier.acquire(uuid.uuid4())
    theirs = await other.acquire(uuid.uuid4())
    try:
        # The next agent of the same work directory, which finds `running` still running.
        await namespaces(tmp_path / "a").sweep({running.job_id})
        assert [gone.path.exists(), running.path.exists()] == [False, True]
        assert theirs.path.exists()
    finally:
        await running.release()
        await theirs.release()
    assert not running.path.exists() and not theirs.path.exists()


async def test_a_restarted_agent_keeps_the_link_its_adopted_learners_run_on(tmp_path: Path) -> None:
    # The attempt's learner that an earlier agent started runs on the job's link; another of
    # its learners, started now, must not make the link again (it would cut the first off).
    ours = namespaces(tmp_path)
    job = uuid.uuid4()
    plan = AddressPlan.parse(DEFAULT_RANGE)
    link = job_link(plan, 3, ["n0", "n1"], "n0", {"n1": "192.0.2.9"})
    adopted = ours.adopt(job, link)
    started = await ours.acquire(job, link)  # here the namespace is new: made, not linked
    try:
        assert ": lo: " in links(started.path) and INSIDE not in links(started.path)
    finally:
        await started.release()
        await adopted.release()
    assert not started.path.exists()


async def test_a_learner_gives_its_job_s_namespace_back_as_it_ends(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    runtime = ProcessRuntime(work, Sandbox.open())
    job = uuid.uuid4()
    workdir = learner_dir(work, job, 1, 0)
    spec = LearnerSpec(
        job_id=job,
        attempt=1,
        learner=0,
        epoch=1,
        node="n",
        image="i",
        command=[sys.executable, "-c", "print('in')"],
        env={},
        workdir=workdir,
        gpus=[],
        cpus=1.0,
        memory_mb=256,
        user=(200_790, 200_790),
        folders=[Folder(work, workdir)],
    )
    started = await runtime.start(spec)
    assert await started.wait() == ExitStatus(code=0)
    # Ended, not yet removed (its lines may not be stored yet): its namespace is gone already.
    assert not namespaces(work).path(job).exists()
    await started.remove()

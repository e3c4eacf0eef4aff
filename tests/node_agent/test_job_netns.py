"""A job's network namespace on a node (the process runtime's sandboxed learners): made for its
first learner, with loopback up and nothing else; taken with its last; swept by a restarted agent
when no learner of its job runs here, and never another agent's."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from node_agent.job_netns import JobNamespaces

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
    path = await ours.acquire(job)
    assert await ours.acquire(job) == path  # the job's second learner: the same one
    listed = links(path).splitlines()
    assert len(listed) == 1 and ": lo: " in listed[0] and "UP" in listed[0]
    await ours.release(job)
    assert path.exists()
    await ours.release(job)
    assert not path.exists()


async def test_a_restarted_agent_sweeps_its_jobs_that_left_and_no_other_agent_s(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    earlier, other = namespaces(tmp_path / "a"), namespaces(tmp_path / "b")
    gone, running, elsewhere = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    paths = [await earlier.acquire(gone), await earlier.acquire(running)]
    theirs = await other.acquire(elsewhere)
    try:
        # The next agent of the same work directory, which finds `running` still running.
        await namespaces(tmp_path / "a").sweep({running})
        assert [path.exists() for path in paths] == [False, True]
        assert theirs.exists()
    finally:
        await earlier.release(running)
        await other.release(elsewhere)
    assert not paths[1].exists() and not theirs.exists()

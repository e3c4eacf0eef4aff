"""Opening a file a job wrote by walking folder descriptors from the system's root: nothing the
job planted (a symbolic link, a mount, a hard link, a file of another owner) is followed or
read, also when the job swaps its folders while the walk runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from controlplane.artifacts.beneath import JobFile, names_of, open_job_file
from controlplane.artifacts.errors import UnsafeSource
from tests.controlplane.artifacts.swapping import swapping


def read(file: JobFile) -> bytes:
    fd = open_job_file(file)
    with os.fdopen(fd, "rb") as opened:
        return opened.read()


@pytest.fixture
def job(tmp_path: Path) -> JobFile:
    """A job's checkpoint as the agent lays it out: `<root>/<job>/checkpoints/learner-0/...`."""
    folder = tmp_path / "root" / "job" / "checkpoints" / "learner-0"
    folder.mkdir(parents=True)
    (folder / "step-7.pt").write_bytes(b"weights")
    return JobFile(tmp_path / "root", ("job", "checkpoints"), ("learner-0", "step-7.pt"))


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A folder of the node's the job must never read, with a file of the checkpoint's name."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "step-7.pt").write_bytes(b"the agent's token")
    return outside


def test_a_file_below_the_jobs_folder_is_read(job: JobFile) -> None:
    assert read(job) == b"weights"


def test_a_symbolic_link_at_any_step_is_refused(job: JobFile, secret: Path) -> None:
    learner = job.root / "job" / "checkpoints" / "learner-1"
    learner.symlink_to(secret)
    (job.root / "job" / "checkpoints" / "learner-0" / "link.pt").symlink_to(secret / "step-7.pt")
    (job.root / "other").symlink_to(job.root / "job")
    planted = (
        JobFile(job.root, job.folder, ("learner-1", "step-7.pt")),
        JobFile(job.root, job.folder, ("learner-0", "link.pt")),
        JobFile(job.root, ("other", "checkpoints"), job.relative),
    )
    for file in planted:
        with pytest.raises(UnsafeSource, match="symbolic link"):
            read(file)


def test_names_that_leave_a_folder_are_refused(job: JobFile) -> None:
    for bad in ("../outside/step-7.pt", "/etc/passwd", "", ".", "a/../b", "a\x00b"):
        assert names_of(bad) is None, bad
    assert names_of("learner-0/step-7.pt") == ("learner-0", "step-7.pt")
    with pytest.raises(UnsafeSource, match=r"'\.\.'"):
        read(JobFile(job.root, job.folder, ("..", "checkpoints", "learner-0", "step-7.pt")))


def test_a_hard_link_is_refused(job: JobFile, tmp_path: Path) -> None:
    # Linked into the job's folder, a file of the node's would look like the job's own.
    os.link(job.path, job.path.with_name("linked.pt"))
    with pytest.raises(UnsafeSource, match="hard links"):
        read(job)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_a_file_of_another_owner_is_refused(job: JobFile) -> None:
    folder = job.root / "job" / "checkpoints"
    for path in (folder, folder / "learner-0", job.path):
        os.chown(path, 200_001, 200_001)
    assert read(job) == b"weights"
    os.chown(job.path, 0, 0)  # a file of root's (or the agent's) in the job's folder
    with pytest.raises(UnsafeSource, match="owned by uid 0, not by the job's user 200001"):
        read(job)
    os.chown(job.path, 200_001, 200_001)
    os.chown(folder / "learner-0", 200_002, 200_002)  # another job's folder moved in
    with pytest.raises(UnsafeSource, match="owned by uid 200002"):
        read(job)


async def test_a_folder_swapped_for_a_link_during_the_walk_is_never_followed(
    job: JobFile, secret: Path
) -> None:
    learner = job.root / "job" / "checkpoints" / "learner-0"
    (learner.parent / "swap").symlink_to(secret)
    outcomes: dict[bytes | str, int] = {}
    async with swapping(learner, learner.parent / "swap"):
        for _ in range(1000):
            try:
                got: bytes | str = await asyncio.to_thread(read, job)
            except UnsafeSource:
                got = "refused"
            outcomes[got] = outcomes.get(got, 0) + 1
    assert b"the agent's token" not in outcomes
    # Both sides of the race were met, or the test proved nothing.
    assert outcomes.get(b"weights", 0) > 0 and outcomes.get("refused", 0) > 0, outcomes

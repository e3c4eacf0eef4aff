"""A warm sandbox's cgroup becomes its learner's by moving its processes into a new group, which
works on both kernels' layouts: cgroup v2 refuses to rename a group (seen on a GPU node, where
every warm start fell back to a cold one). Tested on the node's own hierarchies (v1 on this
project's CI machines) and on a cgroup2 hierarchy each test mounts for itself."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.cgroups import (
    BASE,
    CONTROLLERS,
    Cgroup,
    CgroupError,
    Hierarchies,
    Limits,
    find_hierarchies,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root makes cgroups and mounts")


@pytest.fixture
def v2(tmp_path: Path) -> Iterator[Hierarchies]:
    """A cgroup2 hierarchy of its own (no controller need be free for it: moving processes
    and removing groups are what is tested)."""
    mount = tmp_path / "cgroup2"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "cgroup2", "none", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a cgroup2 hierarchy here")
    try:
        (mount / BASE).mkdir(exist_ok=True)
        yield Hierarchies(2, dict.fromkeys(CONTROLLERS, mount))
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _join(group: Cgroup, pid: int) -> None:
    for procs in group.procs:
        procs.write_text(str(pid))


def _warm(v2: Hierarchies, pid: int) -> Cgroup:
    """A warm sandbox's group on `v2`, the process `pid` in it."""
    warm = v2.group(f"warm-{uuid.uuid4().hex}")
    warm.memory.mkdir()
    _join(warm, pid)
    return warm


def _gone(group: Cgroup) -> None:
    """The group removed, once its processes have ended (a test's cleanup)."""
    for folder in dict.fromkeys(group.folders.values()):
        if folder.is_dir():
            folder.rmdir()


def test_cgroup_v2_refuses_to_rename_a_group(v2: Hierarchies) -> None:
    folder = v2.group(f"warm-{uuid.uuid4().hex}").memory
    folder.mkdir()
    try:
        with pytest.raises(PermissionError):
            folder.rename(folder.parent / "learner")
    finally:
        folder.rmdir()


def test_a_group_s_processes_move_to_a_new_group_in_cgroup_v2(
    v2: Hierarchies, sleeper: subprocess.Popen[bytes]
) -> None:
    warm = _warm(v2, sleeper.pid)

    learner = v2.move(warm, f"learner-{uuid.uuid4().hex}")
    try:
        assert learner.pids() == {sleeper.pid}
        assert not warm.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        _gone(learner)


def test_a_move_that_cannot_be_made_leaves_the_processes_where_they_were(
    v2: Hierarchies, sleeper: subprocess.Popen[bytes]
) -> None:
    warm = _warm(v2, sleeper.pid)
    try:
        # Its parent does not exist: the new group cannot be made.
        with pytest.raises(CgroupError, match="cannot move the cgroup"):
            v2.move(warm, "no-such-parent/learner")
        assert warm.pids() == {sleeper.pid}
    finally:
        sleeper.kill()
        sleeper.wait()
        _gone(warm)


def test_a_group_s_processes_move_in_every_hierarchy_of_the_node(
    sleeper: subprocess.Popen[bytes],
) -> None:
    hierarchies = find_hierarchies()
    if isinstance(hierarchies, str):
        pytest.skip(hierarchies)
    limits = Limits(cpus=0.5, memory_mb=300, pids=64)
    warm = hierarchies.create(f"warm-{uuid.uuid4().hex}", limits)
    _join(warm, sleeper.pid)

    learner = hierarchies.move(warm, f"learner-{uuid.uuid4().hex}")
    try:
        hierarchies.limit(learner, limits)
        for procs in learner.procs:
            assert procs.read_text().split() == [str(sleeper.pid)]
        assert not warm.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        _gone(learner)

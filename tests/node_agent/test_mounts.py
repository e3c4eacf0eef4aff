"""The warm sandboxes' mounts (`node_agent.mounts`), made by the kernel's calls on descriptors:
a bind mounts the folder its descriptor names, whatever its path has become since; the walk
that opens it refuses a symlinked folder, and nothing is mounted then; a scratch mount is a
tmpfs shared in a peer group of its own, and its unmount takes what was bound below it."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent import mounts
from node_agent.warm import _walk

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts")

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def mountinfo(point: Path) -> list[str]:
    """The mountinfo lines of the mounts at `point` (its real path, without spaces)."""
    real = os.path.realpath(point)
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if line.split()[4] == real]


def mounted_below(path: Path) -> list[str]:
    real = os.path.realpath(path)
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(real)]


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for point in sorted(mounted_below(tmp_path), key=len):  # a failed test's
        if point in mounted_below(tmp_path):
            mounts.detach(Path(point))


def opened(path: Path) -> int:
    return os.open(path, _DIRECTORY)


def test_a_bind_mounts_the_folder_its_descriptor_names_not_what_its_path_became(
    place: Path,
) -> None:
    source, target = place / "job", place / "point"
    source.mkdir()
    target.mkdir()
    (source / "file").write_text("the job's")
    fd, at = opened(source), opened(target)
    # Swapped after the walk: the path now leads to a link to another folder.
    source.rename(place / "moved")
    (place / "other").mkdir()
    (place / "other" / "file").write_text("another's")
    source.symlink_to(place / "other")
    try:
        mounts.bind(fd, at)
    finally:
        os.close(fd)
        os.close(at)
    try:
        assert (target / "file").read_text() == "the job's"
        assert len(mountinfo(target)) == 1
        assert target.stat().st_ino == (place / "moved").stat().st_ino
    finally:
        mounts.detach(target)
    assert mountinfo(target) == []


def test_a_symlinked_folder_is_refused_on_the_walk_and_nothing_is_mounted(place: Path) -> None:
    root = place / "root"
    (root / "job").mkdir(parents=True)
    (place / "secrets").mkdir()
    (root / "job" / "checkpoints").symlink_to(place / "secrets")
    with pytest.raises(OSError):
        _walk(root, root / "job" / "checkpoints")
    assert mounted_below(place) == []


def test_a_scratch_mount_is_a_tmpfs_in_a_peer_group_of_its_own(place: Path) -> None:
    folder = place / "roots"
    folder.mkdir()
    fd = opened(folder)
    try:
        mounts.scratch(fd)
    finally:
        os.close(fd)
    try:
        [line] = mountinfo(folder)
        fields = line.split()
        assert fields[fields.index("-") + 1] == "tmpfs"
        assert "nosuid" in fields[5] and "nodev" in fields[5]
        [group] = re.findall(r"shared:(\d+)", line)
        others = Path("/proc/self/mountinfo").read_text().splitlines()
        assert [other for other in others if f"shared:{group} " in other + " "] == [line]
        assert (folder.stat().st_mode & 0o7777, folder.stat().st_uid) == (0o755, 0)
    finally:
        mounts.detach(folder)


def test_unmounting_a_scratch_mount_takes_what_was_bound_below_it(place: Path) -> None:
    folder, source = place / "roots", place / "job"
    folder.mkdir()
    source.mkdir()
    (source / "file").write_text("kept")
    fd = opened(folder)
    try:
        mounts.scratch(fd)
    finally:
        os.close(fd)
    (folder / "a" / "b").mkdir(parents=True)
    fd, at = opened(source), opened(folder / "a" / "b")
    try:
        mounts.bind(fd, at)
    finally:
        os.close(fd)
        os.close(at)
    assert (folder / "a" / "b" / "file").read_text() == "kept"
    mounts.detach(folder)
    assert mounted_below(place) == []
    assert list(folder.iterdir()) == []  # the folders made in it went with it
    assert (source / "file").read_text() == "kept"
    with pytest.raises(OSError):
        mounts.detach(folder)  # nothing mounted there any more

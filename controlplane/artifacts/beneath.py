"""Opening a file a job's code wrote, from a root the system owns, by walking folder
descriptors: never by a path a learner could swap while it is checked.

A learner may replace any folder of its own with a symbolic link (to `/proc/self`, to the
agent's secrets, to another job's folder) at any instant, also between a check of the path and
its opening (renameat2 with RENAME_EXCHANGE in a loop wins such races). So nothing here resolves
a path and then opens it: the root (the operator's, trusted, symlinks and all) is opened once,
then each name below it is opened relative to the descriptor of the folder above, with
`O_NOFOLLOW`, and checked by `fstat` on the descriptor itself. That is the walk `openat2`'s
`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV` does in the kernel; done by hand it
also runs where seccomp or an older kernel refuses `openat2`, and it checks owners on the way.

Below the job's own folder (the first level or levels, made by the agent and given to the
job's user), every folder and the file must belong to that folder's owner, and the file must
have no other hard link: a learner cannot pass off a file of root's, the agent's or another
job's, linked into its folder, as its own.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from controlplane.artifacts.errors import UnsafeSource

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted there must not hang; the mode check then refuses it.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class JobFile:
    """A file a job wrote: `root` (the operator's, opened as it is named), the job's own
    folder below it (`folder`, names made by the system) and the file below that
    (`relative`, names the job chose)."""

    root: Path
    folder: tuple[str, ...]
    relative: tuple[str, ...]

    @property
    def path(self) -> Path:
        """For messages only: never opened."""
        return self.root.joinpath(*self.folder, *self.relative)


def names_of(relative: PurePosixPath | str) -> tuple[str, ...] | None:
    """The names of a relative path, or None when one could leave the folder it starts in
    (absolute, `..`) or could not be a name at all (empty, NUL)."""
    path = PurePosixPath(relative)
    if path.is_absolute() or "\x00" in str(relative):
        return None
    names = path.parts
    if not names or any(name in ("", ".", "..") for name in names):
        return None
    return names


def open_job_file(file: JobFile) -> int:
    """A blocking, read-only descriptor of `file`, a regular file found by the walk the module
    describes. UnsafeSource when a step is a symbolic link, not a folder, on another file
    system, of another owner, or the file is not a lone regular file; FileNotFoundError when a
    step is missing."""
    if not file.folder or not file.relative:
        raise UnsafeSource(file.path, "not a file below a job's folder")
    opened: list[int] = []
    try:
        opened.append(os.open(file.root, _FOLDER))
        device = os.fstat(opened[-1]).st_dev
        owner: int | None = None
        for name in file.folder + file.relative[:-1]:
            opened.append(_step(opened[-1], name, _FOLDER, file.path))
            _check(os.fstat(opened[-1]), file.path, device, owner)
            if len(opened) == len(file.folder) + 1:
                owner = os.fstat(opened[-1]).st_uid
        opened.append(_step(opened[-1], file.relative[-1], _FILE, file.path))
        info = os.fstat(opened[-1])
        _check(info, file.path, device, owner)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeSource(file.path, "not a regular file")
        if info.st_nlink != 1:
            raise UnsafeSource(file.path, "a file with other hard links")
        os.set_blocking(opened[-1], True)
        return opened.pop()
    finally:
        for fd in opened:
            os.close(fd)


def _step(fd: int, name: str, flags: int, path: Path) -> int:
    if name in ("", ".", "..") or "/" in name:
        raise UnsafeSource(path, f"a path with the name {name!r} on its way")
    try:
        return os.open(name, flags, dir_fd=fd)
    except OSError as error:
        # O_NOFOLLOW on a symbolic link: ELOOP, or ENOTDIR with O_DIRECTORY, as for a file
        # where a folder should be.
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        planted = os.stat(name, dir_fd=fd, follow_symlinks=False)
        what = "a symbolic link" if stat.S_ISLNK(planted.st_mode) else "not a folder"
        raise UnsafeSource(path, f"reached through {name!r}, {what}") from None


def _check(info: os.stat_result, path: Path, device: int, owner: int | None) -> None:
    if info.st_dev != device:
        raise UnsafeSource(path, "on another file system than its root (a mount on the way)")
    if owner is not None and info.st_uid != owner:
        raise UnsafeSource(path, f"owned by uid {info.st_uid}, not by the job's user {owner}")

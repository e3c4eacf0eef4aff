"""The folders a learner uses, which the agent makes and owns, and the files in them that the
agent reads; never a path the tenant names.

A learner's folders (its working, data and checkpoint directories) lie below the agent's work
and checkpoint directories. The agent makes each level without following symlinks (a learner
that replaced a folder of its job with a symlink to /etc gets an error, not /etc), mode 0700,
owned by the job's user, so that no other job's learner can read them. The agent's own
directories stay traversable (0711) but not listable, and its own files (lock, identity) are
its own.

Files a learner could have replaced (its output and exit-status files) are opened without
following symlinks and only when they are regular files: a symlink to the agent's secrets or a
FIFO that would block the agent is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import stat
from dataclasses import replace
from enum import Enum
from pathlib import Path
from uuid import UUID

from controlplane.agent_port.protocol import FolderRecords
from controlplane.agent_port.vocabulary import root_of, tenant_roots
from node_agent.runtime import LearnerSpec, LearnerStartError, Mount
from runners.config import RESULTS_ROOT

log = logging.getLogger(__name__)

FOLDER_MODE = 0o700
BASE_MODE = 0o711
"""The agent's work and checkpoint directories: learners pass through to their job's folder,
but cannot list the other jobs'."""
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_folder(base: Path, path: Path, user: tuple[int, int] | None) -> None:
    """Make `path` and every level of it below `base` (which must exist), or take them as they
    are, without following symlinks; each level mode 0700 and owned by `user` (None: the
    agent's). OSError when a level is not a directory of its own (a symlink, a file)."""
    fd = os.open(base, _DIRECTORY)
    try:
        for name in path.relative_to(base).parts:
            # Made already for an earlier learner or attempt of the job: checked below.
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, FOLDER_MODE, dir_fd=fd)
            try:
                child = os.open(name, _DIRECTORY, dir_fd=fd)
            except OSError as exc:
                # O_NOFOLLOW on a symlink: ELOOP; a file or a FIFO: ENOTDIR.
                raise OSError(
                    exc.errno,
                    f"{name!r} on the way to {path} is not a directory of the agent's "
                    f"({exc.strerror}); it is left alone",
                ) from None
            os.close(fd)
            fd = child
            if user is not None and os.geteuid() == 0:
                os.fchown(fd, *user)
            os.fchmod(fd, FOLDER_MODE)
    finally:
        os.close(fd)


def adopt_files(path: Path, user: tuple[int, int]) -> None:
    """Give `user` what lies below `path` (made by `make_folder` just before): an earlier job of
    the same search trial, another user, left it there (its checkpoints). Walked without
    following symlinks; only directories and regular files of a learner's are taken, never one
    of the agent's or root's, and never a file with other hard links (a learner may have linked
    a file it does not own into its folder)."""
    if os.geteuid() != 0:
        return
    mine = os.geteuid()
    for _, dirs, files, folder in os.fwalk(path, follow_symlinks=False):
        for name in [*dirs, *files]:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            regular = stat.S_ISREG(info.st_mode) and info.st_nlink == 1
            if (regular or stat.S_ISDIR(info.st_mode)) and info.st_uid not in (0, mine):
                os.chown(name, *user, dir_fd=folder, follow_symlinks=False)


def make_base(path: Path) -> None:
    """One of the agent's own directories (its work or checkpoint directory): made if missing,
    and traversable but not listable by learners when the agent owns it."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid == os.geteuid():
        path.chmod(BASE_MODE)


def unreachable_for_learners(path: Path) -> Path | None:
    """The first existing directory on the way to `path` (itself included) that another user
    cannot pass through (no execute bit for others), if any: learners that run as users of
    their own cannot reach their folders below it. The agent's own directories are made
    traversable as it starts (`make_base`), so an existing one it owns does not count."""
    for directory in [*reversed(path.parents), path]:
        try:
            info = directory.stat()
        except FileNotFoundError:
            return None  # made by the agent, traversable
        if directory.is_relative_to(path) and info.st_uid == os.geteuid():
            continue
        if not info.st_mode & stat.S_IXOTH:
            return directory
    return None


def prepare(spec: LearnerSpec) -> LearnerSpec:
    """Make the learner's folders and check its `file://` locations again, on this node and
    now (a symlink may have changed since submit); the spec with the operator roots it may
    see mounted, and the results root for the launcher. LearnerStartError with the reason
    when it cannot run."""
    try:
        for folder in spec.folders:
            make_folder(folder.base, folder.path, spec.user)
            if folder.adopt and spec.user is not None:
                adopt_files(folder.path, spec.user)
    except OSError as exc:
        raise LearnerStartError(f"cannot prepare its folders: {exc}") from exc
    mounts = list(spec.mounts)
    env = dict(spec.env)
    for shared in spec.shared:
        root = root_of(shared.path, shared.roots, shared.tenant, below=shared.writable)
        if root is None:
            allowed = ", ".join(str(r) for r in tenant_roots(shared.roots, shared.tenant))
            raise LearnerStartError(
                f"{shared.field} {str(shared.path)!r} is not under a root this node allows for "
                f"tenant {shared.tenant!r} ({shared.setting}: {allowed or 'none'}), after "
                "resolving symlinks"
            )
        # The root, not the location: what the learner writes below it stays there, and a
        # symlink it plants there resolves inside the container, never on the node.
        mounts.append(Mount.same(root, writable=shared.writable))
        if shared.writable:
            env[RESULTS_ROOT] = str(root)
    return replace(spec, mounts=mounts, env=env)


def open_regular(path: Path) -> int:
    """A file descriptor of `path` for reading, if it is a regular file and not a symlink
    (OSError otherwise): a learner may have replaced it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return fd


class Disposal(Enum):
    """What becomes of a folder of a job whose retention has ended."""

    REMOVE = "remove"
    HAND_BACK = "hand back"
    """Kept, but given to the agent (mode 0700): a job that has not expired still uses it (a
    later rung of a search trial resumes from it, and takes it when it starts)."""
    LEAVE = "leave"
    """Another job's now (that later rung took it), or not a folder of the agent's making."""


def disposal(info: os.stat_result, uid: int | None, used: bool) -> Disposal:
    """What to do with a folder (as lstat found it) of an expired job that ran as `uid` (None:
    as the agent), `used` by a job that has not expired. Only a directory the job's user owns
    goes (or the agent's, when the job had no user): once removed or handed back, nothing the
    uid owns is reachable, and the uid may go to another job."""
    owner = os.geteuid() if uid is None else uid
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != owner:
        return Disposal.LEAVE
    if not used:
        return Disposal.REMOVE
    return Disposal.LEAVE if uid is None else Disposal.HAND_BACK


def dispose(base: Path, name: str, uid: int | None, used: bool) -> Disposal:
    """Remove or hand back the folder `name` right below `base` (see `disposal`), without
    following symlinks anywhere (`shutil.rmtree` walks by descriptors); gone already is done."""
    fd = os.open(base, _DIRECTORY)
    try:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return Disposal.LEAVE
        todo = disposal(info, uid, used)
        if todo is Disposal.REMOVE:
            shutil.rmtree(name, dir_fd=fd)
        elif todo is Disposal.HAND_BACK:
            folder = os.open(name, _DIRECTORY, dir_fd=fd)
            try:
                os.fchown(folder, os.geteuid(), os.getegid())
                os.fchmod(folder, FOLDER_MODE)
            finally:
                os.close(folder)
        return todo
    finally:
        os.close(fd)


def expired_folders(
    work_dir: Path, checkpoint_root: Path, job_id: UUID, checkpoints: UUID, used: bool
) -> dict[tuple[Path, str], bool]:
    """An expired job's folders on a node, as (base, name below it), and whether a job that has
    not expired still uses each: its own folder in `work_dir`, and the checkpoint folder it
    used (`checkpoints`' in `checkpoint_root`), which are one when the checkpoints are the
    job's own and the two roots are one."""
    folders = {(work_dir, str(job_id)): False}
    shared = (checkpoint_root, str(checkpoints))
    folders[shared] = folders.get(shared, False) or used
    return folders


class JobFolders:
    """The folders this node keeps for jobs: recorded in the database before they are made, and
    removed (or handed back) once their job's retention has ended (the lifecycle manager marks
    them), after which the job's uid goes back to the range."""

    def __init__(
        self, port: FolderRecords, node: str, work_dir: Path, checkpoint_root: Path
    ) -> None:
        self._port = port
        self._node = node
        self._work_dir = work_dir
        self._checkpoint_root = checkpoint_root

    async def record(self, job_id: UUID, uid: int | None, checkpoints: UUID) -> None:
        """Before the job's folders are made here: they are not forgotten, nor its uid given
        to another job, until they are removed."""
        await self._port.record_folders(job_id, self._node, uid, checkpoints)

    async def sweep(self) -> None:
        """Remove (or hand back) the folders of the jobs whose retention has ended. A job's
        that cannot be (a file system error) keeps its record, and its uid, until a later
        sweep; the other jobs' go on."""
        for expired in await self._port.expired_folders(self._node):
            job_id = expired.job_id
            places = expired_folders(
                self._work_dir,
                self._checkpoint_root,
                job_id,
                expired.checkpoints,
                expired.checkpoints_used,
            )
            try:
                for (base, name), used in places.items():
                    # Blocking file system work, off the event loop: folders may be large.
                    done = await asyncio.to_thread(dispose, base, name, expired.uid, used)
                    log.info("job %s: retention over: %s (%s)", job_id, base / name, done.value)
            except OSError as exc:
                log.warning("job %s: its folders could not be removed (%s); retrying", job_id, exc)
                continue
            await self._port.forget_folders(job_id, self._node)

"""Waking the reader of a learner's output files as soon as the learner writes to them, by
inotify: one instance per agent, opened while some file is followed (the kernel allows a user
128 instances), a watch per file.

A learner's reports are lines of its output (its phases, its checkpoints, the metric a trial
ends with); read every POLL_S only, each waited half of it on average, and every job's end
waited for its last one (STORING). The watch is on the file the reader holds open (through
`/proc/self/fd`), never on a path the learner could replace. It is still only a hint: a
follower reads its files again after WATCHED_POLL_S whatever inotify says (a write through a
mapping makes no event), and every POLL_S where inotify cannot be had (its limits reached)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 0.02
"""How long a quiet learner's files wait before they are read again, where no watch tells of
its writes."""
WATCHED_POLL_S = 1.0
"""The same, where a watch tells of its writes."""
IN_MODIFY = 0x00000002
IN_IGNORED = 0x00008000
"""The watch is gone (its file was deleted, or its file system unmounted)."""
_EVENT = struct.Struct("iIII")
"""struct inotify_event before its name: wd, mask, cookie, len."""
_READ_BYTES = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class Follower:
    """One reader's wake-ups: `wait` returns as soon as one of its files is written."""

    def __init__(self, watched: bool) -> None:
        self.watched = watched
        self._written = asyncio.Event()

    def clear(self) -> None:
        """Call before reading the files: a write from then on wakes the next `wait`."""
        self._written.clear()

    def written(self) -> None:
        self._written.set()

    def unwatched(self) -> None:
        self.watched = False
        self._written.set()

    async def wait(self, ended: asyncio.Future[Any]) -> None:
        """Until a file is written (since `clear`), `ended` is done, or a poll's interval has
        passed."""
        woken = asyncio.ensure_future(self._written.wait())
        try:
            timeout = WATCHED_POLL_S if self.watched else POLL_S
            await asyncio.wait({woken, ended}, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            woken.cancel()


class FileWrites:
    """The agent's inotify instance, shared by the followers of every learner's files."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop that reads the instance (the one it was opened in)."""
        self._followers: dict[int, list[Follower]] = {}
        """By watch descriptor (the kernel's one per inode)."""
        self._following = 0

    @contextlib.contextmanager
    def follow(self, files: Sequence[int]) -> Iterator[Follower]:
        """A follower of the open files `files` (descriptors), until the block ends."""
        self._following += 1
        try:
            watches = self._watches(files)
            follower = Follower(watched=watches is not None)
            for wd in watches or ():
                self._followers.setdefault(wd, []).append(follower)
            try:
                yield follower
            finally:
                for wd in watches or ():
                    self._forget(wd, follower)
        finally:
            self._following -= 1
            if self._following == 0:
                self._close()

    def _watches(self, files: Sequence[int]) -> list[int] | None:
        """A watch of each of the open files `files`; None where one cannot be had."""
        watches: list[int] = []
        try:
            if self._fd is None:
                self._fd = _checked(_libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(self._fd, self._drain)
            for file in files:
                path = f"/proc/self/fd/{file}".encode()
                watches.append(_checked(_libc.inotify_add_watch(self._fd, path, IN_MODIFY)))
        except OSError as exc:
            log.warning("cannot watch a learner's output (%s): it is read every %gs", exc, POLL_S)
            for wd in watches:
                self._forget(wd, None)
            return None
        return watches

    def _forget(self, wd: int, follower: Follower | None) -> None:
        followers = self._followers.get(wd, [])
        if follower in followers:
            followers.remove(follower)
        if not followers:
            self._followers.pop(wd, None)
            if self._fd is not None:
                # EINVAL where the kernel dropped the watch already (IN_IGNORED): its numbers
                # are not given again before they wrap around.
                _libc.inotify_rm_watch(self._fd, wd)

    def _close(self) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
            try:
                # In a thread: closing an instance waits for a grace period of the kernel's
                # (fsnotify's SRCU: up to 14 ms on a 2-core node), which a job's end must not.
                self._loop.run_in_executor(None, os.close, self._fd)
            except RuntimeError:
                os.close(self._fd)  # the loop's executor is shut down: nothing waits any more
            self._fd = self._loop = None

    def _drain(self) -> None:
        assert self._fd is not None
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + size
                if mask & IN_IGNORED:
                    for follower in self._followers.pop(wd, []):
                        follower.unwatched()
                else:
                    for follower in self._followers.get(wd, []):
                        follower.written()


def _checked(result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result

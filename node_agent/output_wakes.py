"""Waking a learner's output reader as the learner writes: the kernel's inotify (IN_MODIFY) on
the output files the agent opened, so that a line (a phase's start, a trial's metric) is read
as it is written, not at the reader's next poll (`process_runtime.POLL_S`, which stays as the
fallback: a write inotify does not report, such as through a shared mapping, is read then).

One inotify instance serves all of a runtime's readers while any reads (the kernel allows a
user 128 instances by default, and the agent's user is the node's root, whose services need
theirs), each reader's files watched through the descriptors the agent holds
(/proc/self/fd/N: the file the agent opened, never a path a learner could swap). Where inotify
cannot be had (no instance or watch left), readers poll as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from typing import BinaryIO

log = logging.getLogger(__name__)

IN_MODIFY = 0x00000002
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")
"""struct inotify_event's fixed part: wd, mask, cookie, len (then len bytes of name)."""
_READ = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


class OutputWakes:
    """The inotify instance of one runtime's output readers, open while any reader watches."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._users = 0
        self._written: dict[int, asyncio.Event] = {}
        """Each watch's reader's event, by watch descriptor."""

    @contextlib.contextmanager
    def watching(self, files: Sequence[BinaryIO]) -> Iterator[asyncio.Event | None]:
        """An event set whenever one of `files` is written to (its reader clears it before
        reading); None when inotify cannot watch them (the reader polls)."""
        written = asyncio.Event()
        watches: list[int] = []
        self._users += 1
        try:
            fd = self._instance()
            for file in files:
                watch = _add_watch(fd, file.fileno()) if fd is not None else -1
                if watch < 0:
                    break
                watches.append(watch)
                self._written[watch] = written
            yield written if len(watches) == len(files) else None
        finally:
            for watch in watches:
                self._written.pop(watch, None)
                if self._fd is not None:
                    _libc.inotify_rm_watch(self._fd, watch)
            self._users -= 1
            if self._users == 0:
                self._close()

    def _instance(self) -> int | None:
        if self._fd is None:
            fd = int(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
            if fd < 0:
                log.warning(
                    "no inotify instance (%s): learners' output is polled",
                    os.strerror(ctypes.get_errno()),
                )
                return None
            self._fd = fd
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(fd, self._read)
        return self._fd

    def _read(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, _READ)
        except BlockingIOError:
            return
        offset = 0
        while offset + _EVENT.size <= len(data):
            watch, _, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            # A watch removed meanwhile (its reader done) has no event any more.
            if (written := self._written.get(watch)) is not None:
                written.set()

    def _close(self) -> None:
        if self._fd is None:
            return
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None
        self._loop = None


def _add_watch(fd: int, file: int) -> int:
    """A watch of the open file `file` (by its descriptor's link, which names that very file);
    -1 when the kernel gives none (no watch left)."""
    watch = int(_libc.inotify_add_watch(fd, f"/proc/self/fd/{file}".encode(), IN_MODIFY))
    if watch < 0:
        log.warning(
            "no inotify watch (%s): a learner's output is polled",
            os.strerror(ctypes.get_errno()),
        )
    return watch

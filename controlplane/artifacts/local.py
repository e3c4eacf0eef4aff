"""Local files as byte streams, and adding one a job wrote to a store: how a model is
published straight from a finished job's results or a saved checkpoint, with no upload.

The file is copied, hashed on the way, never hard-linked into the store: a link would share
the file's inode with the job's folder, where a later write in place would change the blob
under its name, and the blob would keep the owner and mode of the job's file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import BinaryIO

from controlplane.artifacts.beneath import JobFile, open_job_file
from controlplane.artifacts.errors import UnsafeSource
from controlplane.artifacts.store import CHUNK_SIZE, ArtifactStore, Blob
from controlplane.artifacts.thread import FileThread
from controlplane.invariants import InvariantBroken


class _Source:
    """A local regular file open for reading; touched only from its FileThread."""

    def __init__(self, path: Path, opener: Callable[[], int]) -> None:
        self._path = path
        self._opener = opener
        self._file: BinaryIO | None = None

    def open(self) -> None:
        self._file = os.fdopen(self._opener(), "rb")

    def read(self, size: int) -> bytes:
        if self._file is None:
            raise InvariantBroken(f"{self._path} is read before it is opened")
        return self._file.read(size)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _open_regular(path: Path) -> int:
    # O_NOFOLLOW and the mode check: a file of the system's own (a blob) that is anything but a
    # regular file was not put there by the system. O_NONBLOCK: a FIFO must not hang the open.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeSource(path, "a symbolic link") from error
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeSource(path, "not a regular file")
    os.set_blocking(fd, True)
    return fd


async def file_chunks(path: Path, chunk_size: int = CHUNK_SIZE) -> AsyncIterator[bytes]:
    """The bytes of the regular file at `path`, read in its own thread, `chunk_size` at a time.

    For the system's own files (its blobs), whose folders no tenant can write: the last
    component is never followed if it is a symbolic link (UnsafeSource), nor read if it is not
    a regular file. A file a job wrote is read by `job_file_chunks`.
    """
    async for chunk in _chunks(_Source(path, partial(_open_regular, path)), chunk_size):
        yield chunk


async def job_file_chunks(file: JobFile, chunk_size: int = CHUNK_SIZE) -> AsyncIterator[bytes]:
    """The bytes of a file a job wrote, opened by `open_job_file`'s descriptor walk."""
    async for chunk in _chunks(_Source(file.path, partial(open_job_file, file)), chunk_size):
        yield chunk


async def _chunks(source: _Source, chunk_size: int) -> AsyncIterator[bytes]:
    thread = FileThread()
    try:
        await thread.run(source.open)
        while chunk := await thread.run(source.read, chunk_size):
            yield chunk
    finally:
        await thread.finish(source.close)


async def add_job_file(
    store: ArtifactStore, file: JobFile, *, max_size: int, expected_sha256: str | None = None
) -> Blob:
    """Store a copy of a file a job wrote (see `open_job_file` for the files refused), as
    `ArtifactStore.write` stores an upload: whole or not at all, deduplicated."""
    chunks = job_file_chunks(file)
    return await store.write(chunks, max_size=max_size, expected_sha256=expected_sha256)

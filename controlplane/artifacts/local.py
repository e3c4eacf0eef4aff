"""Local files as byte streams, and adding one to a store: how a model is published straight
from a finished job's results or a saved checkpoint, with no upload.

The file is copied, hashed on the way, never hard-linked into the store: a link would share
the file's inode with the job's folder, where a later write in place would change the blob
under its name, and the blob would keep the owner and mode of the job's file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from controlplane.artifacts.errors import UnsafeSource
from controlplane.artifacts.store import CHUNK_SIZE, ArtifactStore, Blob
from controlplane.artifacts.thread import FileThread
from controlplane.invariants import InvariantBroken


class _Source:
    """A local regular file open for reading; touched only from its FileThread."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: BinaryIO | None = None

    def open(self) -> None:
        # O_NOFOLLOW: a job may leave a symbolic link in its results, pointing at a file of the
        # node or the control plane that must never become an artifact. O_NONBLOCK: opening a
        # FIFO planted there must not hang; the mode check then refuses it.
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafeSource(self._path, "a symbolic link") from error
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise UnsafeSource(self._path, "not a regular file")
        os.set_blocking(fd, True)
        self._file = os.fdopen(fd, "rb")

    def read(self, size: int) -> bytes:
        if self._file is None:
            raise InvariantBroken(f"{self._path} is read before it is opened")
        return self._file.read(size)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def file_chunks(path: Path, chunk_size: int = CHUNK_SIZE) -> AsyncIterator[bytes]:
    """The bytes of the regular file at `path`, read in its own thread, `chunk_size` at a time.

    The file's last component is never followed if it is a symbolic link (UnsafeSource), nor
    read if it is not a regular file; the folders above it are the caller's to trust.
    """
    source = _Source(path)
    thread = FileThread()
    try:
        await thread.run(source.open)
        while chunk := await thread.run(source.read, chunk_size):
            yield chunk
    finally:
        await thread.finish(source.close)


async def add_local_file(
    store: ArtifactStore, path: Path, *, max_size: int, expected_sha256: str | None = None
) -> Blob:
    """Store a copy of the local file at `path` (see `file_chunks` for the files refused), as
    `ArtifactStore.write` stores an upload: whole or not at all, deduplicated."""
    return await store.write(file_chunks(path), max_size=max_size, expected_sha256=expected_sha256)

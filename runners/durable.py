"""Durable file writes: a file appears under its final name complete or not at all.

The recipe is the classic one: write a temporary file in the same directory, fsync it, rename it
over the final name (atomic within one file system), then fsync the directory so that the rename
itself survives a power loss or kernel crash.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TEMP_MARKER = ".tmp-"


def temp_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place.

    Hidden (leading dot) so that listings of finished files skip it. The suffix is random, not
    the process id: a learner restarted in a fresh container gets the same pid again, and two
    writers must never share one temporary file.
    """
    return path.with_name(f".{path.name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and TEMP_MARKER in path.name


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, *, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write that becomes `path` when the block ends without error: durably,
    or, not `durable`, without the two fsyncs (complete or absent after its writer's crash but
    not the machine's: for a file written again whenever it is needed, since each fsync waits
    for the file system's journal, which the database's commits keep busy).

    If the block raises (or is interrupted), the temporary file is removed and `path` is left
    as it was.
    """
    temp = temp_path(path)
    try:
        with open(temp, "xb") as file:
            yield file
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_bytes_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    with atomic_file(path, durable=durable) as file:
        file.write(data)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below `root` (and `root` itself)."""
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            # A symbolic link has no data of its own; its directory's fsync covers it.
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


class HashingWriter:
    """A write-only binary stream that passes bytes to `file` and hashes them on the way."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._hash.update(data)
        written = self._file.write(data)
        self.size += written
        return written

    def flush(self) -> None:
        self._file.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

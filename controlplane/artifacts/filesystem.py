"""The artifact store on a filesystem: one directory on the control plane's machine, or one
that every node mounts, for a fleet.

Under its root:

    sha256/ab/cd/abcd…   a blob, named by its digest (mode 0400: it never changes)
    tmp/<random>         a blob being written (mode 0600), renamed into place once complete;
                         also where a caller stages bytes it cannot write yet (`staging`)

Directories are 0700: the store belongs to the service's user, who runs the control plane (and
the agents, where a fleet mounts it) and no one else. A digest becomes a path only once it is
checked (64 lowercase hex digits), so no caller's string can name a file outside the root.
A process killed in the middle of a write leaves its temporary file in tmp/, never a blob. A
write cancelled while its blob is being renamed into place may leave that blob: whole and
correct, as if the write had finished.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import BinaryIO

from controlplane.artifacts.digests import Digester, validated, verified
from controlplane.artifacts.errors import ArtifactMissing
from controlplane.artifacts.local import file_chunks
from controlplane.artifacts.store import CHUNK_SIZE, Blob
from controlplane.artifacts.thread import FileThread
from controlplane.settings import Settings
from runners.durable import fsync_dir

DIRECTORY_MODE = 0o700
WRITING_MODE = 0o600
BLOB_MODE = 0o400


def default_root(settings: Settings) -> Path:
    """Where a control plane keeps its artifacts: TRAINYARD_ARTIFACTS_DIR, else under its data
    directory."""
    return settings.artifacts_dir or settings.home / "artifacts"


def _make_dirs(path: Path) -> None:
    """`path` and any missing folders above it, each new one made durable in its parent (so a
    blob renamed into it cannot vanish with its folder after a crash)."""
    if path.is_dir():
        return
    _make_dirs(path.parent)
    # exist_ok: concurrent writes of blobs with a common prefix make the same folders.
    path.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
    fsync_dir(path.parent)


class _PendingBlob:
    """A blob being written to its temporary file; touched only from its FileThread."""

    def __init__(self, path: Path, max_size: int, expected_sha256: str | None) -> None:
        self.path = path
        self.digest = Digester(max_size, expected_sha256)
        self._file: BinaryIO | None = None

    def _opened(self) -> BinaryIO:
        # Created with the first bytes (or when sealed, for an empty blob), in the thread:
        # opening a file may wait on the disk too.
        if self._file is None:
            _make_dirs(self.path.parent)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            self._file = os.fdopen(os.open(self.path, flags, WRITING_MODE), "wb")
        return self._file

    def append(self, chunk: bytes) -> None:
        self.digest.update(chunk)  # first: bytes past the limit are never written
        self._opened().write(chunk)

    def seal(self) -> None:
        """Make the bytes durable and read-only, before the rename makes them a blob."""
        file = self._opened()
        file.flush()
        os.fsync(file.fileno())
        os.fchmod(file.fileno(), BLOB_MODE)
        file.close()

    def discard(self) -> None:
        """Close and remove the temporary file, if it is still there: a failed or cancelled
        write leaves nothing, and a complete one has renamed it already."""
        if self._file is not None:
            self._file.close()
        self.path.unlink(missing_ok=True)


class FileArtifactStore:
    """An `ArtifactStore` in the directory `root` (created when the first blob is written)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def blob_path(self, sha256: str) -> Path:
        """Where the blob `sha256` is kept (InvalidDigest for anything but a digest). Two
        levels of folders keep each one small with millions of blobs."""
        hexdigest = validated(sha256)
        return self.root / "sha256" / hexdigest[:2] / hexdigest[2:4] / hexdigest

    def staging(self) -> Path:
        """tmp/, made if missing: where blobs are written before they are placed, and where a
        caller holds bytes it cannot write yet (an upload whose artifact comes before its
        publication), so that they take room on the store's own disk. Blocking: call it from
        a thread."""
        path = self.root / "tmp"
        _make_dirs(path)
        return path

    async def write(
        self,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int,
        expected_sha256: str | None = None,
    ) -> Blob:
        pending = _PendingBlob(self.root / "tmp" / uuid.uuid4().hex, max_size, expected_sha256)
        thread = FileThread()
        try:
            async for chunk in chunks:
                await thread.run(pending.append, chunk)
            await thread.run(pending.seal)
            blob = pending.digest.finish()
            await thread.run(self._place, pending.path, blob.sha256)
            return blob
        finally:
            await thread.finish(pending.discard)

    def _place(self, temp: Path, sha256: str) -> None:
        final = self.blob_path(sha256)
        if final.exists():
            # The same bytes are stored already (or a concurrent write of them got there
            # first): this write shares that blob, and its temporary file is discarded.
            return
        _make_dirs(final.parent)
        # Atomic: readers see no blob or the whole one. Two writers of the same bytes
        # replacing each other leave the same bytes either way.
        os.replace(temp, final)
        fsync_dir(final.parent)

    async def exists(self, sha256: str) -> bool:
        return await asyncio.to_thread(self.blob_path(sha256).is_file)

    async def size(self, sha256: str) -> int:
        try:
            stat = await asyncio.to_thread(os.stat, self.blob_path(sha256))
        except FileNotFoundError:
            raise ArtifactMissing(sha256) from None
        return stat.st_size

    async def read(
        self, sha256: str, *, chunk_size: int = CHUNK_SIZE
    ) -> AsyncGenerator[bytes, None]:
        path = self.blob_path(sha256)
        # Blobs are never deleted, so one there now is there when it is opened.
        if not await asyncio.to_thread(path.is_file):
            raise ArtifactMissing(sha256)
        async for chunk in verified(sha256, file_chunks(path, chunk_size)):
            yield chunk

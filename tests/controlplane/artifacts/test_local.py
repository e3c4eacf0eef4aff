"""Adding a local file to a store (publishing from a job's results or checkpoint): a copy,
hashed on the way, of a regular file only."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from controlplane.artifacts.errors import ArtifactTooLarge, ChecksumMismatch, UnsafeSource
from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.artifacts.local import add_local_file
from controlplane.artifacts.store import Blob
from tests.controlplane.artifacts.streams import read_all

DATA = os.urandom(3 * 1024 * 1024 + 17)  # more than one chunk
DATA_SHA = hashlib.sha256(DATA).hexdigest()
LIMIT = 1 << 30


@pytest.fixture
def store(tmp_path: Path) -> FileArtifactStore:
    return FileArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "results" / "checkpoint.pt"
    path.parent.mkdir()
    path.write_bytes(DATA)
    return path


async def test_a_local_file_is_copied_in(store: FileArtifactStore, checkpoint: Path) -> None:
    blob = await add_local_file(store, checkpoint, max_size=LIMIT, expected_sha256=DATA_SHA)
    assert blob == Blob(DATA_SHA, len(DATA))
    assert await read_all(store, DATA_SHA, 1 << 20) == DATA
    # A copy, not a link: the job writing its file again, in place, leaves the blob as it was.
    await asyncio.to_thread(checkpoint.write_bytes, b"retrained")
    assert await read_all(store, DATA_SHA, 1 << 20) == DATA


async def test_a_local_file_is_held_to_the_limit_and_the_checksum(
    store: FileArtifactStore, checkpoint: Path
) -> None:
    with pytest.raises(ArtifactTooLarge):
        await add_local_file(store, checkpoint, max_size=len(DATA) - 1)
    with pytest.raises(ChecksumMismatch):
        await add_local_file(store, checkpoint, max_size=LIMIT, expected_sha256="0" * 64)
    assert not await store.exists(DATA_SHA)


async def test_a_symbolic_link_is_never_followed(
    store: FileArtifactStore, checkpoint: Path, tmp_path: Path
) -> None:
    # A job's results holding a link to a file of the machine's, hoping to publish it.
    link = tmp_path / "results" / "model.pt"
    link.symlink_to(checkpoint)
    with pytest.raises(UnsafeSource, match=r"model\.pt is a symbolic link"):
        await add_local_file(store, link, max_size=LIMIT)
    assert not await store.exists(DATA_SHA)


async def test_only_a_regular_file_is_read(store: FileArtifactStore, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    async with asyncio.timeout(10):  # a FIFO without a writer must not hang the add
        for path in (fifo, tmp_path):
            with pytest.raises(UnsafeSource, match="is not a regular file"):
                await add_local_file(store, path, max_size=LIMIT)


async def test_a_missing_file_is_reported_as_such(store: FileArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await add_local_file(store, tmp_path / "nope.pt", max_size=LIMIT)

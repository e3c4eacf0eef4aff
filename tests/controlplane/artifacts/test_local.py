"""Adding a file a job wrote to a store (publishing from a job's results or checkpoint): a copy,
hashed on the way, of a lone regular file found by walking folder descriptors."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from controlplane.artifacts.beneath import JobFile
from controlplane.artifacts.errors import ArtifactTooLarge, ChecksumMismatch, UnsafeSource
from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.artifacts.local import add_job_file
from controlplane.artifacts.store import Blob
from tests.controlplane.artifacts.streams import read_all

DATA = os.urandom(3 * 1024 * 1024 + 17)  # more than one chunk
DATA_SHA = hashlib.sha256(DATA).hexdigest()
LIMIT = 1 << 30


@pytest.fixture
def store(tmp_path: Path) -> FileArtifactStore:
    return FileArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def checkpoint(tmp_path: Path) -> JobFile:
    path = tmp_path / "results" / "checkpoint.pt"
    path.parent.mkdir()
    path.write_bytes(DATA)
    return JobFile(tmp_path, ("results",), ("checkpoint.pt",))


async def test_a_job_file_is_copied_in(store: FileArtifactStore, checkpoint: JobFile) -> None:
    blob = await add_job_file(store, checkpoint, max_size=LIMIT, expected_sha256=DATA_SHA)
    assert blob == Blob(DATA_SHA, len(DATA))
    assert await read_all(store, DATA_SHA, 1 << 20) == DATA
    # A copy, not a link: the job writing its file again, in place, leaves the blob as it was.
    await asyncio.to_thread(checkpoint.path.write_bytes, b"retrained")
    assert await read_all(store, DATA_SHA, 1 << 20) == DATA


async def test_a_job_file_is_held_to_the_limit_and_the_checksum(
    store: FileArtifactStore, checkpoint: JobFile
) -> None:
    with pytest.raises(ArtifactTooLarge):
        await add_job_file(store, checkpoint, max_size=len(DATA) - 1)
    with pytest.raises(ChecksumMismatch):
        await add_job_file(store, checkpoint, max_size=LIMIT, expected_sha256="0" * 64)
    assert not await store.exists(DATA_SHA)


async def test_a_symbolic_link_is_never_followed(
    store: FileArtifactStore, checkpoint: JobFile, tmp_path: Path
) -> None:
    # A job's results holding a link to a file of the machine's, hoping to publish it.
    (tmp_path / "results" / "model.pt").symlink_to(checkpoint.path)
    with pytest.raises(UnsafeSource, match=r"reached through 'model\.pt', a symbolic link"):
        await add_job_file(store, JobFile(tmp_path, ("results",), ("model.pt",)), max_size=LIMIT)
    assert not await store.exists(DATA_SHA)


async def test_only_a_regular_file_is_read(store: FileArtifactStore, tmp_path: Path) -> None:
    folder = tmp_path / "results"
    os.makedirs(folder / "folder")
    os.mkfifo(folder / "fifo")
    async with asyncio.timeout(10):  # a FIFO without a writer must not hang the add
        for name in ("fifo", "folder"):
            with pytest.raises(UnsafeSource, match="is not a regular file"):
                await add_job_file(store, JobFile(tmp_path, ("results",), (name,)), max_size=LIMIT)


async def test_a_missing_file_is_reported_as_such(store: FileArtifactStore, tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    with pytest.raises(FileNotFoundError):
        await add_job_file(store, JobFile(tmp_path, ("results",), ("nope.pt",)), max_size=LIMIT)

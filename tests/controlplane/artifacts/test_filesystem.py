"""What the filesystem store does with files: its layout and modes, one file per blob, damage
found however it is done. Its contract with every store is in test_artifact_store_contract.py."""

from __future__ import annotations

import asyncio
import hashlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.artifacts.errors import ArtifactCorrupted, InvalidDigest
from controlplane.artifacts.filesystem import FileArtifactStore, default_root
from controlplane.settings import Settings
from tests.controlplane.artifacts.streams import chunks_of, read_all

DATA = b"weights " * 5000
DATA_SHA = hashlib.sha256(DATA).hexdigest()
LIMIT = 1 << 20


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def blob_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "sha256").rglob("*") if p.is_file())


async def test_a_blob_is_a_read_only_file_under_two_folders_of_its_digest(
    tmp_path: Path,
) -> None:
    root = tmp_path / "home" / "artifacts"
    store = FileArtifactStore(root)
    assert not await store.exists(DATA_SHA), "a store not yet written to has no folder"
    await store.write(chunks_of(DATA, 4096), max_size=LIMIT)
    path = root / "sha256" / DATA_SHA[:2] / DATA_SHA[2:4] / DATA_SHA
    assert store.blob_path(DATA_SHA) == path
    assert blob_files(root) == [path]
    assert path.read_bytes() == DATA
    assert mode(path) == 0o400
    for folder in (root, root / "tmp", root / "sha256", path.parent.parent, path.parent):
        assert mode(folder) == 0o700, folder


async def test_writing_stored_bytes_again_leaves_the_stored_file_alone(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    await store.write(chunks_of(DATA, 4096), max_size=LIMIT)
    inode = store.blob_path(DATA_SHA).stat().st_ino
    await store.write(chunks_of(DATA, 1000), max_size=LIMIT)
    assert store.blob_path(DATA_SHA).stat().st_ino == inode
    assert blob_files(tmp_path) == [store.blob_path(DATA_SHA)]


async def test_a_blob_cut_short_on_disk_fails_its_read(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    await store.write(chunks_of(DATA, 4096), max_size=LIMIT)
    path = store.blob_path(DATA_SHA)
    path.chmod(0o600)
    path.write_bytes(DATA[:-1])
    with pytest.raises(ArtifactCorrupted):
        await read_all(store, DATA_SHA)


async def test_a_write_cancelled_while_its_thread_stores_a_chunk_keeps_nothing(
    tmp_path: Path,
) -> None:
    store = FileArtifactStore(tmp_path)
    big = DATA * 500  # 20 MB: its storing is under way in the file's thread when cancelled

    async def upload() -> AsyncIterator[bytes]:
        # Runs once the write awaits the storing of this chunk.
        asyncio.get_running_loop().call_soon(write.cancel)
        yield big

    write = asyncio.create_task(store.write(upload(), max_size=len(big)))
    with pytest.raises(asyncio.CancelledError):
        await write
    assert not await store.exists(hashlib.sha256(big).hexdigest())
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("text", ["../" * 8 + "etc/passwd", "/etc/passwd", "..", "ab/cd"])
def test_no_string_but_a_digest_becomes_a_path(tmp_path: Path, text: str) -> None:
    with pytest.raises(InvalidDigest):
        FileArtifactStore(tmp_path).blob_path(text)


def test_the_default_root_is_under_the_data_directory(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, database_url=None)
    assert default_root(settings) == tmp_path / "artifacts"


def test_an_operator_may_put_the_store_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINYARD_ARTIFACTS_DIR", str(tmp_path / "shared"))
    assert default_root(Settings.from_env()) == tmp_path / "shared"

"""Atomic file writes (runners/durable.py): whole or absent, fsynced unless told otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runners.durable import atomic_file, write_bytes_atomically


def test_a_write_not_durable_is_still_whole_or_absent_and_only_a_durable_one_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    fsync = os.fsync

    def counted(fd: int) -> None:
        synced.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    path = tmp_path / "hparams.json"
    write_bytes_atomically(path, b"one", durable=False)
    assert path.read_bytes() == b"one"
    assert synced == []
    with pytest.raises(RuntimeError), atomic_file(path, durable=False) as file:
        file.write(b"half")
        raise RuntimeError("the writer fails halfway")
    assert path.read_bytes() == b"one"
    assert [p.name for p in tmp_path.iterdir()] == ["hparams.json"]  # no temporary file left
    write_bytes_atomically(path, b"two")
    assert path.read_bytes() == b"two"
    assert len(synced) == 2  # the file's and its directory's

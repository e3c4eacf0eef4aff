"""The artifact stores the contract tests run against, each with the means to look under it:
damage a stored blob, list the temporary files that writes left behind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.artifacts.memory import InMemoryArtifactStore
from controlplane.artifacts.store import ArtifactStore


@dataclass(frozen=True)
class Backend:
    store: ArtifactStore
    corrupt: Callable[[str], None]
    """Flip one bit of a stored (non-empty) blob, where it is kept."""
    leftovers: Callable[[], list[str]]
    """The temporary files of writes that are not running."""


def filesystem(root: Path) -> Backend:
    store = FileArtifactStore(root)

    def corrupt(sha256: str) -> None:
        path = store.blob_path(sha256)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.chmod(0o600)  # blobs are read-only; damage does not ask
        path.write_bytes(data)

    def leftovers() -> list[str]:
        return sorted(p.name for p in (root / "tmp").glob("*"))

    return Backend(store, corrupt, leftovers)


def memory() -> Backend:
    blobs: dict[str, bytes] = {}

    def corrupt(sha256: str) -> None:
        data = bytearray(blobs[sha256])
        data[len(data) // 2] ^= 1
        blobs[sha256] = bytes(data)

    # Nothing is kept until a write completes, so there is nowhere for leftovers to be.
    return Backend(InMemoryArtifactStore(blobs), corrupt, list)

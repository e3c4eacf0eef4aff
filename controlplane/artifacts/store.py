"""The artifact store's interface, apart from any storage: what every backend offers and every
backend's contract tests (tests/controlplane/artifacts/test_artifact_store_contract.py) hold
it to.

Blobs are named by the sha256 of their bytes, so two writes of the same bytes share one blob,
and a blob never changes once written. The store never deletes one: which blobs are still
referenced is for the models' events to say.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from typing import Protocol

CHUNK_SIZE = 1024 * 1024
"""Bytes per chunk a blob is read in: large enough that the per-chunk cost (a thread hop, a
hash update) is small beside the copying, small enough to hold many reads at once."""


@dataclass(frozen=True, slots=True)
class Blob:
    """A stored blob: its name (the sha256 of its bytes, lowercase hex) and its size."""

    sha256: str
    size: int


class ArtifactStore(Protocol):
    """Blobs addressed by sha256. Every digest a method takes is checked first (InvalidDigest:
    64 lowercase hex digits, nothing else)."""

    async def write(
        self,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int,
        expected_sha256: str | None = None,
    ) -> Blob:
        """Store the bytes of `chunks` as they come, and return their blob.

        The blob becomes visible whole, once its last byte is stored, or not at all: a write
        over `max_size` bytes (ArtifactTooLarge), whose bytes do not hash to `expected_sha256`
        (ChecksumMismatch), that is cancelled or whose stream fails, keeps nothing. Writing
        bytes that are stored already, also concurrently, returns the one blob they share.
        """
        ...

    async def exists(self, sha256: str) -> bool:
        """Whether a blob with this digest is stored."""
        ...

    async def size(self, sha256: str) -> int:
        """The stored blob's size in bytes (ArtifactMissing if there is none)."""
        ...

    def read(self, sha256: str, *, chunk_size: int = CHUNK_SIZE) -> AsyncGenerator[bytes, None]:
        """The blob's bytes in chunks, hashed on the way: ArtifactCorrupted after the last
        chunk if they do not hash to `sha256` (the blob was damaged where it is kept).

        ArtifactMissing when there is no such blob, raised on the first iteration; a caller
        that must know before it starts (an HTTP response's status) asks `size` first. A
        caller that stops early closes the iterator (contextlib.aclosing) to free its file.
        """
        ...

"""sha256 digests: the one spelling the store accepts, and computing them over a stream."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterable, AsyncIterator

from controlplane.artifacts.errors import (
    ArtifactCorrupted,
    ArtifactTooLarge,
    ChecksumMismatch,
    InvalidDigest,
)
from controlplane.artifacts.store import Blob

_SHA256 = re.compile(r"[0-9a-f]{64}")


def validated(text: str) -> str:
    """`text` if it is a sha256 digest in lowercase hex; else InvalidDigest.

    One spelling only (no uppercase, no prefix), so one blob has one name and one path.
    """
    if not _SHA256.fullmatch(text):
        raise InvalidDigest(text)
    return text


class Digester:
    """The sha256 and size of bytes as they arrive, refusing any past `max_size`, and at the
    end any but the expected ones (when `expected_sha256` is given; checked here, before the
    first byte is taken)."""

    def __init__(self, max_size: int, expected_sha256: str | None = None) -> None:
        if max_size < 0:
            raise ValueError(f"max_size must be at least 0, not {max_size}")
        self._max_size = max_size
        self._expected = None if expected_sha256 is None else validated(expected_sha256)
        self._hash = hashlib.sha256()
        self._size = 0

    def update(self, chunk: bytes) -> None:
        """Count and hash `chunk`; ArtifactTooLarge, before taking it, if it goes past the limit."""
        if self._size + len(chunk) > self._max_size:
            raise ArtifactTooLarge(self._max_size)
        self._hash.update(chunk)
        self._size += len(chunk)

    def finish(self) -> Blob:
        """The blob of the bytes seen; ChecksumMismatch if they are not the expected ones."""
        blob = Blob(self._hash.hexdigest(), self._size)
        if self._expected is not None and blob.sha256 != self._expected:
            raise ChecksumMismatch(self._expected, blob.sha256)
        return blob


async def verified(sha256: str, chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, passed on as they come, then ArtifactCorrupted if they did not hash to `sha256`.

    The check can only come at the end: a blob is read in chunks so as never to hold it whole.
    """
    digest = hashlib.sha256()
    async for chunk in chunks:
        digest.update(chunk)
        yield chunk
    if digest.hexdigest() != sha256:
        raise ArtifactCorrupted(sha256, digest.hexdigest())

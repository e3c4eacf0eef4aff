"""An artifact store in memory: the `ArtifactStore` for pure tests and simulations. It checks
and refuses what the filesystem store does (digests, limits, checksums), as the same contract
tests show."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator

from controlplane.artifacts.digests import Digester, validated, verified
from controlplane.artifacts.errors import ArtifactMissing
from controlplane.artifacts.store import CHUNK_SIZE, Blob


async def _chunked(data: bytes, chunk_size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), chunk_size):
        yield data[start : start + chunk_size]


class InMemoryArtifactStore:
    """Blobs in a dict from digest to bytes.

    `blobs` may be given: the medium the blobs are kept on, which a test can damage to see a
    read catch it. A write keeps its bytes aside and adds them only once complete and checked,
    so an interrupted one leaves nothing.
    """

    def __init__(self, blobs: dict[str, bytes] | None = None) -> None:
        self.blobs = {} if blobs is None else blobs

    async def write(
        self,
        chunks: AsyncIterable[bytes],
        *,
        max_size: int,
        expected_sha256: str | None = None,
    ) -> Blob:
        digest = Digester(max_size, expected_sha256)
        parts = []
        async for chunk in chunks:
            digest.update(chunk)
            parts.append(chunk)
        blob = digest.finish()
        self.blobs.setdefault(blob.sha256, b"".join(parts))
        return blob

    async def exists(self, sha256: str) -> bool:
        return validated(sha256) in self.blobs

    async def size(self, sha256: str) -> int:
        return len(self._blob(sha256))

    async def read(
        self, sha256: str, *, chunk_size: int = CHUNK_SIZE
    ) -> AsyncGenerator[bytes, None]:
        async for chunk in verified(sha256, _chunked(self._blob(sha256), chunk_size)):
            yield chunk

    def _blob(self, sha256: str) -> bytes:
        try:
            return self.blobs[validated(sha256)]
        except KeyError:
            raise ArtifactMissing(sha256) from None

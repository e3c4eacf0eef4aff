"""Byte streams for writes, as an upload's body arrives: in chunks, with awaits between."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from itertools import pairwise

from controlplane.artifacts.store import ArtifactStore


async def chunks_of(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        await asyncio.sleep(0)  # as a network read: other tasks run between chunks
        yield data[start : start + size]


async def split_at(data: bytes, cuts: Sequence[int]) -> AsyncIterator[bytes]:
    """`data` in the chunks that `cuts` (offsets, any order, any repeats) make."""
    bounds = [0, *sorted(cuts), len(data)]
    for start, end in pairwise(bounds):
        await asyncio.sleep(0)
        yield data[start:end]


async def read_all(store: ArtifactStore, sha256: str, chunk_size: int = 4096) -> bytes:
    return b"".join([chunk async for chunk in store.read(sha256, chunk_size=chunk_size)])

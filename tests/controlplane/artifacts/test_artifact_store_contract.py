"""The contract of every artifact store (`ArtifactStore`): the filesystem store and the
in-memory one pass the same tests. What only files have (layout, modes, a blob shared on disk)
is tested in test_filesystem.py."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.artifacts.errors import (
    ArtifactCorrupted,
    ArtifactMissing,
    ArtifactTooLarge,
    ChecksumMismatch,
    InvalidDigest,
)
from controlplane.artifacts.store import Blob
from tests.controlplane.artifacts.backends import Backend, filesystem, memory
from tests.controlplane.artifacts.streams import chunks_of, read_all, split_at

DATA = bytes(range(256)) * 40 + b"tail"
DATA_SHA = hashlib.sha256(DATA).hexdigest()
LIMIT = 1 << 20

NOT_DIGESTS = [
    "",
    "../x",
    "../../etc/passwd",
    DATA_SHA.upper(),
    DATA_SHA[:63],
    DATA_SHA + "0",
    "sha256:" + DATA_SHA,
    DATA_SHA[:62] + "/.",
    DATA_SHA[:63] + "\n",
    "g" * 64,
]


@pytest.fixture(params=["filesystem", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return filesystem(tmp_path / "artifacts") if request.param == "filesystem" else memory()


async def test_a_written_blob_reads_back_named_by_its_sha256(backend: Backend) -> None:
    store = backend.store
    blob = await store.write(chunks_of(DATA, 1000), max_size=LIMIT)
    assert blob == Blob(DATA_SHA, len(DATA))
    assert await store.exists(DATA_SHA)
    assert await store.size(DATA_SHA) == len(DATA)
    assert await read_all(store, DATA_SHA) == DATA
    chunks = [chunk async for chunk in store.read(DATA_SHA, chunk_size=1000)]
    assert [len(c) for c in chunks[:-1]] == [1000] * (len(chunks) - 1)


async def test_an_empty_blob_is_a_blob(backend: Backend) -> None:
    empty = hashlib.sha256(b"").hexdigest()
    assert await backend.store.write(chunks_of(b"", 10), max_size=0) == Blob(empty, 0)
    assert await backend.store.size(empty) == 0
    assert await read_all(backend.store, empty) == b""


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.binary(max_size=5000),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
    read_size=st.integers(min_value=1, max_value=6000),
)
async def test_any_chunking_of_any_bytes_gives_hashlibs_digest(
    backend: Backend, data: bytes, cuts: list[int], read_size: int
) -> None:
    # Cuts past the end, repeated or at 0 make empty chunks: the store takes them too.
    cut = [min(c, len(data)) for c in cuts]
    blob = await backend.store.write(split_at(data, cut), max_size=len(data))
    assert blob == Blob(hashlib.sha256(data).hexdigest(), len(data))
    assert await read_all(backend.store, blob.sha256, read_size) == data


async def test_the_same_bytes_written_twice_share_one_blob(backend: Backend) -> None:
    first = await backend.store.write(chunks_of(DATA, 7), max_size=LIMIT)
    second = await backend.store.write(chunks_of(DATA, 4096), max_size=LIMIT)
    assert first == second
    assert await read_all(backend.store, DATA_SHA) == DATA
    assert backend.leftovers() == []


async def test_concurrent_writes_of_the_same_bytes_are_safe(backend: Backend) -> None:
    blobs = await asyncio.gather(
        *(backend.store.write(chunks_of(DATA, size), max_size=LIMIT) for size in range(97, 105))
    )
    assert set(blobs) == {Blob(DATA_SHA, len(DATA))}
    assert await read_all(backend.store, DATA_SHA) == DATA
    assert backend.leftovers() == []


async def test_a_write_past_its_limit_stops_there_and_keeps_nothing(backend: Backend) -> None:
    taken = []

    async def stream() -> AsyncIterator[bytes]:
        for chunk in (DATA[:1000], DATA[1000:2000], DATA[2000:]):
            taken.append(chunk)
            yield chunk

    with pytest.raises(ArtifactTooLarge, match="larger than 1500 bytes; nothing was kept"):
        await backend.store.write(stream(), max_size=1500)
    assert len(taken) == 2, "the stream is read no further than the limit"
    for sha256 in (DATA_SHA, hashlib.sha256(DATA[:1000]).hexdigest()):
        assert not await backend.store.exists(sha256)
    assert backend.leftovers() == []
    # Exactly at the limit is within it.
    assert await backend.store.write(chunks_of(DATA, 999), max_size=len(DATA))


async def test_bytes_other_than_the_expected_ones_are_not_kept(backend: Backend) -> None:
    other = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ChecksumMismatch) as caught:
        await backend.store.write(chunks_of(DATA, 100), max_size=LIMIT, expected_sha256=other)
    assert (caught.value.expected, caught.value.actual) == (other, DATA_SHA)
    assert f"sha256 is {DATA_SHA}, not the expected {other}" in str(caught.value)
    assert not await backend.store.exists(DATA_SHA)
    assert not await backend.store.exists(other)
    assert backend.leftovers() == []
    blob = await backend.store.write(chunks_of(DATA, 100), max_size=LIMIT, expected_sha256=DATA_SHA)
    assert blob.sha256 == DATA_SHA


async def test_a_write_cancelled_while_its_stream_waits_keeps_nothing(backend: Backend) -> None:
    halfway = asyncio.Event()

    async def stalled_upload() -> AsyncIterator[bytes]:
        yield DATA[:3000]
        halfway.set()
        await asyncio.Event().wait()  # the client stops sending
        yield DATA[3000:]

    write = asyncio.create_task(backend.store.write(stalled_upload(), max_size=LIMIT))
    await halfway.wait()
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert not await backend.store.exists(hashlib.sha256(DATA[:3000]).hexdigest())
    assert not await backend.store.exists(DATA_SHA)
    assert backend.leftovers() == []


async def test_a_write_whose_stream_fails_keeps_nothing(backend: Backend) -> None:
    async def dropped_upload() -> AsyncIterator[bytes]:
        yield DATA[:3000]
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await backend.store.write(dropped_upload(), max_size=LIMIT)
    assert not await backend.store.exists(hashlib.sha256(DATA[:3000]).hexdigest())
    assert backend.leftovers() == []


async def test_a_damaged_blob_fails_its_read_at_the_end(backend: Backend) -> None:
    await backend.store.write(chunks_of(DATA, 1000), max_size=LIMIT)
    backend.corrupt(DATA_SHA)
    read = []
    with pytest.raises(ArtifactCorrupted, match=f"{DATA_SHA} is corrupted") as caught:
        async for chunk in backend.store.read(DATA_SHA, chunk_size=1000):
            read.append(chunk)
    assert len(b"".join(read)) == len(DATA), "found once every byte was read"
    assert caught.value.actual == hashlib.sha256(b"".join(read)).hexdigest() != DATA_SHA


async def test_a_missing_blob_is_missing(backend: Backend) -> None:
    assert not await backend.store.exists(DATA_SHA)
    with pytest.raises(ArtifactMissing, match=f"no artifact with sha256 {DATA_SHA}"):
        await backend.store.size(DATA_SHA)
    with pytest.raises(ArtifactMissing):
        await read_all(backend.store, DATA_SHA)


@pytest.mark.parametrize("text", NOT_DIGESTS)
async def test_only_a_lowercase_hex_sha256_names_a_blob(backend: Backend, text: str) -> None:
    store = backend.store
    await store.write(chunks_of(DATA, 1000), max_size=LIMIT)
    with pytest.raises(InvalidDigest, match="is not a sha256 digest"):
        await store.exists(text)
    with pytest.raises(InvalidDigest):
        await store.size(text)
    with pytest.raises(InvalidDigest):
        await read_all(store, text)
    with pytest.raises(InvalidDigest):
        await store.write(chunks_of(DATA, 1000), max_size=LIMIT, expected_sha256=text)
    assert backend.leftovers() == []

"""The one command path (events/commands.py) on the in-memory store: load typed, decide,
append at the version decided on, and after a conflict load and decide again. No database."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from controlplane.clock import ManualClock
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.commands import CONFLICT_RETRIES, ForeignEvent
from controlplane.events.memory import InMemoryEventStore
from controlplane.events.metadata import Metadata
from controlplane.events.records import Appended, RecordedEvent
from controlplane.events.types import Event
from controlplane.jobs.events import JobCancelled, JobDeploying, JobSubmitted
from controlplane.jobs.lifecycle import (
    JOB,
    Cancel,
    Deploy,
    EnterPhase,
    JobStatus,
    Refused,
    SaveCheckpoint,
    Submit,
)
from controlplane.jobs.manifest import JobManifest
from controlplane.jobs.streams import job_stream
from controlplane.tenants.errors import TenantBusy, TenantExists, UnknownTenant
from controlplane.tenants.events import TenantCreated, TokenIssued
from controlplane.tenants.state import TENANT, Change, Create, TenantState
from controlplane.tenants.streams import tenant_stream

T0 = datetime(2026, 1, 1, tzinfo=UTC)
META = Metadata(actor="user:alice", tenant="acme")
MANIFEST = JobManifest.model_validate({"name": "j", "image": "i", "command": ["x"]})


class SecondWriter:
    """The in-memory store, with another writer's command carried out between this command's
    read and its append, `times` times: the race a conflict comes from."""

    def __init__(
        self, store: InMemoryEventStore, other: Callable[[], Awaitable[object]], times: int = 1
    ) -> None:
        self._store = store
        self._other = other
        self._left = times
        self.appends = 0

    async def read_stream(self, stream_id: str, *, from_version: int = 1) -> list[RecordedEvent]:
        return await self._store.read_stream(stream_id, from_version=from_version)

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended:
        self.appends += 1
        if self._left:
            self._left -= 1
            await self._other()
        return await self._store.append(stream_id, expected_version, events, metadata)


async def submitted(store: InMemoryEventStore, clock: ManualClock) -> UUID:
    job_id = uuid4()
    submit = Submit(job_id=job_id, tenant="acme", manifest=MANIFEST, at=clock.now())
    await JOB.execute(store, job_stream(job_id), submit, META)
    return job_id


class Reads:
    """The in-memory store, counting the events each read of a stream returns."""

    def __init__(self, store: InMemoryEventStore) -> None:
        self._store = store
        self.read: list[tuple[int, int]] = []
        """(from_version, events returned) of each read."""

    async def read_stream(self, stream_id: str, *, from_version: int = 1) -> list[RecordedEvent]:
        events = await self._store.read_stream(stream_id, from_version=from_version)
        self.read.append((from_version, len(events)))
        return events

    async def append(
        self, stream_id: str, expected_version: int, events: Sequence[Event], metadata: Metadata
    ) -> Appended:
        return await self._store.append(stream_id, expected_version, events, metadata)


async def test_a_load_since_an_earlier_one_reads_only_the_news_and_equals_a_whole_load() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    job_id = await submitted(store, clock)
    stream = job_stream(job_id)
    reads = Reads(store)
    earlier = await JOB.load(reads, stream)
    await JOB.execute(store, stream, Cancel("enough", clock.now()), META)
    later = await JOB.load(reads, stream, since=earlier)
    assert later == await JOB.load(store, stream)
    assert later.version == 2 and later.state is not None
    assert later.state.state is JobStatus.CANCELLED
    assert reads.read == [(1, 1), (2, 1)]
    # Nothing new: nothing folded again.
    assert await JOB.load(reads, stream, since=later) == later
    with pytest.raises(ValueError, match="does not go on"):
        await JOB.load(reads, job_stream(uuid4()), since=later)


async def test_a_command_is_decided_on_the_stream_and_appended_at_its_version() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    job_id = await submitted(store, clock)
    clock.advance(timedelta(minutes=1))
    executed = await JOB.execute(store, job_stream(job_id), Cancel("enough", clock.now()), META)
    assert executed.state is not None and executed.state.state is JobStatus.CANCELLED
    assert [type(e) for e in executed.events] == [JobCancelled]
    assert executed.appended.version == 2
    loaded = await JOB.load(store, job_stream(job_id))
    assert loaded.version == 2 and loaded.state == executed.state
    assert [type(e) for e in loaded.events] == [JobSubmitted, JobCancelled]
    assert loaded.events[1].at == T0 + timedelta(minutes=1)  # the clock it was given


async def test_after_a_conflict_the_command_is_decided_again_on_the_new_state() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    job_id = await submitted(store, clock)
    stream = job_stream(job_id)
    deploy = Deploy(nodes=["n1"], gpus=[], epoch=1, at=clock.now())
    racing = SecondWriter(store, lambda: JOB.execute(store, stream, deploy, META))
    # Decided on the QUEUED job first; the deploy got in before its append.
    executed = await JOB.execute(racing, stream, Cancel("enough", clock.now()), META)
    assert racing.appends == 2
    assert executed.appended.version == 3
    history = JOB.typed(await store.read_stream(stream))
    assert [type(e) for e in history] == [JobSubmitted, JobDeploying, JobCancelled]
    assert executed.state is not None and executed.state.state is JobStatus.CANCELLED


async def test_a_command_the_new_state_refuses_writes_nothing() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    job_id = await submitted(store, clock)
    stream = job_stream(job_id)
    cancel = Cancel("by another", clock.now())
    racing = SecondWriter(store, lambda: JOB.execute(store, stream, cancel, META))
    deploy = Deploy(nodes=["n1"], gpus=[], epoch=1, at=clock.now())
    with pytest.raises(Refused, match="finished job cannot change"):
        await JOB.execute(racing, stream, deploy, META)
    assert await store.version(stream) == 2


async def test_a_stream_that_keeps_changing_is_given_up_on() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    job_id = await submitted(store, clock)
    stream = job_stream(job_id)
    for command in (
        Deploy(nodes=["n1"], gpus=[], epoch=1, at=clock.now()),
        EnterPhase(JobStatus.PROCESSING, clock.now()),
    ):
        await JOB.execute(store, stream, command, META)

    async def checkpoint() -> None:
        clock.advance(timedelta(seconds=1))
        step = int((clock.now() - T0).total_seconds())
        saved = SaveCheckpoint(step, f"/ckpt/{step}", 1, 0.1, clock.now())
        await JOB.execute(store, stream, saved, META)

    racing = SecondWriter(store, checkpoint, times=CONFLICT_RETRIES)
    with pytest.raises(Refused, match=f"kept changing; gave up after {CONFLICT_RETRIES} tries"):
        await JOB.execute(racing, stream, Cancel("enough", clock.now()), META)
    loaded = await JOB.load(store, stream)
    assert loaded.version == 3 + CONFLICT_RETRIES  # the other writer's, none of this command's
    assert loaded.state is not None and loaded.state.state is JobStatus.PROCESSING


async def test_a_stream_holding_another_aggregates_event_is_refused_on_load() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    stream = job_stream(uuid4())
    created = TenantCreated(name="acme", weight=1.0, gpu_quota=None, at=clock.now())
    await store.append(stream, 0, [created], META)
    with pytest.raises(ForeignEvent, match=f"stream {stream} holds a TenantCreated at version 1"):
        await JOB.load(store, stream)


async def test_the_tenant_aggregate_on_the_same_path() -> None:
    store, clock = InMemoryEventStore(EVENT_REGISTRY), ManualClock(T0)
    stream = tenant_stream("acme")
    created = TenantCreated(name="acme", weight=2.0, gpu_quota=4, at=clock.now())
    issued = TokenIssued(token_id="tok-1", token_sha256="0" * 64, at=clock.now())

    def issue_another(tenant: TenantState) -> list[TokenIssued]:
        token_id = f"tok-{len(tenant.active_tokens) + 1}"
        return [TokenIssued(token_id=token_id, token_sha256="1" * 64, at=clock.now())]

    with pytest.raises(UnknownTenant, match="no tenant named 'acme'"):
        await TENANT.execute(store, stream, Change("acme", issue_another), META)
    await TENANT.execute(store, stream, Create("acme", [created, issued]), META)
    with pytest.raises(TenantExists, match="tenant 'acme' already exists"):
        await TENANT.execute(store, stream, Create("acme", [created]), META)
    racing = SecondWriter(
        store, lambda: TENANT.execute(store, stream, Change("acme", issue_another), META)
    )
    executed = await TENANT.execute(racing, stream, Change("acme", issue_another), META)
    assert executed.state is not None
    assert executed.state.active_tokens == {"tok-1", "tok-2", "tok-3"}
    assert (executed.state.weight, executed.state.gpu_quota) == (2.0, 4)

    always = SecondWriter(
        store,
        lambda: TENANT.execute(store, stream, Change("acme", issue_another), META),
        times=CONFLICT_RETRIES,
    )
    with pytest.raises(TenantBusy, match="tenant 'acme' kept changing"):
        await TENANT.execute(always, stream, Change("acme", issue_another), META)

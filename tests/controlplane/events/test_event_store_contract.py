"""The contract of every event store (`EventRecorder`): the Postgres store and the in-memory
one pass the same tests. What only a database gives (a caller's transaction, stored data read
back and upcast, the log's index) is tested in test_event_store.py."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider

from controlplane.events.errors import ConcurrencyError, UnknownEventType
from controlplane.events.memory import InMemoryEventStore
from controlplane.events.metadata import Metadata
from controlplane.events.recorder import EventRecorder
from controlplane.events.records import ORIGIN, LogPosition, RecordedEvent
from controlplane.events.store import EventStore
from tests.events import TEST_REGISTRY, Pinged, Unregistered

META = Metadata(actor="user:alice", tenant="acme", correlation_id="req-1")


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), "memory"])
def recorder(request: pytest.FixtureRequest) -> EventRecorder:
    if request.param == "memory":
        return InMemoryEventStore(TEST_REGISTRY)
    store: EventStore = request.getfixturevalue("store")
    return store


async def count(recorder: EventRecorder) -> int:
    """The events of stream job-1, the only one these tests write to. Not the log's: a
    Postgres log holds events back while any older transaction of the server is open, and the
    tests' server is shared."""
    return len(await recorder.read_stream("job-1"))


async def settled(recorder: EventRecorder, last: LogPosition) -> list[RecordedEvent]:
    """The whole log, once it reaches `last` (a shared Postgres server's older transactions
    hold it back a while)."""
    async with asyncio.timeout(20):  # as tests/polling.eventually
        while True:
            log = await recorder.read_log(ORIGIN)
            if log and log[-1].log_position == last:
                return log
            await asyncio.sleep(0.01)


async def test_append_then_read_stream(recorder: EventRecorder) -> None:
    first = await recorder.append("job-1", 0, [Pinged(n=1), Pinged(n=2)], META)
    second = await recorder.append("job-1", 2, [Pinged(n=3)], META)
    assert (first.version, second.version) == (2, 3)
    assert second.positions[0] > first.positions[-1]
    events = await recorder.read_stream("job-1")
    assert [e.stream_version for e in events] == [1, 2, 3]
    assert [e.event for e in events] == [Pinged(n=1), Pinged(n=2), Pinged(n=3)]
    assert all(e.metadata == META for e in events)
    assert [e.event for e in await recorder.read_stream("job-1", from_version=3)] == [Pinged(n=3)]
    page = await recorder.read_stream("job-1", from_version=2, limit=1)
    assert [e.event for e in page] == [Pinged(n=2)]
    assert [e.stream_version for e in await recorder.read_stream("job-1", limit=2)] == [1, 2]
    assert await recorder.read_stream("job-nope") == []
    assert (await recorder.version("job-1"), await recorder.version("job-nope")) == (3, 0)


async def test_stale_expected_version_is_a_conflict_that_writes_nothing(
    recorder: EventRecorder,
) -> None:
    await recorder.append("job-1", 0, [Pinged(n=1)], META)
    for expected in (0, 2, 7):
        with pytest.raises(ConcurrencyError) as caught:
            await recorder.append("job-1", expected, [Pinged(n=9), Pinged(n=10)], META)
        assert "job-1" in str(caught.value)
        assert f"expected version {expected}" in str(caught.value)
        assert "at version 1" in str(caught.value)
        assert caught.value.actual == 1
    assert await count(recorder) == 1


async def test_concurrent_appends_at_one_version_exactly_one_wins(
    recorder: EventRecorder,
) -> None:
    await recorder.append("job-1", 0, [Pinged(n=0)], META)
    results = await asyncio.gather(
        *(recorder.append("job-1", 1, [Pinged(n=i)], META) for i in range(10)),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, ConcurrencyError) for r in results if r not in winners)
    assert await count(recorder) == 2


async def test_bad_input_is_refused_with_stream_and_version_and_writes_nothing(
    recorder: EventRecorder,
) -> None:
    await recorder.append("job-1", 0, [Pinged(n=1)], META)
    with pytest.raises(UnknownEventType, match=r"stream job-1 version 3: .*Unregistered"):
        await recorder.append("job-1", 1, [Pinged(n=2), Unregistered(n=1)], META)
    with pytest.raises(ValueError, match="invalid stream id"):
        await recorder.append("no category", 0, [Pinged(n=1)], META)
    with pytest.raises(ValueError, match="nothing to append"):
        await recorder.append("job-1", 1, [], META)
    with pytest.raises(ValueError, match="expected version must be >= 0"):
        await recorder.append("job-1", -1, [Pinged(n=1)], META)
    assert await count(recorder) == 1


async def test_metadata_carries_the_current_trace_context(recorder: EventRecorder) -> None:
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("submit") as span:
        meta = Metadata.capture("user:alice", tenant="acme", correlation_id="c", causation_id="1")
        await recorder.append("job-1", 0, [Pinged(n=1)], meta)
    [recorded] = await recorder.read_stream("job-1")
    assert recorded.metadata.tenant == "acme"
    assert recorded.metadata.causation_id == "1"
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert recorded.metadata.trace["traceparent"].split("-")[1] == trace_id
    continued = tracer.start_span("claim", context=recorded.metadata.trace_context())
    assert continued.get_span_context().trace_id == span.get_span_context().trace_id


async def test_the_log_is_read_in_append_order_after_a_position(recorder: EventRecorder) -> None:
    assert await recorder.read_log(ORIGIN) == []
    assert await recorder.log_tail() == ORIGIN
    a = await recorder.append("job-a", 0, [Pinged(n=1), Pinged(n=2)], META)
    b = await recorder.append("node-b", 0, [Pinged(n=3)], META)
    c = await recorder.append("job-a", 2, [Pinged(n=4)], META)
    log = await settled(recorder, c.log_position)
    assert [e.event for e in log] == [Pinged(n=1), Pinged(n=2), Pinged(n=3), Pinged(n=4)]
    assert [e.stream_id for e in log] == ["job-a", "job-a", "node-b", "job-a"]
    assert [e.log_position for e in log] == sorted(e.log_position for e in log)
    assert [e.position for e in log] == [*a.positions, *b.positions, *c.positions]
    assert log[-1].log_position == c.log_position == await recorder.log_tail()
    assert [e.event for e in await recorder.read_log(a.log_position)] == [Pinged(n=3), Pinged(n=4)]
    assert [e.event for e in await recorder.read_log(ORIGIN, limit=1)] == [Pinged(n=1)]
    assert [e.event for e in await recorder.read_log(b.log_position)] == [Pinged(n=4)]
    assert await recorder.read_log(c.log_position) == []


async def test_a_read_of_some_categories_says_how_far_it_read(recorder: EventRecorder) -> None:
    await recorder.append("job-a", 0, [Pinged(n=1)], META)
    await recorder.append("node-b", 0, [Pinged(n=2), Pinged(n=3)], META)
    last = await recorder.append("job-a", 1, [Pinged(n=4)], META)
    await settled(recorder, last.log_position)
    jobs = await recorder.read_log_of(["job"], ORIGIN, limit=3)
    assert [e.event for e in jobs.events] == [Pinged(n=1)]
    assert jobs.read == 3
    rest = await recorder.read_log_of(["job"], jobs.end)
    assert [e.event for e in rest.events] == [Pinged(n=4)]
    assert (rest.read, rest.end) == (1, last.log_position)
    assert [e.category for e in rest.events] == ["job"]
    nothing = await recorder.read_log_of(None, rest.end)
    assert (nothing.events, nothing.read, nothing.end) == ([], 0, rest.end)
    everything = await recorder.read_log_of(None, ORIGIN)
    assert [e.event for e in everything.events] == [Pinged(n=i) for i in range(1, 5)]
    assert everything.end == last.log_position
    assert isinstance(everything.end, LogPosition)


async def test_an_append_says_where_and_when_its_events_were_recorded(
    recorder: EventRecorder,
) -> None:
    appended = await recorder.append("job-1", 0, [Pinged(n=1), Pinged(n=2)], META)
    events = await recorder.read_stream("job-1")
    assert tuple(e.position for e in events) == appended.positions
    assert {e.xid for e in events} == {appended.xid}
    assert {e.recorded_at for e in events} == {appended.recorded_at}
    assert appended.recorded_at.tzinfo is not None
    assert events[-1].log_position == appended.log_position
    assert await recorder.read_stream("job-1", from_version=3) == []

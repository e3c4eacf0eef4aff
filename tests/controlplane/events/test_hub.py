"""The SSE hub on a real Postgres: each subscriber gets its stream's new events in order; the
hub decodes only the categories someone follows, so one who subscribes while it reads a batch
is told to re-read the store; stopping ends every open subscription at once."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from controlplane.events.hub import LAGGED, StreamHub, Subscription
from controlplane.events.metadata import Metadata
from controlplane.events.records import LogBatch, RecordedEvent
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from tests.events import TEST_REGISTRY, Pinged, holding_an_xid

META = Metadata(actor="test")


class SubscribingStore(EventStore):
    """An event store whose next read of the log subscribes `stream_id` to the hub just before
    it reads, as an SSE client may at any moment; it keeps how many events that read read."""

    hub: StreamHub
    stream_id = ""
    joined: Subscription | None = None
    read_on_joining = 0

    async def read_log_of(self, *args: Any, **kwargs: Any) -> LogBatch:
        joining = self.stream_id
        if joining:
            self.stream_id = ""
            self.subscribing = self.hub.subscribe(joining)  # kept: collected, it unsubscribes
            self.joined = self.subscribing.__enter__()
        batch = await super().read_log_of(*args, **kwargs)
        if joining:
            self.read_on_joining = batch.read
        return batch


async def items(subscription: Subscription, count: int) -> list[RecordedEvent | object]:
    return [await asyncio.wait_for(subscription.next(), 5) for _ in range(count)]


async def test_a_subscriber_gets_its_stream_s_new_events_in_order(
    store: EventStore, listener: LogListener
) -> None:
    hub = StreamHub(store, listener)
    with hub.subscribe("job-1") as watching:
        running = asyncio.create_task(hub.run())
        await asyncio.sleep(0.2)  # the hub has read where the log ends
        for v in range(3):
            await store.append("node-a", v, [Pinged(n=v)], META)  # nobody follows nodes
            await store.append("job-1", v, [Pinged(n=v)], META)
        got = await items(watching, 3)
        assert [(e.stream_id, e.stream_version) for e in got if isinstance(e, RecordedEvent)] == [
            ("job-1", 1),
            ("job-1", 2),
            ("job-1", 3),
        ]
        hub.stop()
        assert await items(watching, 1) == [None]  # the stream ends
        await asyncio.wait_for(running, 5)


async def test_one_who_subscribes_while_a_batch_is_read_is_told_to_re_read(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener
) -> None:
    subscribing = SubscribingStore(pool, TEST_REGISTRY)
    hub = StreamHub(subscribing, listener)
    subscribing.hub = hub
    with hub.subscribe("node-a") as nodes:
        running = asyncio.create_task(hub.run())
        await asyncio.sleep(0.2)
        subscribing.stream_id = "job-1"  # joins as the next read starts: not decoded in it
        await store.append("job-1", 0, [Pinged(n=0)], META)
        await store.append("node-a", 0, [Pinged(n=0)], META)
        got = await items(nodes, 1)
        assert [(e.stream_id, e.stream_version) for e in got if isinstance(e, RecordedEvent)] == [
            ("node-a", 1)
        ]
        joined = subscribing.joined
        assert joined is not None
        (first,) = await items(joined, 1)
        if subscribing.read_on_joining:
            assert first is LAGGED  # it re-reads its stream from the store
        else:  # that read came before the event was readable: the next decoded it
            assert isinstance(first, RecordedEvent) and first.stream_version == 1
        await store.append("job-1", 1, [Pinged(n=1)], META)
        (later,) = await items(joined, 1)
        assert isinstance(later, RecordedEvent) and later.stream_version == 2
        hub.stop()
        await asyncio.wait_for(running, 5)


async def test_news_held_back_by_a_transaction_that_notifies_no_one_reaches_a_subscriber(
    pool: asyncpg.Pool, store: EventStore, listener: LogListener
) -> None:
    hub = StreamHub(store, listener)
    with hub.subscribe("job-1") as watching:
        running = asyncio.create_task(hub.run())
        await asyncio.sleep(0.2)  # the hub has read where the log ends
        # The append's NOTIFY wakes the hub while the event is held back, and the end of what
        # holds it wakes no one.
        async with holding_an_xid(pool):
            await store.append("job-1", 0, [Pinged(n=1)], META)
            await asyncio.sleep(0.2)
        [got] = await items(watching, 1)  # within 5 s, well before the listener's 60 s poll
        assert isinstance(got, RecordedEvent) and got.stream_version == 1
        hub.stop()
        await asyncio.wait_for(running, 5)

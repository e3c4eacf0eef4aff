"""A batch's items run on a replica in calls of at most `max_batch_size` items, and the batches
it is recorded as: shared by the queue's feed (node_agent/serving.py) and the direct path's
(node_agent/serving_channel.py), so that both batch and record alike."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from controlplane.agent_port.vocabulary import BatchCall
from node_agent.replica_client import ReplicaClient, ReplicaError


@dataclass(frozen=True, slots=True)
class Ran:
    """What a replica made of a batch's items: all their outputs, or the error that failed
    them; and its calls."""

    outputs: list[Any]
    error: str | None
    calls: list[BatchCall]
    inference_ms: float
    """The model's own time, the calls made summed."""


async def call_in_parts(
    client: ReplicaClient, items: list[Any], most: int, text: str | None = None
) -> Ran:
    """Run `items` on the replica in calls of at most `most` items (a task larger than a batch
    is run in several); the first call that fails fails them all, and the calls after it are
    never made. `text`, the items' JSON list where the caller has it, is sent as it is when
    they make one call. ReplicaGone when the replica died."""
    outputs: list[Any] = []
    calls: list[BatchCall] = []
    inference_ms = 0.0
    for start in range(0, len(items), most):
        part = items[start : start + most]
        called = time.monotonic()
        try:
            if text is not None and len(items) <= most:
                answered, took = await client.predict_text(text, len(items))
            else:
                answered, took = await client.predict(part)
        except ReplicaError as exc:
            calls.append(BatchCall(len(part), ms_since(called), None))
            return Ran([], str(exc), calls, inference_ms)
        calls.append(BatchCall(len(part), ms_since(called), took))
        outputs.extend(answered)
        inference_ms += took
    return Ran(outputs, None, calls, inference_ms)


def recorded_calls(items: int, most: int, calls: list[BatchCall]) -> tuple[BatchCall, ...]:
    """The batches a batch of `items` is recorded as: () for one call (its own figures); else
    each call of at most `most` items, those never made (the model failed to load, or an
    earlier call failed, failing them all) as calls that took no time, so that every item is
    in a recorded batch and none is larger than `most`."""
    if items <= most:
        return ()
    sizes = [min(most, items - start) for start in range(0, items, most)]
    return (*calls, *(BatchCall(size, 0.0, None) for size in sizes[len(calls) :]))


def ms_since(instant: float) -> float:
    return (time.monotonic() - instant) * 1000

"""Streaming predictions: a model whose entry point is a generator function (runners/servable.py)
sends each output to the client as it yields it, over the direct path (direct.py), never the
queue.

A streaming request carries exactly one item; it is not batched with other requests (its
replica runs it alone, from its first output to its last) and not memoized (each request runs
the model). It needs a replica offered on a channel: without one (none started yet, a
deployment scaled to zero, agents with `--serving-listen off`, a channel that fails before the
stream began) it is refused with `NoChannel` (503, retry) and runs nowhere, as it is while
each of its replicas runs one of this control plane's streams (a replica runs one at a time:
another would wait at its agent, on a connection every tenant's streams share); a model that
does not stream is refused too (409). Once it has begun, whatever ends it is its last event: `done`,
or `error` (the model raised, an output that is not storable JSON, its replica died, nothing
came within the deployment's `task_timeout_s`, more than MAX_STREAM_BYTES of outputs, the
control plane shutting down: `stop`). Every stream that ends so is counted as the direct path's
requests are (counting.py): a `serving_tasks` row, `succeeded` with its outputs (one item's:
the list of all it yielded, as a plain request to the model gets) or `failed` with its error, its
step's times and its number of chunks; no `serving_batches` row, since it was no batch. A
stream whose client went away is no task, as a plain direct request that went away is none;
its generator is closed at its next `yield`. Nor is one whose client stays but takes nothing
for the deployment's `task_timeout_s` (its connection is dropped): it would hold its replica,
and the outputs the agent keeps for it, for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.deployments.application import ServingApplication
from controlplane.deployments.counting import CountedTask, Counting
from controlplane.deployments.direct import (
    ChannelFailed,
    DirectPath,
    NotStreaming,
    Route,
    StreamsBusy,
    Upstream,
)
from controlplane.deployments.inputs import check_items
from controlplane.instruments import SERVING_LATENCY, SERVING_REQUESTS
from controlplane.jobs.manifest import check_storable
from controlplane.refusals import Refusal, Refused
from runners.frames import MAX_FRAME, storable_text

log = logging.getLogger(__name__)

MAX_STREAM_BYTES = MAX_FRAME
"""The most a stream's outputs may hold in all (their JSON), as a plain request's answer may:
its task keeps them all."""
SHUTTING_DOWN = "the control plane is shutting down: the stream was cut short; retry"


class StreamRequest(BaseModel):
    """POST .../predict/stream: the one item whose outputs are streamed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    inputs: list[Any] = Field(
        min_length=1,
        max_length=1,
        description="exactly one item: a streaming entry point is called with one item, not a "
        "batch",
    )


class NoChannel(Exception):
    """No replica can take the stream now (503: retry)."""


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """What the client is sent: an `output` (its JSON text), then `done` or `error` (an
    object)."""

    kind: Literal["output", "done", "error"]
    data: str


class PredictionStreams:
    """The streams this control plane serves: `open` one per request, `stop` them all when it
    shuts down."""

    def __init__(self, serving: ServingApplication, direct: DirectPath, counting: Counting) -> None:
        self._serving = serving
        self._direct = direct
        self.counting = counting
        self._open: set[PredictionStream] = set()
        self._stopping = False

    async def open(self, tenant: str, name: str, request: StreamRequest) -> PredictionStream:
        """A stream of the deployment's model on the request's item, begun (its replica has
        it); `aclose` it once done. Refusal (no deployment; an item its model version does
        not take; the model does not stream), NoChannel."""
        submitted = datetime.now(UTC)
        arrived = time.perf_counter()
        route = await self._direct.route(tenant, name)
        if route is None:
            raise Refusal(Refused.NOT_FOUND, f"no deployment {name}")
        check_items(await self._serving.declared_input_of(route.model), request.inputs, "inputs")
        try:
            check_storable(request.inputs)
            data = json.dumps(request.inputs, allow_nan=False)
        except ValueError as exc:  # NaN, infinity, NUL or a lone surrogate: as predict says
            raise Refusal(Refused.INVALID, f"inputs: {exc}", field="inputs") from exc
        if self._stopping:
            raise NoChannel(SHUTTING_DOWN)
        opened = contextlib.AsyncExitStack()
        try:
            # The one item's JSON: the list's, less its brackets.
            upstream = await opened.enter_async_context(
                self._direct.stream(tenant, name, route, data[1:-1])
            )
        except ChannelFailed as exc:
            log.info("stream of %s.%s: %s", tenant, name, exc)
            self._direct.forget(tenant, name)
            raise NoChannel(
                f"no replica of deployment {name} can take a stream now (a stream needs a "
                "replica offered on its agent's serving channel: none started yet, scaled to "
                "zero, or agents with --serving-listen off); retry, or predict without "
                "streaming"
            ) from exc
        except StreamsBusy as exc:
            raise NoChannel(f"{exc}; retry once one ends") from exc
        except NotStreaming as exc:
            raise Refusal(
                Refused.CONFLICT,
                f"{exc}; predict without streaming (POST /v1/deployments/{name}/predict)",
            ) from exc
        stream = PredictionStream(
            self, tenant, name, route, upstream, opened, data, submitted, arrived
        )
        self._open.add(stream)
        return stream

    def stop(self) -> None:
        """The control plane is shutting down: every open stream ends now (`error`), and no
        new one opens."""
        self._stopping = True
        for stream in list(self._open):
            stream.cut(SHUTTING_DOWN)

    def _closed(self, stream: PredictionStream) -> None:
        self._open.discard(stream)


class PredictionStream:
    """One open stream: its `events`, then `aclose`."""

    def __init__(
        self,
        streams: PredictionStreams,
        tenant: str,
        name: str,
        route: Route,
        upstream: Upstream,
        opened: contextlib.AsyncExitStack,
        data: str,
        submitted: datetime,
        arrived: float,
    ) -> None:
        self._streams = streams
        self._tenant = tenant
        self._name = name
        self._route = route
        self._upstream = upstream
        self._opened = opened
        self._data = data
        self._submitted = submitted
        self._arrived = arrived
        self._cut: str | None = None
        self._reading: asyncio.Future[dict[str, Any]] | None = None

    @property
    def progress_s(self) -> float:
        """How long its client may take nothing before the stream ends: the deployment's task
        timeout, as for the model's own silence."""
        return self._route.stream_idle_s

    def cut(self, why: str) -> None:
        """End the stream now, with `why` as its error."""
        self._cut = why
        if self._reading is not None:
            self._reading.cancel()

    async def aclose(self) -> None:
        """Close the stream to the agent (which, cut short, stops the replica's generator)."""
        if self._reading is not None:
            self._reading.cancel()
        self._streams._closed(self)
        await self._opened.aclose()

    async def events(self, heartbeat_s: float) -> AsyncGenerator[StreamEvent | None]:
        """Each output as it comes, then `done` or `error`; None after each `heartbeat_s`
        without any. The stream is counted just before its last event is given (not at all
        when the reader stops before)."""
        outputs: list[str] = []
        size = 0
        first_ms: float | None = None
        end: dict[str, Any] = {}
        error: str | None = None
        while True:
            try:
                message = await self._next(heartbeat_s)
            except ChannelFailed as exc:
                timed_out = isinstance(exc.__cause__, TimeoutError)
                error = (
                    f"no output within the deployment's task timeout of "
                    f"{self._route.stream_idle_s:g} s"
                    if timed_out
                    else f"the stream broke off: {exc}"
                )
                break
            if message is None:
                if self._cut is not None:
                    error = self._cut
                    break
                yield None
                continue
            op = message.get("op")
            if op == "chunk":
                try:
                    text = json.dumps(message.get("output"), ensure_ascii=False, allow_nan=False)
                except (ValueError, RecursionError) as exc:  # the agent checks; a bound here
                    error = f"an output cannot be sent: {exc!r}"
                    break
                size += len(text)
                if size > MAX_STREAM_BYTES:
                    error = (
                        f"the outputs passed {MAX_STREAM_BYTES} bytes of JSON, the most a task "
                        f"keeps; the stream was stopped after {len(outputs)} outputs"
                    )
                    break
                if first_ms is None:
                    first_ms = (time.perf_counter() - self._arrived) * 1000
                outputs.append(text)
                yield StreamEvent("output", text)
                continue
            end = message
            if op != "end":
                error = str(message.get("error")) if op == "error" else f"out of form: {op!r}"
            break
        task_id = self._count(outputs, end, error, first_ms)
        figures = {"task_id": str(task_id), "chunks": len(outputs)}
        if error is not None:
            yield StreamEvent("error", json.dumps({**figures, "error": error}))
            return
        times = {
            "request_ms": (time.perf_counter() - self._arrived) * 1000,
            "first_output_ms": first_ms,
            "invocation_ms": end.get("invocation_ms"),
            "inference_ms": end.get("inference_ms"),
        }
        yield StreamEvent("done", json.dumps({**figures, "times": times}))

    async def _next(self, heartbeat_s: float) -> dict[str, Any] | None:
        """The agent's next message; None after `heartbeat_s` without one, or once cut (the
        read goes on across heartbeats: a frame is never read in part)."""
        if self._cut is not None:
            return None
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._upstream.next())
        reading = self._reading
        await asyncio.wait((reading,), timeout=heartbeat_s)
        if not reading.done() or reading.cancelled():
            return None
        self._reading = None
        return reading.result()

    def _count(
        self,
        outputs: list[str],
        end: dict[str, Any],
        error: str | None,
        first_ms: float | None,
    ) -> uuid.UUID:
        """The stream counted, as the direct path counts its answers: its task's id."""
        finished = datetime.now(UTC)
        replica = self._upstream.replica
        invocation_ms = end.get("invocation_ms")
        inference_ms = end.get("inference_ms")
        step = {
            "deployment": self._name,
            "replica": str(replica),
            "batch": None,
            "chunks": len(outputs),
            "first_output_ms": first_ms,
            # Where the agent did not say (the stream broke off), as long as it lasted here.
            "invocation_ms": invocation_ms
            if _is_number(invocation_ms)
            else (time.perf_counter() - self._arrived) * 1000,
            "inference_ms": inference_ms if _is_number(inference_ms) else None,
        }
        task = CountedTask(
            task_id=uuid.uuid4(),
            tenant=self._tenant,
            deployment=self._name,
            items=1,
            input=self._data,
            state="failed" if error is not None else "succeeded",
            # One item's output: the list of all it yielded, as a plain request's.
            output=None if error is not None else f"[[{','.join(outputs)}]]",
            # The agent's text, which it cleans; cleaned again, since a row refused would drop
            # the task the client was told about.
            error=None if error is None else storable_text(error),
            memo="off",
            memo_key=None,
            replica=replica,
            tries=1,
            submitted_at=self._submitted,
            finished_at=finished,
            step_times=json.dumps([step]),
        )
        self._streams.counting.record(task)
        labels = {"tenant": self._tenant, "deployment": self._name}
        SERVING_REQUESTS.add(1, {**labels, "memo": "off"})
        SERVING_LATENCY.record(time.perf_counter() - self._arrived, labels)
        return task.task_id


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

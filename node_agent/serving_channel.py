"""The agent's serving channel: the control plane's direct path to this node's replicas.

A synchronous prediction (controlplane/deployments/direct.py) is sent by the control plane to
the agent of one of its deployment's replicas, over HTTP (the items' JSON list the body, the
tenant and deployment in the query), with the bearer token this agent made when it started; the
agent records the token with each replica it offers (`serving_channels`, which only the control
plane and this node's own agent can read), so a tenant never holds it, and a replica is never
reached but through its agent. Each replica's direct requests are batched so that none waits
for company on an idle replica: one that comes when the replica has no call in flight runs at
once, with whatever else is waiting (recorded 'idle'); those that come while a call runs wait
for it and form the next batch, which leaves when full ('full') or once its oldest has waited
`max_wait_ms` ('timeout'; at the call's end when that passed during the call, as it does with
0). A batch holds at most `max_batch_size` items; a request larger than that runs alone, in
calls of at most `max_batch_size`. Each request is answered with its share of the outputs and
its batch's figures. The agent records nothing of it: the control plane counts the request and
its batch once it has answered, off the request's path.

A request whose sender closes its connection (the control plane does when its own client went
away) is dropped while it still waits for its batch, and never reaches the replica; once its
batch's call runs, the call finishes and its share of the answer is dropped.

A request the channel cannot answer (no such replica here, the replica died meanwhile) is
refused with a status the control plane takes as "use the queue": the request is then a row of
`serving_tasks`, like an asynchronous one, and loses nothing.

A streaming request (`STREAM_PATH`, one item's JSON the body, for a replica whose entry point is
a generator function: refused 409 for another) is never batched: it waits its turn among the
replica's direct requests and runs alone, holding the replica until its generator ends. Its
answer is a body of frames (`runners.frames`), one message each, written as the replica yields:
`{"op":"chunk","output":...}` for each output, then `{"op":"end",...}` or `{"op":"error",
"error":...}` with the stream's figures (`chunks`, `invocation_ms`, `inference_ms`). The agent
holds at most STREAM_WINDOW outputs its reader has not taken (and STREAM_WINDOW_BYTES of them
but one), and the replica makes the next only once the agent has taken one, so a slow reader
slows the model; one that takes nothing for the deployment's task timeout ends the stream, as
do outputs past MAX_STREAM_BYTES in all (with an error); and one that went away (its
connection closed: looked at every 50 ms, as for a plain request) stops it at its next `yield`:
the generator is closed, its `finally` runs, and the replica serves the next request. An output
Postgres could not store (a NUL, an unpaired surrogate) ends the stream with an error, as it
fails a plain task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

from aiohttp import web

from controlplane.agent_port.gone_clients import CLIENT_GONE, unless_gone
from controlplane.agent_port.vocabulary import BatchCall, ServableSpec
from node_agent.inference import stored
from node_agent.replica_calls import Ran, call_in_parts, ms_since, recorded_calls
from node_agent.replica_client import ReplicaClient, ReplicaError, ReplicaGone
from runners.frames import (
    HEADER_SIZE,
    MAX_FRAME,
    THREAD_DECODE_BYTES,
    FrameError,
    encode_frame,
    message_frame,
)

log = logging.getLogger(__name__)

PATH = "/v1/replicas/{replica}/predict"
STREAM_PATH = "/v1/replicas/{replica}/stream"
STREAM_WINDOW = 16
"""The most outputs of a stream the agent holds for a reader that has not taken them yet."""
STREAM_WINDOW_BYTES = 4 * 1024 * 1024
"""The most bytes of outputs held so (one output always, however large: up to MAX_FRAME)."""
MAX_STREAM_BYTES = MAX_FRAME
"""The most a stream's outputs may hold in all, as the control plane counts them too: its task
keeps them all. Past it, the generator is stopped and the stream ends with an error."""
_CHUNK_PREFIX = b'{"op":"chunk","output":'
FRAMES = "application/octet-stream"
"""A stream's body: frames, one message each."""
MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""The largest request the channel reads (the control plane checked it against its own)."""
TOKEN_BYTES = 32
DEFAULT_LISTEN = "127.0.0.1:0"
"""Loopback, a port the system picks: the control plane of `trainyard up` reaches it."""
SERVING_OFF = "off"
"""`--serving-listen off`: no channel; every prediction for this node's replicas queues."""


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) as the host and port to listen on; ValueError."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port)


def advertised(host: str, port: int) -> str:
    """The address the control plane is given: the listening host, or this machine's name when
    it listens on every interface (no address of those is the one the control plane reaches)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and ip.is_unspecified:
        host = socket.getfqdn()
    elif ip is not None and ip.version == 6:
        host = f"[{host}]"
    return f"http://{host}:{port}"


@dataclass(eq=False, slots=True)
class _Request:
    items: list[Any]
    text: str
    """The items' JSON text (a list), as the control plane sent it."""
    arrived: float
    answer: asyncio.Future[dict[str, Any]]


class _Stream:
    """A streaming request: its item, and the frames its replica's outputs make, held for its
    reader (at most STREAM_WINDOW outputs ahead of it)."""

    def __init__(self, item: Any) -> None:
        self.item = item
        self.arrived = time.monotonic()
        self.left = False
        """Its reader went away: the stream stops at its next output."""
        self._frames: deque[tuple[bytes, bool]] = deque()
        """Each frame, and whether it is the last."""
        self._held = 0
        """The bytes of the frames held."""
        self._ready = asyncio.Event()
        self._room = asyncio.Event()

    async def offer(self, frame: bytes) -> bool:
        """Hold an output's `frame` for the reader, once it has room; False when the reader
        went away."""
        while (
            self._frames
            and (len(self._frames) >= STREAM_WINDOW or self._held >= STREAM_WINDOW_BYTES)
            and not self.left
        ):
            self._room.clear()
            await self._room.wait()
        if self.left:
            return False
        self._frames.append((frame, False))
        self._held += len(frame)
        self._ready.set()
        return True

    def finish(self, message: dict[str, Any]) -> None:
        """The stream's last message: its end or its error, with its figures."""
        self._frames.append((message_frame(message), True))
        self._ready.set()

    async def next(self) -> tuple[bytes, bool]:
        """The next frame, and whether it is the last."""
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        self._room.set()
        frame, last = self._frames.popleft()
        self._held -= len(frame)
        return frame, last

    def leave(self) -> None:
        self.left = True
        self._room.set()


def chunk_frame(output: Any) -> tuple[bytes | None, str | None]:
    """The frame that carries `output` to the reader, or why it cannot be kept (`stored`):
    its JSON is made once, both to check it and to send it."""
    text, why = stored([output])
    if text is None:
        return None, why
    # The one output's JSON: the list's, less its brackets.
    return encode_frame(_CHUNK_PREFIX + text[1:-1].encode() + b"}"), None


class DirectFeed:
    """One replica's direct requests, in batches (a stream alone): `submit` and `open_stream`
    from the channel, `run` beside the replica's queue feed (node_agent/serving.py), through
    the same connection, in turns."""

    def __init__(
        self, replica: UUID, tenant: str, spec: ServableSpec, *, streams: bool = False
    ) -> None:
        self.replica = replica
        self.tenant = tenant
        self.deployment = spec.deployment
        self.streams = streams
        """Whether the replica's model streams (its entry point is a generator function)."""
        self.progress_s = spec.task_timeout_s
        """How long a stream's reader may take nothing before its stream ends."""
        self._most = spec.max_batch_size
        self._wait_s = spec.max_wait_ms / 1000
        self._freed_at = 0.0
        """When the replica was last let go of by a call (its own or the queue's)."""
        self._waiting: deque[_Request] = deque()
        self._streams: deque[_Stream] = deque()
        self._changed = asyncio.Event()
        """Set when a request arrives or goes away, or the replica is let go of: the batch is
        looked at again."""
        self._gone: str | None = None

    async def submit(self, items: list[Any], text: str) -> dict[str, Any]:
        """`items` (`text`, their JSON list) run in the replica's next batch: their outputs'
        JSON text (or the error that failed them) and the batch's figures. ReplicaGone once the
        replica stopped serving."""
        if self._gone is not None:
            raise ReplicaGone(self._gone)
        future = asyncio.get_running_loop().create_future()
        request = _Request(items, text, time.monotonic(), future)
        self._waiting.append(request)
        self._changed.set()
        try:
            return await request.answer
        except asyncio.CancelledError:
            # Its sender went away: still waiting for its batch, it never reaches the replica
            # (taken already, its call runs on and its answer is dropped, `_run`).
            if request in self._waiting:
                self._waiting.remove(request)
                self._changed.set()  # whether there is a batch changed
            raise

    def open_stream(self, item: Any) -> _Stream:
        """A stream of `item`'s outputs, run in its turn (`run`); `withdraw` it once its reader
        is done. ReplicaGone once the replica stopped serving."""
        if self._gone is not None:
            raise ReplicaGone(self._gone)
        stream = _Stream(item)
        self._streams.append(stream)
        self._changed.set()
        return stream

    def withdraw(self, stream: _Stream) -> None:
        """Its reader is done, or went away: still waiting its turn, it never reaches the
        replica; running, it stops at its next output."""
        stream.leave()
        if stream in self._streams:
            self._streams.remove(stream)
            self._changed.set()

    def close(self, why: str) -> None:
        """The replica stopped serving: the requests waiting, and any later, are refused."""
        self._gone = why
        while self._waiting:
            _fail(self._waiting.popleft(), ReplicaGone(why))
        while self._streams:
            _gone(self._streams.popleft(), why)

    async def run(self, client: ReplicaClient) -> None:
        """Batch and run the requests (a stream alone) until cancelled; ReplicaGone when the
        replica died (the batch it held is refused: its requests take the queue; a stream it
        ran ends with an error)."""
        client.when_freed(self._freed)
        while True:
            work = await self._next(client)
            if isinstance(work, _Stream):
                await self._stream(client, work)
                continue
            batch, reason = work
            try:
                await self._run(client, batch, reason)
            except ReplicaGone as exc:
                for request in batch:
                    _fail(request, ReplicaGone(str(exc)))
                raise

    def _freed(self) -> None:
        self._freed_at = time.monotonic()
        self._changed.set()

    async def _next(self, client: ReplicaClient) -> _Stream | tuple[list[_Request], str]:
        while True:
            # In their order of arrival, but a batch that formed before a stream came takes
            # requests that came after it: they run no later for it.
            if self._streams and (
                not self._waiting or self._streams[0].arrived <= self._waiting[0].arrived
            ):
                return self._streams.popleft()
            # Read afresh after each change: a request that went away leaves the batch.
            full = sum(len(r.items) for r in self._waiting) >= self._most
            if not self._waiting or (client.busy and not full):
                # Nothing to run; or the replica runs a call of the queue's, and the batch
                # fills until it is full or the replica is let go of (`_freed`).
                self._changed.clear()
                await self._changed.wait()
                continue
            # The replica has no call in flight. A batch whose first request came while a
            # call ran fills until its window has passed (often during that call): under
            # load, batches stay as large as the window makes them. One that came to a
            # replica with nothing in flight leaves at once: it would wait for nobody.
            came_during_call = self._waiting[0].arrived < self._freed_at
            left = self._waiting[0].arrived + self._wait_s - time.monotonic()
            if came_during_call and left > 0 and not full:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._changed.wait()
                continue
            taken = [self._waiting.popleft()]
            items = len(taken[0].items)
            # The first always (however large); then those that fit, in their order.
            while self._waiting and items + len(self._waiting[0].items) <= self._most:
                items += len(self._waiting[0].items)
                taken.append(self._waiting.popleft())
            if items >= self._most:
                return taken, "full"
            return taken, "timeout" if came_during_call else "idle"

    async def _run(self, client: ReplicaClient, batch: list[_Request], reason: str) -> None:
        started = time.monotonic()
        items = [item for request in batch for item in request.items]
        # The requests' texts joined, not their items encoded again (a tenth of a millisecond
        # per 5 KiB): each is a non-empty JSON list, its items between its brackets.
        text = "[" + ",".join(request.text.strip()[1:-1] for request in batch) + "]"
        try:
            ran = await call_in_parts(client, items, self._most, text)
        except (ValueError, TypeError, FrameError) as exc:
            # Items no frame carries to the replica: theirs to fix, as a model's error is.
            ran = Ran([], f"the items cannot be sent to the replica: {exc}", [], 0.0)
        invocation_ms = (time.monotonic() - started) * 1000
        calls = recorded_calls(len(items), self._most, ran.calls) or (
            BatchCall(len(items), invocation_ms, ran.inference_ms),
        )
        answers: list[tuple[str | None, str | None]] = []
        at = 0
        for request in batch:
            if ran.error is not None:
                answers.append((None, ran.error))
            else:
                answers.append(stored(ran.outputs[at : at + len(request.items)]))
            at += len(request.items)
        figures = {
            "replica": str(self.replica),
            "reason": reason,
            "outcome": "failed" if any(error for _, error in answers) else "succeeded",
            "tasks": sum(not request.answer.done() for request in batch),
            "invocation_ms": invocation_ms,
            "inference_ms": ran.inference_ms,
            "calls": [
                {
                    "batch": str(uuid4()),
                    "items": call.items,
                    "invocation_ms": call.invocation_ms,
                    "inference_ms": call.inference_ms,
                }
                for call in calls
            ],
        }
        for request, (output, error) in zip(batch, answers, strict=True):
            if not request.answer.done():
                request.answer.set_result({"output": output, "error": error, "batch": figures})

    async def _stream(self, client: ReplicaClient, stream: _Stream) -> None:
        """Run `stream` on the replica, its outputs held for its reader as they come, then its
        end or its error, with its figures. ReplicaGone (once the stream has its error) when
        the replica died."""
        started = time.monotonic()
        sent = 0
        total = 0
        refused: str | None = None

        async def deliver(output: Any, size: int) -> bool:
            nonlocal sent, total, refused
            if stream.left:  # no work on an output nobody will read
                return False
            # Made in a thread when large: encoding tens of MiB stalls the event loop, and
            # with it every tenant's channel and the agent's heartbeats.
            frame, why = (
                await asyncio.to_thread(chunk_frame, output)
                if size > THREAD_DECODE_BYTES
                else chunk_frame(output)
            )
            if frame is None:
                refused = f"output {sent} of the stream cannot be kept: {why}"
                return False
            # Its JSON's length: the frame less its header and the message around the output.
            total += len(frame) - HEADER_SIZE - len(_CHUNK_PREFIX) - 1
            if total > MAX_STREAM_BYTES:
                refused = (
                    f"the outputs passed {MAX_STREAM_BYTES} bytes of JSON, the most a task "
                    f"keeps; the stream was stopped after {sent} outputs"
                )
                return False
            sent += 1
            return await stream.offer(frame)

        inference_ms: float | None = None
        error: str | None = None
        try:
            end = await client.stream(stream.item, deliver)
            inference_ms, error = end.inference_ms, refused
        except ReplicaError as exc:
            error = str(exc)
        except (ValueError, TypeError, FrameError) as exc:
            error = f"the item cannot be sent to the replica: {exc}"
        except ReplicaGone as exc:
            _gone(stream, str(exc), sent=sent, invocation_ms=ms_since(started))
            raise
        except asyncio.CancelledError:
            # The replica's serving ended (its attempt did): its reader is told so at once.
            _gone(stream, "its serving ended", sent=sent, invocation_ms=ms_since(started))
            raise
        except Exception as exc:
            # A defect met on a tenant's output: its reader is told, and the connection, left
            # out of step by it (replica_client), is the replica's end, not the feed's crash.
            log.exception("stream on replica %s failed", self.replica)
            why = f"the stream failed in the agent: {type(exc).__name__}"
            _gone(stream, why, sent=sent, invocation_ms=ms_since(started))
            raise ReplicaGone(why) from exc
        figures = {
            "replica": str(self.replica),
            "chunks": sent,
            "invocation_ms": ms_since(started),
            "inference_ms": inference_ms,
        }
        stream.finish(
            {"op": "end", **figures}
            if error is None
            else {"op": "error", "error": error, **figures}
        )


def _fail(request: _Request, error: Exception) -> None:
    if not request.answer.done():
        request.answer.set_exception(error)


def _gone(stream: _Stream, why: str, *, sent: int = 0, invocation_ms: float = 0.0) -> None:
    stream.finish(
        {
            "op": "error",
            "error": f"the replica stopped serving: {why}",
            "gone": True,
            "chunks": sent,
            "invocation_ms": invocation_ms,
            "inference_ms": None,
        }
    )


class ServingChannel:
    """The channel's HTTP server's side: which replicas it reaches, and the token it takes."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.token = secrets.token_urlsafe(TOKEN_BYTES)
        """Made afresh at each start: one an earlier agent recorded is refused."""
        self.feeds: dict[UUID, DirectFeed] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post(PATH, self._predict)
        app.router.add_post(STREAM_PATH, self._stream)
        return app

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        # Compared in constant time: how long a refusal takes says nothing of the token.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            presented.strip().encode(), self.token.encode()
        )

    async def _request(self, request: web.Request) -> tuple[DirectFeed, str, Any] | web.Response:
        """The feed a request is for (its replica in the path, its tenant and deployment in the
        query), and its body: the JSON text, and its value; or its refusal (401, 400, 404)."""
        if not self._authorized(request):
            return _refused(401, "this channel takes only its agent's token")
        try:
            replica = UUID(request.match_info["replica"])
            text = await request.text()
            body = json.loads(text)
        except ValueError:
            return _refused(400, "expected a replica's id and a JSON body")
        feed = self.feeds.get(replica)
        if feed is None or (feed.tenant, feed.deployment) != (
            request.query.get("tenant"),
            request.query.get("deployment"),
        ):
            return _refused(404, f"no replica {replica} of that deployment here")
        return feed, text, body

    async def _predict(self, request: web.Request) -> web.Response:
        found = await self._request(request)
        if isinstance(found, web.Response):
            return found
        feed, text, inputs = found
        if not isinstance(inputs, list) or not inputs:
            return _refused(400, "expected a list of at least one item")
        try:
            answer = await unless_gone(request, feed.submit(inputs, text))
        except ReplicaGone as exc:
            return _refused(503, f"the replica stopped serving: {exc}")
        if answer is None:
            return web.Response(status=CLIENT_GONE)
        return web.json_response(answer)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        found = await self._request(request)
        if isinstance(found, web.Response):
            return found
        feed, _, item = found
        if not feed.streams:
            return _refused(
                409,
                f"the model of deployment {feed.deployment} does not stream: its entry point "
                "is not a generator function",
                streams=False,
            )
        try:
            stream = feed.open_stream(item)
        except ReplicaGone as exc:
            return _refused(503, f"the replica stopped serving: {exc}")
        response = web.StreamResponse(headers={"Content-Type": FRAMES})
        try:
            await response.prepare(request)
            await unless_gone(request, _relay(stream, response, feed.progress_s))
        except ConnectionError:
            pass  # its reader went away as it was written to
        except TimeoutError:
            # Its reader took nothing for the deployment's task timeout: the stream ends (its
            # generator is stopped), and its connection with it, whose last frame could not
            # be written either.
            log.info("stream on replica %s: its reader took nothing, ended", feed.replica)
            if request.transport is not None:
                request.transport.abort()
        finally:
            feed.withdraw(stream)
        return response


async def _relay(stream: _Stream, response: web.StreamResponse, progress_s: float) -> None:
    """The stream's messages written as they come, each a frame, up to its last; TimeoutError
    when one waits `progress_s` for the reader to take it (a reader that stopped reading holds
    the replica, and the window of outputs, for as long as it likes)."""
    while True:
        frame, last = await stream.next()
        async with asyncio.timeout(progress_s):
            await response.write(frame)
        if last:
            await response.write_eof()
            return


def _refused(status: int, why: str, **more: Any) -> web.Response:
    return web.json_response({"error": why, **more}, status=status)


@contextlib.asynccontextmanager
async def open_channel(listen: str) -> AsyncIterator[ServingChannel]:
    """The channel listening on `listen` (HOST:PORT; port 0: one the system picks) for the
    block."""
    host, port = parse_listen(listen)
    channel = ServingChannel("")
    runner = web.AppRunner(channel.app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        channel.address = advertised(host, bound)
        yield channel
    finally:
        await runner.cleanup()

"""The control plane's HTTP API as the SDK uses it: JSON requests, errors as exceptions (that
the CLI turns into exit codes), and SSE streams that resume with `Last-Event-ID` after a drop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30, connect=10)
# A followed stream is quiet for as long as the job is; the server's heartbeats (every 15 s)
# keep it alive, so a read that waits much longer than that means a dead connection.
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10, sock_read=60)
# An artifact's upload or download takes as long as its size needs: only a stall fails it.
TRANSFER_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10, sock_read=300)
RECONNECT_FOR_S = 60.0
"""How long a followed stream keeps reconnecting before the server counts as unreachable."""
RECONNECT_DELAY_S = (0.2, 0.5, 1.0, 2.0, 5.0)

_UNREACHABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)
"""Connection refused, reset or dropped (mid-body too), and timeouts: no (whole) answer."""


class UsageError(Exception):
    """The command line or an input file is wrong (exit code 2)."""


class ServerUnreachable(Exception):
    """No answer from the control plane (exit code 3)."""


class NotFound(Exception):
    """The job or model does not exist, or belongs to another tenant (exit code 4)."""


class ApiError(Exception):
    """The server refused the request (401, 409, 422, ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PredictionFailed(Exception):
    """A streamed prediction ended with an error (the model's traceback, its replica lost...):
    its task's id (`trainyard task ID`), and how many outputs came before (exit code 1)."""

    def __init__(self, message: str, task_id: str, chunks: int) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.chunks = chunks


@dataclass(frozen=True, slots=True)
class SseMessage:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


async def sse_messages(lines: AsyncIterable[bytes]) -> AsyncIterator[SseMessage]:
    """Parse an SSE body (`response.content`) into messages; comments (heartbeats) are skipped
    and a message's several `data` lines are joined, as the SSE specification says."""
    event, data, event_id = "message", list[str](), None
    async for raw in lines:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield SseMessage(event_id, event, "\n".join(data))
            event, data, event_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value


async def lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """A body's lines, however long (an SSE event's data is one line, and a model's output may
    be larger than aiohttp's own line reader takes), each as it is complete."""
    pending = bytearray()
    async for data in content.iter_any():
        pending += data
        start = 0
        while (end := pending.find(b"\n", start)) != -1:
            yield bytes(pending[start : end + 1])
            start = end + 1
        del pending[:start]
    if pending:
        yield bytes(pending)


class ApiClient:
    """One HTTP session against one server with one bearer token."""

    def __init__(self, server: str, token: str) -> None:
        self.server = server
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ApiClient:
        self._session = aiohttp.ClientSession(headers=self._headers)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use ApiClient as an async context manager")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str]] = (),
        body: Any = None,
        form: aiohttp.MultipartWriter | None = None,
        not_found: str | None = None,
        text: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The response's JSON (or text; None for 204); an exception for any error status. A
        404 is NotFound, with `not_found` as its message (else the server's). The body is
        `body` as JSON, or `form`, a multipart body whose parts may stream from files;
        `headers` are sent too (an Idempotency-Key)."""
        try:
            async with self.session.request(
                method,
                self.server + path,
                params=list(params),
                json=body,
                data=form,
                headers=None if headers is None else dict(headers),
                timeout=REQUEST_TIMEOUT if form is None else TRANSFER_TIMEOUT,
            ) as response:
                await raise_for_status(response, not_found)
                if response.status == 204:
                    return None
                return await response.text() if text else await response.json()
        except aiohttp.InvalidURL as exc:
            raise UsageError(f"invalid server URL {self.server!r}") from exc
        except _UNREACHABLE as exc:
            raise self.unreachable(exc) from exc

    @asynccontextmanager
    async def download(
        self, path: str, params: Sequence[tuple[str, str]] = (), *, not_found: str | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A response whose body is too large to hold, for the caller to read in chunks
        (`response.content`). A body cut short of its Content-Length, as by a server that
        stops sending, is ServerUnreachable, like a dropped connection."""
        try:
            async with self.session.get(
                self.server + path, params=list(params), timeout=TRANSFER_TIMEOUT
            ) as response:
                await raise_for_status(response, not_found)
                yield response
        except aiohttp.InvalidURL as exc:
            raise UsageError(f"invalid server URL {self.server!r}") from exc
        except _UNREACHABLE as exc:
            raise self.unreachable(exc) from exc

    @asynccontextmanager
    async def post_stream(
        self, path: str, params: Sequence[tuple[str, str]], body: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A POST whose answer is a stream, for the caller to read as it comes (an SSE body):
        no total time limit, only a stall (the server's heartbeats keep a live one busy)."""
        try:
            async with self.session.post(
                self.server + path, params=list(params), json=body, timeout=STREAM_TIMEOUT
            ) as response:
                await raise_for_status(response, None)
                yield response
        except aiohttp.InvalidURL as exc:
            raise UsageError(f"invalid server URL {self.server!r}") from exc
        except _UNREACHABLE as exc:
            raise self.unreachable(exc) from exc

    def unreachable(self, exc: BaseException) -> ServerUnreachable:
        detail = str(exc) or type(exc).__name__
        return ServerUnreachable(f"cannot reach the server at {self.server}: {detail}")

    async def follow(
        self, path: str, params: Sequence[tuple[str, str]] = (), *, not_found: str | None = None
    ) -> AsyncGenerator[SseMessage, None]:
        """The messages of an SSE stream, forever: when the connection drops, or the server
        closes it early (a replica shutting down), it reconnects with `Last-Event-ID`, so no
        message is lost or repeated. The caller stops when it has seen the last message."""
        last_id: str | None = None
        failing_since: float | None = None
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            headers = {"Last-Event-ID": last_id} if last_id is not None else {}
            try:
                async with self.session.get(
                    self.server + path, params=list(params), headers=headers, timeout=STREAM_TIMEOUT
                ) as response:
                    await raise_for_status(response, not_found)
                    failing_since, attempt = None, 0
                    async for message in sse_messages(response.content):
                        if message.id is not None:
                            last_id = message.id
                        yield message
            except aiohttp.InvalidURL as exc:
                raise UsageError(f"invalid server URL {self.server!r}") from exc
            except _UNREACHABLE as exc:
                failing_since = failing_since or loop.time()
                if loop.time() - failing_since > RECONNECT_FOR_S:
                    raise self.unreachable(exc) from exc
            await asyncio.sleep(RECONNECT_DELAY_S[min(attempt, len(RECONNECT_DELAY_S) - 1)])
            attempt += 1


async def raise_for_status(response: aiohttp.ClientResponse, not_found: str | None) -> None:
    """NotFound for 404, ApiError for the other error statuses, with a one-line message that
    names every field the server found wrong."""
    if response.status < 400:
        return
    try:
        body = await response.json(content_type=None)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"error": f"HTTP {response.status} {response.reason}"}
    message = str(body.get("error") or f"HTTP {response.status}")
    if response.status == 404:
        raise NotFound(not_found or message)
    fields = body.get("fields") or []
    if "field" in body:
        message = f"{body['field']}: {message}"
    if fields:
        message += ": " + "; ".join(f"{f.get('field')}: {f.get('message')}" for f in fields)
    if response.status == 401:
        message = f"the server refused the token ({message})"
    raise ApiError(response.status, message)

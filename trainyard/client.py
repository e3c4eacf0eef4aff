"""The Python SDK: a control plane's jobs, logs and nodes as method calls.

`AsyncClient` is the SDK for asyncio code, and what the CLI's user commands are built on;
`Client` is the same calls, blocking, for scripts and notebooks: it runs an `AsyncClient` on an
event loop of its own, in a thread, so it works where a loop is already running (Jupyter) too.
Jobs, nodes and log lines are the API's JSON objects, as dicts. Errors are exceptions:
`NotFound`, `ApiError` (with the HTTP status), `ServerUnreachable`, `UsageError`.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping
from contextlib import aclosing
from types import TracebackType
from typing import Any, TypeVar

from controlplane.jobs.lifecycle import JobStatus
from trainyard.api import ApiClient

T = TypeVar("T")

TERMINAL_STATES = frozenset(status.value for status in JobStatus if status.terminal)
"""The states a job ends in: it never leaves them."""

_TEXT_LOG = re.compile(r"\[attempt (\d+) learner (\d+) (\w+)\] (.*)", re.DOTALL)
"""A line of the API's plain-text logs: `[attempt A learner L STREAM] TEXT`."""


class AsyncClient:
    """One server, one bearer token, one HTTP session: `async with AsyncClient(server, token)
    as client: job = await client.submit(manifest)`."""

    def __init__(self, server: str, token: str) -> None:
        """`server` is the control plane's URL (`http://host:8080`), `token` a tenant's token."""
        self.api = ApiClient(server, token)
        """The HTTP API itself, for what has no method here (`request`, `follow`)."""

    @property
    def server(self) -> str:
        return self.api.server

    async def __aenter__(self) -> AsyncClient:
        await self.api.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.api.__aexit__(kind, exc, tb)

    async def submit(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a job (a manifest as `trainyard.read_manifest` gives it); the new job. Its
        `unschedulable_reason`, when set, says why no node could run it now."""
        job: dict[str, Any] = await self.api.request("POST", "/v1/jobs", body=dict(manifest))
        return job

    async def jobs(
        self,
        *,
        states: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Up to `limit` (1 to 500) jobs, newest first: in any of `states` if given, and with
        every one of `labels`."""
        params = [("limit", str(limit)), *(("state", state) for state in states)]
        params += [("label", f"{key}={value}") for key, value in (labels or {}).items()]
        page = await self.api.request("GET", "/v1/jobs", params=params)
        jobs: list[dict[str, Any]] = page["jobs"]
        return jobs

    async def job(self, job_id: str) -> dict[str, Any]:
        """A job now: state, attempt, restarts, nodes, GPUs, last checkpoint, exit codes."""
        job: dict[str, Any] = await self.api.request(
            "GET", f"/v1/jobs/{job_id}", not_found=_no_job(job_id)
        )
        return job

    async def history(self, job_id: str) -> dict[str, Any]:
        """A job's history: `history`, every event with time, actor and reason; `webhooks`, its
        notifications' deliveries (absent from servers older than webhooks)."""
        history: dict[str, Any] = await self.api.request(
            "GET", f"/v1/jobs/{job_id}/history", not_found=_no_job(job_id)
        )
        return history

    async def cancel(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a job that has not finished (`reason` goes into its history); the job."""
        body = {"reason": reason} if reason else {}
        job: dict[str, Any] = await self.api.request(
            "POST", f"/v1/jobs/{job_id}/cancel", body=body, not_found=_no_job(job_id)
        )
        return job

    async def checkpoint(self, job_id: str) -> dict[str, Any]:
        """Ask a PROCESSING job's learners to save a checkpoint now; the job."""
        job: dict[str, Any] = await self.api.request(
            "POST", f"/v1/jobs/{job_id}/checkpoint", not_found=_no_job(job_id)
        )
        return job

    async def nodes(self) -> list[dict[str, Any]]:
        """Every node: state, lease, GPUs (free ones too), CPUs and memory allocated."""
        nodes: list[dict[str, Any]] = (await self.api.request("GET", "/v1/nodes"))["nodes"]
        return nodes

    async def events(self, job_id: str) -> AsyncGenerator[dict[str, Any], None]:
        """A job's events (type, state, attempt, data), from its submission on, as they
        happen; the iteration ends with the event that ends the job. A dropped connection is
        resumed where it broke."""
        stream = self.api.follow(f"/v1/jobs/{job_id}/events", not_found=_no_job(job_id))
        async with aclosing(stream):
            async for message in stream:
                event: dict[str, Any] = message.json()
                yield event
                if event["state"] in TERMINAL_STATES:
                    return

    async def wait(self, job_id: str) -> str:
        """Wait for a job to end; the state it ended in (COMPLETED, FAILED or CANCELLED)."""
        state = ""
        async with aclosing(self.events(job_id)) as events:
            async for event in events:
                state = event["state"]
        return state

    async def logs(
        self,
        job_id: str,
        *,
        follow: bool = False,
        attempt: int | None = None,
        learner: int | None = None,
        protocol: bool = False,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """A job's learner log lines, in the order stored, each {attempt, learner, stream,
        line} (and, when following, its `seq` and `at`); only attempt `attempt` or learner
        `learner` if given, and the launcher's reports (protocol lines) too with `protocol`.
        Without `follow`, the lines stored so far; with it, new ones as they come, until the job
        and its learners have ended."""
        params = [("protocol", "true")] if protocol else []
        if attempt is not None:
            params.append(("attempt", str(attempt)))
        if learner is not None:
            params.append(("learner", str(learner)))
        path, not_found = f"/v1/jobs/{job_id}/logs", _no_job(job_id)
        if not follow:
            text = await self.api.request(
                "GET", path, params=params, not_found=not_found, text=True
            )
            for stored in _text_lines(text):
                yield stored
            return
        stream = self.api.follow(path, [("follow", "true"), *params], not_found=not_found)
        async with aclosing(stream):
            async for message in stream:
                if message.event == "end":
                    return
                if message.event == "line":
                    line: dict[str, Any] = message.json()
                    yield line


def _no_job(job_id: str) -> str:
    return f"no job {job_id}"


def _text_lines(text: str) -> list[dict[str, Any]]:
    """The API's plain-text logs as lines: a text line without the `[attempt ...]` prefix
    continues the line before it (a learner's line with a line break in it)."""
    lines: list[dict[str, Any]] = []
    for row in text.splitlines():
        match = _TEXT_LOG.fullmatch(row)
        if match is not None:
            attempt, learner, stream, content = match.groups()
            lines.append(
                {
                    "attempt": int(attempt),
                    "learner": int(learner),
                    "stream": stream,
                    "line": content,
                }
            )
        elif lines:
            lines[-1]["line"] += "\n" + row
    return lines


class Client:
    """The SDK, blocking: `with Client(server, token) as client: client.submit(manifest)`.

    Every method is `AsyncClient`'s, run on the client's own event loop (in a thread of its
    own); `logs` and `events` are plain iterators. Close it (or use `with`) when done."""

    def __init__(self, server: str, token: str) -> None:
        """`server` is the control plane's URL (`http://host:8080`), `token` a tenant's token."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="trainyard-client", daemon=True
        )
        self._thread.start()
        self._client = AsyncClient(server, token)
        self._run(self._client.__aenter__())

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP session and stop the client's thread; closing twice is harmless."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    @property
    def server(self) -> str:
        return self._client.server

    def submit(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """See `AsyncClient.submit`."""
        return self._run(self._client.submit(manifest))

    def jobs(
        self,
        *,
        states: Iterable[str] = (),
        labels: Mapping[str, str] | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """See `AsyncClient.jobs`."""
        return self._run(self._client.jobs(states=states, labels=labels, limit=limit))

    def job(self, job_id: str) -> dict[str, Any]:
        """See `AsyncClient.job`."""
        return self._run(self._client.job(job_id))

    def history(self, job_id: str) -> dict[str, Any]:
        """See `AsyncClient.history`."""
        return self._run(self._client.history(job_id))

    def cancel(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """See `AsyncClient.cancel`."""
        return self._run(self._client.cancel(job_id, reason))

    def checkpoint(self, job_id: str) -> dict[str, Any]:
        """See `AsyncClient.checkpoint`."""
        return self._run(self._client.checkpoint(job_id))

    def nodes(self) -> list[dict[str, Any]]:
        """See `AsyncClient.nodes`."""
        return self._run(self._client.nodes())

    def events(self, job_id: str) -> Iterator[dict[str, Any]]:
        """See `AsyncClient.events`."""
        return self._iterate(self._client.events(job_id))

    def wait(self, job_id: str) -> str:
        """See `AsyncClient.wait`."""
        return self._run(self._client.wait(job_id))

    def logs(
        self,
        job_id: str,
        *,
        follow: bool = False,
        attempt: int | None = None,
        learner: int | None = None,
        protocol: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """See `AsyncClient.logs`."""
        lines = self._client.logs(
            job_id, follow=follow, attempt=attempt, learner=learner, protocol=protocol
        )
        return self._iterate(lines)

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C) while waiting: the call must not go on in the background.
            future.cancel()
            raise

    def _iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            self._run(_close(items))


async def _next(items: AsyncGenerator[T, None]) -> T:
    # A coroutine, as `run_coroutine_threadsafe` wants; `anext()` gives another awaitable.
    return await anext(items)


async def _close(items: AsyncGenerator[T, None]) -> None:
    await items.aclose()

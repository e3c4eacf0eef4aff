"""Feeding an inference job's replica: the agent asks Postgres for the job's next query (made
there, by the claim: the control plane plays no part, so queries keep flowing while none
runs), has the replica run it, and records its result, fenced by the claim.

Fair time between jobs is the claim's (controlplane/inference/queries.sql, `claim_query`): a
replica whose job is ahead of its share waits for a query of another job to start,
woken by the serving channel's 'inference' notifications, or after POLL_S at most (so that its
job stays present, and a lost notification costs no more than that).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

from controlplane.agent_port.protocol import QueryQueue
from controlplane.agent_port.vocabulary import UNAVAILABLE, InferenceJob, QueryClaim
from controlplane.agent_port.wakes import INFERENCE, Wakeups
from node_agent.replica_client import ReplicaClient, ReplicaError

POLL_S = 0.5
PRESENT_S = 3.0
"""A replica that asked within this long (or said it runs a query: every PRESENT_S / 3) counts
as running its job: the other jobs wait for its job's turn, no longer (a job whose replicas are
all gone holds nobody back). Several of POLL_S."""
T = TypeVar("T")

Retry = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]


class QueryFeed:
    """One replica's queries: one at a time, each a batch of the job's items."""

    def __init__(
        self,
        port: QueryQueue,
        listener: Wakeups,
        *,
        job_id: UUID,
        replica: UUID,
        node: str,
        note: Callable[[str], None],
    ) -> None:
        self._port = port
        self._listener = listener
        self._job_id = job_id
        self._replica = replica
        self._node = node
        self._note = note

    async def run(self, client: ReplicaClient, load_error: str | None, retry: Retry[Any]) -> None:
        """Run the job's queries until cancelled (the job ended: its deployment stops this
        replica). A model that could not be loaded is reported instead: the job fails."""
        job = await self._job(retry)
        if load_error is not None:
            await retry(lambda: self._port.record_load_error(self._job_id, load_error))
            await asyncio.Future()  # until the job's end stops the replica
        source: dict[str, Any] = json.loads(job.input)
        batch_size = job.batch_size
        said_done = False
        while True:
            seen = self._listener.seen(INFERENCE)
            claim = uuid.uuid4()
            claimed = await retry(functools.partial(self._claim, claim))
            if claimed.index is not None:
                await self._run(client, source, batch_size, claimed.index, claim, retry)
                continue
            if claimed.outcome == "done" and not said_done:
                self._note("[trainyard] the job's queries have all finished")
            said_done = claimed.outcome == "done"
            try:
                async with asyncio.timeout(POLL_S):
                    await self._listener.wait_for(INFERENCE, seen)
            except TimeoutError:
                pass

    async def _job(self, retry: Retry[Any]) -> InferenceJob:
        """The job's row (written right after the job, which this replica's deployment
        follows; waited for, should the two race)."""
        while True:
            row: InferenceJob | None = await retry(lambda: self._port.inference_job(self._job_id))
            if row is not None:
                return row
            await asyncio.sleep(POLL_S)

    async def _claim(self, claim: UUID) -> QueryClaim:
        return await self._port.claim_query(
            self._job_id, self._replica, claim, self._node, PRESENT_S
        )

    async def _run(
        self,
        client: ReplicaClient,
        source: dict[str, Any],
        batch_size: int,
        index: int,
        claim: UUID,
        retry: Retry[Any],
    ) -> None:
        first = index * batch_size
        output: str | None = None
        error: str | None = None
        inference_ms: float | None = None
        try:
            async with asyncio.TaskGroup() as group:
                present = group.create_task(self._present())
                if "generate" in source:
                    outputs, inference_ms = await client.predict_generated(
                        source["generate"], first, batch_size
                    )
                else:
                    items = source["items"][first : first + batch_size]
                    outputs, inference_ms = await client.predict(items)
                present.cancel()
            output, error = stored(outputs)
        except* ReplicaError as failed:
            error = str(failed.exceptions[0])
        await retry(
            lambda: self._port.finish_query(self._job_id, index, output, error, inference_ms, claim)
        )

    async def _present(self) -> None:
        """While a query runs: the replica is still there (a failed update is only a late
        one; the claim's own ask and the result count too)."""
        while True:
            await asyncio.sleep(PRESENT_S / 3)
            with contextlib.suppress(*UNAVAILABLE):
                await self._port.replica_present(self._job_id, self._replica)


def stored(outputs: list[Any]) -> tuple[str | None, str | None]:
    """`outputs` as JSON text, or why they cannot be stored (Postgres's jsonb holds no NaN,
    infinities, NUL characters or unpaired surrogates; a tenant's model may return any of them,
    and text jsonb refuses would fail the write of every result recorded with it)."""
    try:
        # Not escaped to ASCII: a lone surrogate would be written as \ud800, which jsonb
        # refuses as it parses; as it is, it is text that cannot be encoded (below).
        text = json.dumps(outputs, allow_nan=False, ensure_ascii=False)
    except ValueError as exc:
        return None, f"its outputs are not JSON: {exc}"
    except RecursionError:  # arrays nested past the interpreter's stack
        return None, "its outputs are nested too deeply to be stored"
    if "\\u0000" in text:  # JSON escapes a NUL even when it escapes nothing else
        return None, "its outputs hold a NUL character, which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None, "its outputs hold text that is not valid Unicode (an unpaired surrogate)"
    return text, None

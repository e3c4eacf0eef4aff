"""The direct path of a synchronous prediction: from the API to a replica through its agent's
serving channel (node_agent/serving_channel.py), with nothing written to Postgres on the way.

Each control plane process keeps, per deployment, its route: the deployment as its stream has
it (not the read model, which lags: a deployment deleted a moment ago takes no request) and the
channels its replicas are offered on (`serving_channels`), read once and then renewed in the
background each ROUTE_FRESH_S while it is used, so that requests never wait for it; a deletion
or a scaling through this process drops it at once. A request goes to the replica with the
fewest of this process's requests in flight, over a pool of keep-alive connections per agent,
with the agent's token; the agent batches it with the replica's other requests and answers.
Any failure of the channel (refused, unreachable, no such replica there, the replica gone, the
deployment's task timeout passed) is `ChannelFailed`: the caller then queues the request as a
row (`tasks.Tasks`), where nothing is lost, so an old agent, one unreachable, or a replica that
died mid-request costs time, never a result. A tenant never reaches a channel: only the
control plane holds the tokens.

A streaming prediction (`stream`) goes the same way to the least busy replica, on connections
of their own (a long stream holds one: streams never take the plain requests' room), and
reads the agent's answer frame by frame as the replica yields (node_agent/serving_channel.py).
It has no queue to fall back on: a channel that fails before the stream began is
`ChannelFailed` for the caller to answer 503; a model that does not stream is `NotStreaming`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg

from controlplane.database import DATABASE_ERRORS
from controlplane.deployments.lifecycle import Canary, Deployment
from controlplane.deployments.service import Deployments
from controlplane.queries import Q
from runners.frames import FrameError, read_message

log = logging.getLogger(__name__)

ROUTE_FRESH_S = 1.0
"""How old a route may be before a request renews it (in the background: the request takes
the one at hand). A replica offered a moment ago is used that much later at most."""
CONNECTIONS_PER_AGENT = 64
"""Keep-alive connections kept open to each agent's channel."""
CONNECTION_WAIT_S = 0.5
"""The longest a request waits for one of those connections (all busy: one tenant's slow model
under many requests can hold them all) before it takes the queue, where each tenant's
requests are bounded and served in turn, with what is left of its wait."""
MAX_WAIT_S = 20.0
"""The longest a direct request waits for its replica (under the synchronous wait)."""


class StreamsBusy(Exception):
    """Every replica of the deployment is running one of this control plane's streams."""


class ChannelFailed(Exception):
    """The direct path did not answer: queue the request instead."""


class NotStreaming(Exception):
    """A streaming request for a model whose entry point does not stream (the agent said so,
    from what its replica said as it loaded the model)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    replica: UUID
    address: str
    token: str


@dataclass(frozen=True, slots=True)
class Route:
    """Where a deployment's synchronous predictions go, and what they need of it."""

    model: tuple[str, str, int]
    """Its model version: tenant, name, number (what its items are checked against)."""
    memo_salt: str | None
    """What identifies the deployed model for the memo (None: its results are not kept)."""
    memo_max_entries: int
    timeout_s: float
    stream_idle_s: float
    """The longest a stream may go without an output: the deployment's task timeout."""
    endpoints: tuple[Endpoint, ...]
    canary: Route | None = None
    """Its canary's route (another model version, its own replicas), taking `weight`% of the
    requests (canary.to_canary: the caller chooses)."""
    weight: int = 0


@dataclass(frozen=True, slots=True)
class DirectAnswer:
    """A replica's answer to one request: its outputs' JSON text, or why it failed; the batch
    it ran in (the agent's figures: `calls`, `tasks`, `reason`, `outcome`, times)."""

    replica: UUID
    output: str | None
    error: str | None
    batch: dict[str, Any]


class Upstream:
    """A stream as its agent sends it: `next` message, until the last (`end` or `error`)."""

    def __init__(self, replica: UUID, response: aiohttp.ClientResponse) -> None:
        self.replica = replica
        self._response = response

    async def next(self) -> dict[str, Any]:
        """The agent's next message; ChannelFailed when the stream broke off (TimeoutError:
        nothing came within the deployment's task timeout)."""
        try:
            message = await read_message(self._response.content)
        except (aiohttp.ClientError, FrameError) as exc:
            raise ChannelFailed(f"the agent's stream broke off: {exc!r}") from exc
        if message is None:
            raise ChannelFailed("the agent's stream ended before its last message")
        return message


@dataclass(slots=True)
class _Cached:
    route: Route
    at: float


def route_of(deployment: Deployment, channels: list[asyncpg.Record]) -> Route:
    """Its route, with its canary's beside it: each version to its own replicas, each memoized
    under its own version's artifact."""
    serving = deployment.serving

    def of(model: Deployment | Canary, replicas: tuple[UUID, ...]) -> Route:
        salt = f"{model.artifact_sha256}\n{model.entry_point}"
        return Route(
            model=(deployment.model_tenant, deployment.model_name, model.version),
            memo_salt=salt if serving["memo"] else None,
            memo_max_entries=serving["memo_max_entries"],
            timeout_s=min(float(serving["task_timeout_s"]), MAX_WAIT_S),
            stream_idle_s=float(serving["task_timeout_s"]),
            endpoints=tuple(
                Endpoint(c["replica"], c["address"], c["token"])
                for c in channels
                if c["replica"] in replicas
            ),
        )

    own, canary = of(deployment, deployment.active), deployment.canary
    if canary is None:
        return own
    return replace(own, canary=of(canary, canary.active), weight=canary.weight)


class DirectPath:
    """Routes and connections: one per control plane process; `close` when it stops."""

    def __init__(self, pool: asyncpg.Pool, deployments: Deployments) -> None:
        self._pool = pool
        self._deployments = deployments
        self._routes: dict[tuple[str, str], _Cached] = {}
        self._renewing: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._in_flight: Counter[UUID] = Counter()
        self._streaming: Counter[UUID] = Counter()
        """The streams open to each replica: one at most (a replica runs one at a time)."""

    async def route(self, tenant: str, deployment: str) -> Route | None:
        """The deployment's route (None: no such deployment, or deleted): the one at hand,
        renewed in the background once older than ROUTE_FRESH_S; read now only the first
        time."""
        key = (tenant, deployment)
        cached = self._routes.get(key)
        if cached is None:
            return await self._load(key)
        if time.monotonic() - cached.at > ROUTE_FRESH_S and key not in self._renewing:
            task = asyncio.create_task(self._renew(key), name=f"route-{tenant}.{deployment}")
            self._renewing[key] = task
            task.add_done_callback(lambda done: self._renewed(key, done))
        return cached.route

    def forget(self, tenant: str, deployment: str) -> None:
        """The route failed a request, or its deployment changed here: the next request reads
        it afresh (a renewal under way, which may have read it before the change, is
        dropped)."""
        self._routes.pop((tenant, deployment), None)
        renewing = self._renewing.pop((tenant, deployment), None)
        if renewing is not None:
            renewing.cancel()

    async def send(self, tenant: str, deployment: str, route: Route, inputs: str) -> DirectAnswer:
        """`inputs` (a JSON list, encoded once by the caller, which keeps the text) run by one
        of the route's replicas (the least busy); ChannelFailed. Cancelled (its client went
        away), it closes its connection to the agent, which drops the request if it still
        waits for its batch (node_agent/serving_channel.py)."""
        if not route.endpoints:
            raise ChannelFailed("no replica is offered on a channel")
        endpoint = min(route.endpoints, key=lambda e: self._in_flight[e.replica])
        session = self._session(endpoint.address)
        url = f"{endpoint.address}/v1/replicas/{endpoint.replica}/predict"
        self._in_flight[endpoint.replica] += 1
        try:
            async with session.post(
                url,
                params={"tenant": tenant, "deployment": deployment},
                # The inputs as the caller encoded them, which the agent hands on as they are:
                # a second encoding of large items is a cost.
                data=inputs.encode(),
                headers={
                    "Authorization": f"Bearer {endpoint.token}",
                    "Content-Type": "application/json",
                },
                timeout=aiohttp.ClientTimeout(total=route.timeout_s, connect=CONNECTION_WAIT_S),
            ) as response:
                if response.status != 200:
                    why = (await response.text())[:200]
                    raise ChannelFailed(f"{url} answered {response.status}: {why}")
                answer = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ChannelFailed(f"{url}: {exc!r}") from exc
        finally:
            self._in_flight[endpoint.replica] -= 1
            if not self._in_flight[endpoint.replica]:
                del self._in_flight[endpoint.replica]
        try:
            return DirectAnswer(
                replica=endpoint.replica,
                output=answer["output"],
                error=answer["error"],
                batch=answer["batch"],
            )
        except (KeyError, TypeError) as exc:
            raise ChannelFailed(f"{url} answered out of form: {exc!r}") from exc

    @contextlib.asynccontextmanager
    async def stream(
        self, tenant: str, deployment: str, route: Route, item: str
    ) -> AsyncIterator[Upstream]:
        """A stream of the outputs of `item` (one item's JSON, encoded by the caller) from the
        least busy of the route's replicas, open for the block: closed early, its agent stops
        the replica's generator. ChannelFailed before the stream began (no replica offered,
        refused, unreachable, the replica gone); NotStreaming for a model that does not."""
        if not route.endpoints:
            raise ChannelFailed("no replica is offered on a channel")
        # A replica runs one stream at a time: another would wait at its agent, holding one of
        # the agent's stream connections (all tenants share them) for as long as the first
        # lasts. So a deployment streams at most as many at once as it has replicas offered.
        free = [e for e in route.endpoints if not self._streaming[e.replica]]
        if not free:
            raise StreamsBusy(
                f"each of the {len(route.endpoints)} replicas of deployment {deployment} is "
                "running a stream"
            )
        endpoint = min(free, key=lambda e: self._in_flight[e.replica])
        session = self._session(endpoint.address, streams=True)
        url = f"{endpoint.address}/v1/replicas/{endpoint.replica}/stream"
        self._in_flight[endpoint.replica] += 1
        self._streaming[endpoint.replica] += 1
        try:
            try:
                response = await session.post(
                    url,
                    params={"tenant": tenant, "deployment": deployment},
                    data=item.encode(),
                    headers={
                        "Authorization": f"Bearer {endpoint.token}",
                        "Content-Type": "application/json",
                    },
                    timeout=aiohttp.ClientTimeout(
                        total=None, connect=CONNECTION_WAIT_S, sock_read=route.stream_idle_s
                    ),
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ChannelFailed(f"{url}: {exc!r}") from exc
            try:
                if response.status != 200:
                    try:
                        refusal = await response.json()
                    except (aiohttp.ClientError, ValueError):
                        refusal = None
                    if response.status == 409 and isinstance(refusal, dict):
                        raise NotStreaming(str(refusal.get("error")))
                    why = (await response.text())[:200] if refusal is None else refusal
                    raise ChannelFailed(f"{url} answered {response.status}: {why}")
                yield Upstream(endpoint.replica, response)
            finally:
                # Read to its end, its connection is kept; cut short, it is closed: the agent
                # sees its reader gone.
                response.release()
        finally:
            self._in_flight[endpoint.replica] -= 1
            if not self._in_flight[endpoint.replica]:
                del self._in_flight[endpoint.replica]
            del self._streaming[endpoint.replica]

    async def close(self) -> None:
        for task in list(self._renewing.values()):
            task.cancel()
        await asyncio.gather(*self._renewing.values(), return_exceptions=True)
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    def _session(self, address: str, *, streams: bool = False) -> aiohttp.ClientSession:
        """The pool of connections to the agent at `address`: one for plain requests, one
        for streams."""
        key = f"{address} streams" if streams else address
        session = self._sessions.get(key)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=CONNECTIONS_PER_AGENT)
            session = self._sessions[key] = aiohttp.ClientSession(connector=connector)
        return session

    async def _load(self, key: tuple[str, str]) -> Route | None:
        deployment = await self._deployments.load(*key)
        route = None
        if deployment is not None and not deployment.deleted:
            replicas = list(deployment.active)
            if deployment.canary is not None:
                replicas.extend(deployment.canary.active)
            channels = await self._pool.fetch(Q["direct_channels"], *key, replicas)
            route = route_of(deployment, channels)
            self._routes[key] = _Cached(route, time.monotonic())
        else:
            # Not kept: names of no deployment, which any tenant may send, would grow the
            # routes for good. Such a request reads its deployment each time, as it did.
            self._routes.pop(key, None)
        return route

    def _renewed(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._renewing.get(key) is task:
            del self._renewing[key]

    async def _renew(self, key: tuple[str, str]) -> None:
        try:
            await self._load(key)
        except DATABASE_ERRORS as exc:
            # The route at hand serves on; the next request past its age tries again.
            log.warning("direct path: renewing the route of %s.%s failed: %s", *key, exc)

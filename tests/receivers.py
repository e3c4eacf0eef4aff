"""Real HTTP receivers of webhook deliveries for the tests: an aiohttp server on a free port
that records every request and answers as the test tells it to."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Received:
    """One request as it arrived: when (wall clock), its headers and its exact body."""

    at: float
    headers: dict[str, str]
    body: bytes

    @property
    def delivery_id(self) -> str:
        return self.headers["Trainyard-Delivery-Id"]

    @property
    def attempt(self) -> int:
        return int(self.headers["Trainyard-Attempt"])

    def signed_with(self, secret: str) -> bool:
        """Checked here from first principles, as a receiver written from docs/user-guide.md's
        Webhooks would."""
        parts = [p.split("=", 1) for p in self.headers["Trainyard-Signature"].split(",")]
        timestamp = next(v for k, v in parts if k == "t")
        mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + self.body, hashlib.sha256)
        return any(k == "v1" and hmac.compare_digest(v, mac.hexdigest()) for k, v in parts)


Answer = Callable[["Receiver", Received], Awaitable[int]]


async def ok(_: Receiver, __: Received) -> int:
    return 200


@dataclass
class Receiver:
    answer: Answer = ok
    url: str = ""
    received: list[Received] = field(default_factory=list)
    in_flight: Counter[str] = field(default_factory=Counter)
    overlaps: list[str] = field(default_factory=list)
    """Delivery ids that arrived while a request for the same delivery was still open."""

    def of(self, delivery_id: str) -> list[Received]:
        return [r for r in self.received if r.delivery_id == delivery_id]

    def answered(self) -> set[str]:
        return {r.delivery_id for r in self.received}

    async def _handle(self, request: web.Request) -> web.Response:
        received = Received(time.time(), dict(request.headers), await request.read())
        self.received.append(received)
        if self.in_flight[received.delivery_id]:
            self.overlaps.append(received.delivery_id)
        self.in_flight[received.delivery_id] += 1
        try:
            return web.Response(status=await self.answer(self, received))
        finally:
            self.in_flight[received.delivery_id] -= 1


@asynccontextmanager
async def receiving(answer: Answer = ok) -> AsyncIterator[Receiver]:
    receiver = Receiver(answer)
    app = web.Application()
    app.router.add_post("/hook", receiver._handle)
    # A short shutdown timeout: handlers that hang on purpose must not hold up the test's end.
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    receiver.url = f"http://{host}:{port}/hook"
    try:
        yield receiver
    finally:
        await runner.cleanup()


def failing_first(times: int, status: int = 500) -> Answer:
    """Answers `status` to the first `times` requests of each delivery, then 200."""

    async def answer(receiver: Receiver, received: Received) -> int:
        return status if len(receiver.of(received.delivery_id)) <= times else 200

    return answer


def slow(seconds: float, then: Answer = ok) -> Answer:
    async def answer(receiver: Receiver, received: Received) -> int:
        await asyncio.sleep(seconds)
        return await then(receiver, received)

    return answer


def dead_url() -> str:
    """A URL where nothing listens: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def body_of(received: Received) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(received.body)
    return parsed

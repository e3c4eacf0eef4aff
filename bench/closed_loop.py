"""Closed-loop HTTP clients: `concurrency` clients, each sending its next request as soon as its
previous one is answered, so that exactly `concurrency` requests are in flight at any time (the
load a fixed pool of callers puts on a server, as opposed to an open loop's fixed arrival rate).

`send` is one request through the session the clients share (one connection each, kept alive);
it returns once the answer is read and checked, and raises when the answer is not right. The
clients run for `warmup_s` (answers not counted: the server's caches, JITs and batching
heuristics settle), then for `duration_s`, the window measured. A request counts when its answer
comes inside the window; its latency is from its sending to its answer, so one sent during the
warm-up and answered in the window counts with its whole latency. Requests in flight at the
window's end are abandoned.

A request that fails at the HTTP level (`aiohttp.ClientError`: refused, reset, an error status
through `raise_for_status`) or times out (REQUEST_TIMEOUT_S) is an error: counted, not timed, and
its client goes on with the next. Anything else `send` raises (an answer of the wrong shape)
stops the run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp

from bench.model_repository import ms, percentile

REQUEST_TIMEOUT_S = 30.0
"""Longer than any answer of a working server; a server that stops answering fails the run's
requests instead of hanging it."""


async def closed_loop(
    send: Callable[[aiohttp.ClientSession], Awaitable[None]],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
) -> dict[str, float]:
    """`throughput_rps` (requests answered in the window per second), `p50_ms` and `p99_ms`
    (their latencies), `requests` (how many) and `errors` (requests that failed in the window).
    RuntimeError when no request was answered in the window."""
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    window_start = start + warmup_s
    window_end = window_start + duration_s

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while (sent := time.perf_counter()) < window_end:
            try:
                await send(session)
            except (aiohttp.ClientError, TimeoutError):
                answered = time.perf_counter()
                if window_start <= answered <= window_end:
                    errors += 1
                continue
            answered = time.perf_counter()
            if window_start <= answered <= window_end:
                latencies.append(answered - sent)

    # One connection per client: a client never has two requests in flight.
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        clients = [asyncio.create_task(client(session)) for _ in range(concurrency)]
        try:
            # Requests still in flight at the window's end would only be waited for to be
            # thrown away: a bounded wait past the end, then they are abandoned. A client that
            # stops on a wrong answer ends the run at once.
            await asyncio.wait(
                clients,
                timeout=window_end - time.perf_counter() + 1.0,
                return_when=asyncio.FIRST_EXCEPTION,
            )
        finally:
            for task in clients:
                task.cancel()
            results = await asyncio.gather(*clients, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result
    if not latencies:
        raise RuntimeError(
            f"no request was answered in the {duration_s} s window ({errors} failed)"
        )
    return {
        "throughput_rps": round(len(latencies) / duration_s, 1),
        "p50_ms": ms(statistics.median(latencies)),
        "p99_ms": ms(percentile(latencies, 0.99)),
        "requests": len(latencies),
        "errors": errors,
    }

"""Resolving receivers' host names on threads of the relay's own.

aiohttp's default resolver calls getaddrinfo on the event loop's default executor, a handful
of threads that the rest of the control plane shares (asyncpg resolves the database's host
there on every new connection). A receiver whose DNS hangs must not hold those up, so webhook
lookups get an executor of their own, as many threads as deliveries may run at once.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from concurrent.futures import ThreadPoolExecutor

from aiohttp.abc import AbstractResolver, ResolveResult

_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


class OwnThreadsResolver(AbstractResolver):
    def __init__(self, threads: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="webhook-dns")

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        lookup = functools.partial(
            socket.getaddrinfo, host, port, family, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG
        )
        infos = await asyncio.get_running_loop().run_in_executor(self._executor, lookup)
        return [
            ResolveResult(
                hostname=host,
                host=str(address[0]),
                port=int(address[1]),
                family=found,
                proto=proto,
                flags=_NUMERIC,
            )
            for found, _, proto, _, address in infos
        ]

    async def close(self) -> None:
        # A lookup still hanging is abandoned, not waited for: its thread ends with the call.
        self._executor.shutdown(wait=False, cancel_futures=True)

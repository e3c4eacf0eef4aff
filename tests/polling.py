"""Waiting in tests for something another task or process makes true."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 20) -> None:
    """Poll `check` until it holds; TimeoutError after `seconds`."""
    async with asyncio.timeout(seconds):
        while True:
            if await check():
                return
            await asyncio.sleep(0.05)

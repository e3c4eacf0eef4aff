"""Fixtures of the control plane's tests beyond the suite's own (tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from controlplane.events.subscription import LogListener


@pytest.fixture
async def listener(db_url: str) -> AsyncIterator[LogListener]:
    """A LogListener on the test's database, listening; its poll interval is far longer than
    the tests wait, so only NOTIFY (or a reconnect, or a wake) wakes its readers."""
    listener = LogListener(db_url, poll_interval=60, retry_interval=0.05)
    task = asyncio.create_task(listener.run())
    await asyncio.wait_for(listener.connected.wait(), 5)
    yield listener
    listener.stop()
    await asyncio.wait_for(task, 5)

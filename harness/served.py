"""`trainyard serve` as a real child process on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

START_S = 20.0
STOP_S = 20.0
READY_PROBE_S = 0.02
"""How often a starting control plane is asked whether it is ready: the resolution of the
recovery benchmark's readiness figures."""


async def until_interrupted() -> None:
    """Return on SIGINT or SIGTERM: what a harness run for a person (`python -m harness.ha`)
    waits for before it stops what it started."""
    print("press Ctrl-C to stop")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports: each probe stays bound until all are picked, or the kernel
    may hand one port out twice."""
    with contextlib.ExitStack() as probes:
        ports = []
        for _ in range(count):
            probe = probes.enter_context(socket.socket())
            probe.bind(("127.0.0.1", 0))
            ports.append(int(probe.getsockname()[1]))
        return ports


class ServedControlPlane:
    """Start, stop and restart a control plane process against one database."""

    def __init__(
        self, database_url: str, home: Path, *, env: Mapping[str, str] | None = None
    ) -> None:
        self.database_url = database_url
        self.home = home
        self.env = dict(env or {})
        """More of the process's environment (settings such as TRAINYARD_MAX_STREAMS)."""
        self.port = free_port()
        self._process: asyncio.subprocess.Process | None = None
        self.spawned_at = 0.0
        """`time.perf_counter()` just before the latest start spawned the process."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str:
        return (self.home / "admin-token").read_text().strip()

    async def start(self) -> None:
        """Spawn the process; return once /readyz says it is ready."""
        env = {
            **os.environ,
            "TRAINYARD_DATABASE_URL": self.database_url,
            "TRAINYARD_HOME": str(self.home),
            **self.env,
        }
        self.spawned_at = time.perf_counter()
        self._process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "cli", "serve", "--port", str(self.port)),
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
        )
        async with aiohttp.ClientSession() as session, asyncio.timeout(START_S):
            while True:
                if self._process.returncode is not None:
                    raise RuntimeError(f"the control plane exited with {self._process.returncode}")
                try:
                    async with session.get(self.url + "/readyz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    pass  # not listening yet
                await asyncio.sleep(READY_PROBE_S)

    @property
    def pid(self) -> int:
        """The process's id (the latest started)."""
        assert self._process is not None
        return self._process.pid

    async def stop(self) -> int:
        """SIGTERM, as a service manager would; returns the exit code."""
        assert self._process is not None
        if self._process.returncode is not None:
            return self._process.returncode  # killed, or it stopped by itself
        self._process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self._process.wait(), STOP_S)

    async def kill(self) -> None:
        """kill -9: a crash, with no clean shutdown (its sessions, and the manager lock held
        by one of them, end when Postgres sees the connections close)."""
        assert self._process is not None
        self._process.kill()
        await self._process.wait()


async def until_registered(agent: asyncio.Task[None], registered: asyncio.Event) -> None:
    """Once an in-process agent (`run_agent`) has registered its node; what stopped it if it
    stopped first."""
    waiting = asyncio.ensure_future(registered.wait())
    done, _ = await asyncio.wait({agent, waiting}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if agent in done:
        agent.result()
        raise RuntimeError("the agent stopped before it registered")
    if not done:
        raise TimeoutError("the agent did not register within 30s")

"""`trainyard agent` as a real child process (fake GPUs), to kill -9 and
restart: a crash leaves its learners running, and the restarted agent (same work directory,
so same identity) takes its lease back at once and re-adopts them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import asyncpg

from controlplane.agents.events import NodeRegistered
from controlplane.agents.nodes import node_stream
from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.store import EventStore
from controlplane.settings import ARTIFACTS_DIR_ENV
from harness.agent_login import agent_login_url

REGISTER_S = 30.0
PROBE_S = 0.02


class AgentProcess:
    def __init__(
        self,
        url: str,
        work_dir: Path,
        name: str = "n1",
        *,
        ttl_s: float = 5,
        heartbeat_s: float = 0.5,
        checkpoint_dir: Path | None = None,
        runtime: str = "process",
        artifacts_dir: Path | None = None,
        log: Path | None = None,
        fake_gpus: int = 1,
        prefix: tuple[str, ...] = (),
        options: tuple[str, ...] = (),
    ) -> None:
        self.url = url
        self.prefix = prefix
        """What it runs under (`nsenter --net=...`: a node's network namespace), which must exec
        it (its pid is the agent's)."""
        self.options = options
        """More of `trainyard agent`'s options (`--node-address`, `--cpus`, ...)."""
        self.fake_gpus = fake_gpus
        self.log = log
        """Where its output goes (appended, across restarts); None: nowhere."""
        self.artifacts_dir = artifacts_dir
        """The model repository's folder, shared with the control plane (replicas load from
        it); None: the agent's default."""
        self.work_dir = work_dir
        self.name = name
        self.ttl_s = ttl_s
        self.heartbeat_s = heartbeat_s
        self.checkpoint_dir = checkpoint_dir
        self.runtime = runtime
        """Always given, never left to whether an engine answers: each runtime finds its
        learners its own way."""
        self.login_url: str | None = None
        """The agent login's URL it runs with (harness/agent_login.py), once started."""
        self.process: asyncio.subprocess.Process | None = None
        self.spawned_at = 0.0
        """`time.perf_counter()` just before the latest start spawned the process."""

    async def start(self, pool: asyncpg.Pool) -> AgentProcess:
        """Start it; return once it has registered its node (it reconciles and claims next)."""
        store = EventStore(pool, EVENT_REGISTRY)
        before = await _registrations(store, self.name)
        options = ["--name", self.name, "--fake-gpus", str(self.fake_gpus)]
        options += ["--work-dir", str(self.work_dir)]
        options += ["--heartbeat", str(self.heartbeat_s), "--ttl", str(self.ttl_s)]
        options += ["--grace", "2", "--runtime", self.runtime]
        if self.checkpoint_dir is not None:
            options += ["--checkpoint-dir", str(self.checkpoint_dir)]
        options += self.options
        # Once: a restart after a kill should cost only the agent's own start.
        self.login_url = self.login_url or await agent_login_url(self.url, self.name)
        self.spawned_at = time.perf_counter()
        with contextlib.ExitStack() as files:
            output = (
                files.enter_context(self.log.open("ab"))
                if self.log is not None
                else asyncio.subprocess.DEVNULL
            )
            self.process = await asyncio.create_subprocess_exec(
                *(*self.prefix, sys.executable, "-m", "cli", "agent", *options),
                env={**os.environ, "TRAINYARD_DATABASE_URL": self.login_url, **self._artifacts()},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=output,
            )
        async with asyncio.timeout(REGISTER_S):
            while await _registrations(store, self.name) == before:
                if self.process.returncode is not None:
                    raise RuntimeError(f"the agent exited with {self.process.returncode}")
                await asyncio.sleep(PROBE_S)
        return self

    def _artifacts(self) -> dict[str, str]:
        if self.artifacts_dir is None:
            return {}
        return {ARTIFACTS_DIR_ENV: str(self.artifacts_dir)}

    async def kill(self) -> None:
        """kill -9: no clean shutdown, its learners left running."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()


async def _registrations(store: EventStore, node: str) -> int:
    history = await store.read_stream(node_stream(node))
    return sum(isinstance(e.event, NodeRegistered) for e in history)

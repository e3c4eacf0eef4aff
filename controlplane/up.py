"""`trainyard up`: everything on one machine — the database, the control plane, one local
agent with the process runtime — and a demo job whose status and logs stream to the terminal."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from controlplane.artifacts.filesystem import default_root
from controlplane.demo import demo_token, run_demo
from controlplane.http.keys import PROJECTIONS, STORE
from controlplane.jobs.locations import Roots
from controlplane.migrate import migrate
from controlplane.server import allowed_images, listening, signalled
from controlplane.settings import Settings
from node_agent.agent import AgentConfig
from node_agent.cli import reach_problem, runs_tenants_code
from node_agent.service import run_agent
from node_agent.users import UidRange

AGENT_NAME = "local"


def local_agent(home: Path) -> AgentConfig:
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    return AgentConfig(
        name=AGENT_NAME,
        work_dir=home / "agents" / AGENT_NAME,
        cpus=float(os.cpu_count() or 1),
        memory_mb=memory_mb,
        launcher=(sys.executable, "-m", "runners.launch"),
        roots=Roots.from_env(),
        learner_uids=UidRange.from_env(),
        artifacts_dir=default_root(Settings.from_env()),
    )


async def up(
    url: str,
    home: Path,
    *,
    host: str,
    port: int,
    fake_gpus: int | None,
    demo: bool,
    stay: bool,
    log_retention_s: float,
) -> str | None:
    """Run until SIGINT/SIGTERM (or, unless `stay`, until the demo job ends); returns the demo
    job's final state. `log_retention_s`: how long after a job ended its log lines go (0: never).
    """
    images = allowed_images()
    config = local_agent(home)
    problem = reach_problem(config)
    if problem is not None:
        print(f"trainyard up: error: {problem} (TRAINYARD_HOME)", file=sys.stderr)
        return "FAILED"
    applied = await migrate(url)
    if applied:
        print(f"applied {len(applied)} migration(s)")
    async with listening(url, host, port, home, images, log_retention_s) as app:
        stop = signalled()
        registered = asyncio.Event()
        agent = asyncio.create_task(
            run_agent(url, config, fake_gpus=fake_gpus, stop=stop, registered=registered)
        )
        await _first(agent, registered)
        who = runs_tenants_code("process", root=os.geteuid() == 0, uids=config.learner_uids)
        print(f"agent {AGENT_NAME!r}: {who}")
        state = None
        if demo:
            token = await demo_token(app[STORE], app[PROJECTIONS], home)
            following = asyncio.create_task(run_demo(f"http://{host}:{port}", token))
            await _first(following, stop)
            if following.done():
                state = following.result()
                print(f"demo job ended: {state}")
            else:
                following.cancel()
        if stay:
            print("press Ctrl-C to stop")
            await _first(agent, stop)
        stop.set()
        await agent
    return state


async def _first(task: asyncio.Task[object] | asyncio.Task[None], event: asyncio.Event) -> None:
    """Wait for `event`, or for `task` to end (re-raising what ended it)."""
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if task.done():
        task.result()

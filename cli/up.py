"""`trainyard up`: everything on one machine — the database, the control plane, one local
agent with the process runtime — and a demo job whose status and logs stream to the terminal."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from cli.demo import demo_token, run_demo
from controlplane import telemetry
from controlplane.artifacts.filesystem import default_root
from controlplane.commands import database, listen_args, log_retention_arg
from controlplane.failures import EXIT_FAILED
from controlplane.http.keys import PROJECTIONS, STORE
from controlplane.jobs.locations import Roots
from controlplane.migrate import migrate
from controlplane.server import allowed_images, listening, log_retention_s, signalled
from controlplane.settings import Settings
from node_agent.agent import AgentConfig
from node_agent.cli import reach_problem, runs_tenants_code
from node_agent.service import run_agent
from node_agent.users import UidRange

AGENT_NAME = "local"


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add `up` to the top-level subcommands."""
    local = commands.add_parser(
        "up",
        help="run everything on this machine, with a demo job",
        description="Start the embedded Postgres (unless TRAINYARD_DATABASE_URL is set), apply "
        "migrations, run the control plane and one local agent (process runtime), submit a "
        "small PyTorch demo job as tenant 'demo' and stream its status and logs; then keep "
        "running until interrupted.",
    )
    listen_args(local)
    log_retention_arg(local)
    local.add_argument(
        "--fake-gpus", type=int, metavar="N", help="the local agent offers N fake GPUs"
    )
    local.add_argument("--no-demo", action="store_true", help="do not submit the demo job")
    local.add_argument(
        "--exit-after-demo",
        action="store_true",
        help="stop once the demo job has ended (exit code 1 if it did not complete)",
    )
    local.set_defaults(handler=cmd_up)


async def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    telemetry.setup("trainyard")
    # Before the database: a malformed setting is reported at once, whatever else is wrong.
    retention_s = log_retention_s(args.log_retention_days)
    url = await database(settings)
    state = await up(
        url,
        settings.home,
        host=args.host,
        port=args.port,
        fake_gpus=args.fake_gpus,
        demo=not args.no_demo,
        stay=not args.exit_after_demo,
        log_retention_s=retention_s,
    )
    return EXIT_FAILED if state in ("FAILED", "CANCELLED") else 0


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

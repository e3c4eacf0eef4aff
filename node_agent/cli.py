"""`trainyard agent`: run a node agent until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from controlplane.database import resolve_database
from controlplane.migrate import require_migrated
from controlplane.settings import Settings
from node_agent.agent import AgentConfig
from node_agent.service import run_agent

log = logging.getLogger("node_agent")


def machine_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = commands.add_parser(
        "agent",
        help="run a node agent: register this machine's GPUs and run the jobs it claims",
        description="Register this node (its GPUs from NVML, or --fake-gpus), renew its lease by "
        "heartbeat, claim queued jobs that fit, run their learners and stream their logs, "
        "until SIGINT or SIGTERM; then stop the learners (they checkpoint), re-queue their "
        "jobs and deregister.",
    )
    agent.add_argument("--name", default=socket.gethostname(), help="node name (default: host)")
    agent.add_argument(
        "--runtime",
        choices=["process"],
        default="process",
        help="how learners run: child processes (the image is not used)",
    )
    agent.add_argument(
        "--fake-gpus", type=int, metavar="N", help="offer N fake GPUs (machines without GPUs)"
    )
    agent.add_argument(
        "--cpus", type=float, default=float(os.cpu_count() or 1), help="CPUs to offer"
    )
    agent.add_argument(
        "--memory-mb", type=int, default=machine_memory_mb(), help="memory to offer, in MiB"
    )
    agent.add_argument(
        "--work-dir",
        type=Path,
        help="learners' working, checkpoint and results directories "
        "(default: $TRAINYARD_HOME/agents/NAME)",
    )
    agent.add_argument("--heartbeat", type=float, default=2.0, help="seconds between heartbeats")
    agent.add_argument("--ttl", type=float, default=10.0, help="lease time to live, in seconds")
    agent.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL"
    )
    agent.set_defaults(handler=cmd_agent)


def config_from(args: argparse.Namespace, settings: Settings) -> AgentConfig:
    if args.fake_gpus is not None and args.fake_gpus < 0:
        raise SystemExit("trainyard agent: error: --fake-gpus must be >= 0")
    if args.ttl <= args.heartbeat:
        raise SystemExit("trainyard agent: error: --ttl must be longer than --heartbeat")
    return AgentConfig(
        name=args.name,
        work_dir=args.work_dir or settings.home / "agents" / args.name,
        cpus=args.cpus,
        memory_mb=args.memory_mb,
        launcher=(sys.executable, "-m", "runners.launch"),
        heartbeat_s=args.heartbeat,
        ttl_s=args.ttl,
        grace_s=args.grace,
    )


async def cmd_agent(args: argparse.Namespace, settings: Settings) -> int:
    config = config_from(args, settings)
    url = await resolve_database(settings)
    await require_migrated(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # A name held by a live agent (NodeNameTaken) is reported by `main`, exit code 1.
    await run_agent(url, config, fake_gpus=args.fake_gpus, stop=stop)
    return 0

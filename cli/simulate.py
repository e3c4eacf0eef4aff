"""`trainyard simulate`: the scheduling simulator (sim/) replaying the recorded log, which it
reads from the database through `sim.log`."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from controlplane.commands import database
from controlplane.database import create_pool
from controlplane.failures import EXIT_USAGE
from controlplane.heap import freeze_startup_heap
from controlplane.migrate import require_migrated
from controlplane.scheduling.policy import PolicyError
from controlplane.settings import Settings
from sim.engine import simulate
from sim.log import read_workload
from sim.policy import named, parse_weight, read_policy_file
from sim.report import as_table, dumps, report


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add `simulate` to the top-level subcommands."""
    simulation = commands.add_parser(
        "simulate",
        help="replay the recorded past under a scheduling policy (operator)",
        description="Replay the jobs submitted in a time range (their submissions, "
        "cancellations and recorded run times, with the nodes joining and leaving as they "
        "did) through a scheduling policy in virtual time, and compare it with what really "
        "happened: each tenant's wait p50/p95, GPU utilization, Jain's fairness index, "
        "makespan, start order agreement and start time error. Reads the event log in a READ "
        "ONLY transaction; writes nothing. The same log and policy give the same output.",
    )
    simulation.add_argument(
        "--since",
        type=_instant,
        metavar="TIME",
        help="the jobs submitted from this instant (ISO 8601 with an offset; default: the first)",
    )
    simulation.add_argument(
        "--until",
        type=_instant,
        metavar="TIME",
        help="... until this instant, not included (default: the log's end)",
    )
    policies = simulation.add_mutually_exclusive_group()
    policies.add_argument(
        "--policy",
        default="current",
        metavar="NAME",
        help="current (the claim policy in force, as `trainyard scheduling policy` shows it), "
        "fair_share (the tenant holding the fewest GPUs for its weight first, then priority, "
        "then submission order), priority (priority, then submission order; no fair share) or "
        "fifo, the last three within quotas (default: current)",
    )
    policies.add_argument(
        "--policy-file",
        type=Path,
        metavar="FILE",
        help='a policy in JSON or YAML: {"order": "fair_share|priority|fifo", "weights": '
        '{"TENANT": W}, "quotas": true|false}; without weights, what `trainyard scheduling '
        "set-policy FILE` switches to",
    )
    simulation.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="TENANT=W",
        help="replay fair share with this tenant's weight instead of its recorded one (repeatable)",
    )
    simulation.add_argument("--json", action="store_true", help="print the report as JSON")
    simulation.set_defaults(handler=cmd_simulate)


def _instant(text: str) -> datetime:
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 instant") from None
    if instant.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset (add Z or +HH:MM)")
    return instant


async def cmd_simulate(args: argparse.Namespace, settings: Settings) -> int:
    try:
        weights = dict(parse_weight(text) for text in args.weight)
        if args.policy_file is None:
            policy = named(args.policy, weights)  # `current` is known once the log is read
        elif weights:
            raise PolicyError("--weight: give the weights in the policy file")
        else:
            policy = read_policy_file(args.policy_file)
    except PolicyError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.since is not None and args.until is not None and args.until <= args.since:
        print("trainyard: --until must come after --since", file=sys.stderr)
        return EXIT_USAGE
    url = await database(settings)
    await require_migrated(url)
    pool = await create_pool(url, min_size=1, max_size=1)
    try:
        workload = await read_workload(pool, args.since, args.until)
    finally:
        await pool.close()
    if args.policy_file is None:
        try:
            policy = named(args.policy, weights, workload.policy)
        except PolicyError as exc:
            print(f"trainyard: {exc}", file=sys.stderr)
            return EXIT_USAGE
    # The past lives as long as the command: out of the collector's walk while it is replayed.
    freeze_startup_heap()
    replayed = report(workload, policy, simulate(workload, policy))
    print(dumps(replayed) if args.json else as_table(replayed))
    return 0

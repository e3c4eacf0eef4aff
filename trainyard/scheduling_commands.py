"""`trainyard scheduling …`: the claim policy, over the HTTP API (`/v1/scheduling/policy`):
show the one in force, and (the admin) switch to the one a policy file states.

A policy file is the one `trainyard simulate --policy-file` replays (JSON or YAML): `order`
(fair_share, priority or fifo) and `quotas` (true or false). So the workflow is: simulate the
recorded past under a policy, compare, then `set-policy` the same file. A file that cannot be
read or states no valid policy is refused before anything is sent (exit code 2, the line or the
field named); the server refuses what is not the admin's (exit code 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from controlplane.scheduling.policy import PolicyError, read_policy
from controlplane.settings import Settings
from trainyard.api import UsageError
from trainyard.client import AsyncClient
from trainyard.commands import output_options, print_json, target_options
from trainyard.config import TOKEN_ENV, resolve


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the `scheduling` command group to the top-level subcommands."""
    scheduling = commands.add_parser(
        "scheduling",
        help="show or switch the claim policy: fair share, priority or fifo (admin)",
        description="The claim policy is the order claims take queued jobs in (fair_share, "
        "priority or fifo) and whether tenants' GPU quotas hold. `trainyard simulate "
        "--policy-file FILE` replays the recorded past under the policy FILE states; "
        "`set-policy FILE` then switches to it.",
    )
    group = scheduling.add_subparsers(title="commands", required=True, metavar="COMMAND")
    target = target_options(
        f"a file holding the token, - for standard input (else ${TOKEN_ENV}, else "
        "$TRAINYARD_HOME/admin-token, else login's)"
    )
    show = group.add_parser(
        "policy",
        help="show the claim policy in force",
        description="Show the claim policy in force: its order, whether quotas hold, and who "
        "set it when (nobody: the default, fair share within quotas). Any token may read it.",
        parents=[target, output_options()],
    )
    show.set_defaults(handler=cmd_policy)
    switch = group.add_parser(
        "set-policy",
        help="switch the claim policy to the one FILE states (admin)",
        description="Switch the claim policy to the one FILE states (JSON or YAML: `order: "
        "fair_share|priority|fifo`, `quotas: true|false`), the file `trainyard simulate "
        "--policy-file` replays: claims follow it from the next claim on, and the switch is "
        "recorded (who, when, --reason; audit.actions). Setting the policy in force changes "
        "nothing. A bad file changes nothing either: exit code 2, naming the line or field.",
        parents=[target, output_options()],
    )
    switch.add_argument("file", type=Path, metavar="FILE", help="the policy (JSON or YAML)")
    switch.add_argument("--reason", help="why (recorded with the switch)")
    switch.set_defaults(handler=cmd_set_policy)


def _client(args: argparse.Namespace, settings: Settings) -> AsyncClient:
    target = resolve(args.server, args.token_file, settings.home, admin=True)
    return AsyncClient(target.server, target.token)


def describe(policy: dict[str, Any]) -> str:
    """The policy in a few lines, as `scheduling policy` prints it."""
    quotas = "hold" if policy["quotas"] else "off (only room limits a tenant)"
    if policy.get("set_by") is None:
        who = "nobody: the default holds"
    else:
        who = f"{policy['set_by']} at {policy['set_at']}"
        if policy.get("reason"):
            who += f" ({policy['reason']})"
    return f"order   {policy['order']}\nquotas  {quotas}\nset by  {who}"


async def cmd_policy(args: argparse.Namespace, settings: Settings) -> int:
    async with _client(args, settings) as client:
        policy = await client.scheduling_policy()
    if args.output == "json":
        print_json(policy)
    else:
        print(describe(policy))
    return 0


async def cmd_set_policy(args: argparse.Namespace, settings: Settings) -> int:
    try:
        wanted = read_policy(args.file)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None
    async with _client(args, settings) as client:
        policy = await client.set_scheduling_policy(
            str(wanted.order), quotas=wanted.quotas, reason=args.reason
        )
    if args.output == "json":
        print_json(policy)
    else:
        print(describe(policy))
    if not policy.get("changed"):
        print("that policy was in force already: nothing changed", file=sys.stderr)
    else:
        print(f"claims follow {wanted.describe()} from the next claim on", file=sys.stderr)
    return 0

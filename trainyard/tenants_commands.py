"""`trainyard tenants …`: the admin's commands, over the HTTP API (`/v1/tenants`): create
tenants, list them, change their weight, GPU quota and limits, issue and revoke their tokens.

The server comes from --server, $TRAINYARD_SERVER or `trainyard login`; the token from the file
named by --token-file, $TRAINYARD_TOKEN, the admin token file the control plane writes on its
first start ($TRAINYARD_HOME/admin-token, on its machine) or `trainyard login`. A new token is
printed once, alone on stdout (so `TOKEN=$(trainyard tenants create acme)` works); what happened
is said on stderr. Errors reach the front door (`cli.main`): 2 for a usage error or a refused value,
3 for a server that cannot be reached, 4 for an unknown tenant or token, 1 for other refusals.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from controlplane.settings import Settings
from controlplane.tenants.errors import InvalidTenant
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.validation import check_gpu_quota, check_name, check_weight
from trainyard.api import ApiClient, UsageError
from trainyard.commands import output_options, target_options
from trainyard.config import TOKEN_ENV, resolve
from trainyard.render import table

T = TypeVar("T")


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the `tenants` command group to the top-level subcommands."""
    tenants = commands.add_parser(
        "tenants",
        help="create tenants, set their shares, manage their bearer tokens (admin)",
        description="Tenants submit and see only their own jobs, authenticated by bearer "
        "tokens; a token is printed once and stored only as its sha256. These commands need "
        "the admin token: --token-file, $TRAINYARD_TOKEN, $TRAINYARD_HOME/admin-token (on the "
        "control plane's machine) or login's.",
    )
    group = tenants.add_subparsers(title="commands", required=True, metavar="COMMAND")
    target = target_options(
        f"a file holding the admin token, - for standard input (else ${TOKEN_ENV}, else "
        "$TRAINYARD_HOME/admin-token, else login's)"
    )

    def add(name: str, summary: str, description: str, *parents: Any) -> Any:
        return group.add_parser(
            name, help=summary, description=description, parents=[target, *parents]
        )

    create = add(
        "create",
        "create a tenant and print its first token",
        "Create a tenant and print its first bearer token, once, on stdout.",
    )
    create.add_argument(
        "name", type=_name, metavar="NAME", help="lowercase letters, digits and '-' (max 63)"
    )
    _share_options(create, creating=True)
    create.set_defaults(handler=cmd_create)

    listing = add(
        "list",
        "list tenants with their weights, quotas and active token ids",
        "List every tenant: weight, GPU quota, creation time and the ids of its active tokens.",
        output_options(),
    )
    listing.set_defaults(handler=cmd_list)

    change = add(
        "set",
        "change a tenant's weight or GPU quota",
        "Change a tenant's weight, GPU quota or both; claims use them at once.",
    )
    change.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    _share_options(change, creating=False)
    change.add_argument("--no-gpu-quota", action="store_true", help="remove the tenant's GPU quota")
    change.set_defaults(handler=cmd_set)

    limits = add(
        "limits",
        "show or change a tenant's limits",
        "Show a tenant's limits; with options, change those named (the others stay). "
        "Submissions and streams use them at once; a job keeps the log and report limits it "
        "was submitted with. The defaults are in docs/user-guide.md, section Limits.",
        output_options(),
    )
    limits.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    for limit, (metavar, help_text) in _LIMIT_OPTIONS.items():
        limits.add_argument(
            "--" + limit.replace("_", "-"),
            dest=limit,
            type=_limit(limit),
            metavar=metavar,
            help=help_text,
        )
    limits.set_defaults(handler=cmd_limits)

    token = add(
        "token",
        "issue a new token for a tenant",
        "Issue a new bearer token for a tenant and print it once on stdout; with "
        "--revoke-others, revoke all its other tokens in the same step (rotation).",
    )
    token.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    token.add_argument(
        "--revoke-others", action="store_true", help="revoke every other token of the tenant"
    )
    token.set_defaults(handler=cmd_token)

    revoke = add(
        "revoke",
        "revoke one token of a tenant",
        "Revoke one of a tenant's tokens by its id (see `tenants list`); requests with it are "
        "refused with 401 from then on.",
    )
    revoke.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    revoke.add_argument(
        "token_id", metavar="TOKEN_ID", help="the token's id (not the token itself)"
    )
    revoke.set_defaults(handler=cmd_revoke)

    secret = add(
        "webhook-secret",
        "issue a new webhook signing secret for a tenant",
        "Issue a new secret that signs the tenant's webhook deliveries and print it on stdout. "
        "The secret it replaces keeps signing them too for 24 hours, so that receivers can "
        "switch. The tenant reads its secrets with GET /v1/webhook-secret.",
    )
    secret.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    secret.set_defaults(handler=cmd_webhook_secret)


def _share_options(command: argparse.ArgumentParser, *, creating: bool) -> None:
    command.add_argument(
        "--weight",
        type=_weight,
        default=1.0 if creating else None,
        metavar="W",
        help="share of the cluster relative to other tenants (a positive number"
        + ("; default 1)" if creating else ")"),
    )
    command.add_argument(
        "--gpu-quota",
        type=_gpu_quota,
        metavar="N",
        help="most GPUs the tenant may hold at once" + (" (default: no quota)" if creating else ""),
    )


def _client(args: argparse.Namespace, settings: Settings) -> ApiClient:
    target = resolve(args.server, args.token_file, settings.home, admin=True)
    return ApiClient(target.server, target.token)


async def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    body = {"name": args.name, "weight": args.weight, "gpu_quota": args.gpu_quota}
    async with _client(args, settings) as client:
        created = await client.request("POST", "/v1/tenants", body=body)
    print(created["token"])
    print(
        f"created tenant {args.name}; token {created['token_id']} is shown only this once",
        file=sys.stderr,
    )
    return 0


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    async with _client(args, settings) as client:
        tenants = (await client.request("GET", "/v1/tenants"))["tenants"]
    if args.output == "json":
        print(json.dumps(tenants, indent=2))
        return 0
    rows = [
        (t["name"], f"{t['weight']:g}", t["gpu_quota"], t["created_at"], t["active_tokens"])
        for t in tenants
    ]
    print(table(["NAME", "WEIGHT", "GPU QUOTA", "CREATED", "ACTIVE TOKENS"], rows))
    return 0


async def cmd_set(args: argparse.Namespace, settings: Settings) -> int:
    if args.no_gpu_quota and args.gpu_quota is not None:
        raise UsageError("give --gpu-quota N or --no-gpu-quota, not both")
    body: dict[str, Any] = {}
    if args.weight is not None:
        body["weight"] = args.weight
    if args.gpu_quota is not None or args.no_gpu_quota:
        body["gpu_quota"] = args.gpu_quota
    if not body:
        raise UsageError("nothing to change: give --weight, --gpu-quota or --no-gpu-quota")
    async with _client(args, settings) as client:
        tenant = await client.request("PATCH", f"/v1/tenants/{args.name}", body=body)
    quota = "none" if tenant["gpu_quota"] is None else tenant["gpu_quota"]
    print(f"tenant {tenant['name']}: weight {tenant['weight']:g}, GPU quota {quota}")
    return 0


_LIMIT_OPTIONS = {
    "streams": ("N", "live SSE streams (job events, log follows) at once"),
    "submissions_per_s": ("R", "job submissions per second, sustained"),
    "submission_burst": ("N", "submissions accepted at once before the rate applies"),
    "queued_jobs": ("N", "jobs QUEUED (accepted, not yet running) at once"),
    "cpus": ("N", "CPUs the live jobs (replicas included) ask for in all"),
    "memory_mb": ("MIB", "memory the live jobs (replicas included) ask for in all"),
    "deployments": ("N", "deployments (not deleted)"),
    "replicas": ("N", "replicas the deployments ask for in all"),
    "searches": ("N", "searches running at once"),
    "queued_predictions": ("N", "prediction items waiting or running at once"),
    "artifact_bytes": ("N", "bytes of model artifacts in all"),
    "log_lines": ("N", "log lines one job may store (jobs submitted from now on)"),
    "log_bytes": ("N", "bytes of log text one job may store (jobs submitted from now on)"),
    "reports_per_s": ("R", "checkpoint reports per second a job's learners may record"),
}
"""The `tenants limits` options, one per field of TenantLimits, which checks their values."""


async def cmd_limits(args: argparse.Namespace, settings: Settings) -> int:
    changes = {name: getattr(args, name) for name in _LIMIT_OPTIONS}
    body = {name: value for name, value in changes.items() if value is not None}
    async with _client(args, settings) as client:
        path = f"/v1/tenants/{args.name}/limits"
        if body:
            limits = await client.request("PUT", path, body=body)
        else:
            limits = await client.request("GET", path, not_found=f"no tenant named {args.name!r}")
    if args.output == "json":
        print(json.dumps(limits, indent=2))
        return 0
    print(
        table(
            ["LIMIT", "VALUE"],
            [
                (name, f"{value:g}" if isinstance(value, float) else str(value))
                for name, value in limits.items()
            ],
        )
    )
    return 0


async def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    body = {"revoke_others": args.revoke_others}
    async with _client(args, settings) as client:
        token = await client.request("POST", f"/v1/tenants/{args.name}/tokens", body=body)
    print(token["token"])
    others = "; every other token of it is revoked" if args.revoke_others else ""
    print(
        f"issued token {token['token_id']} for tenant {args.name}, shown only this once{others}",
        file=sys.stderr,
    )
    return 0


async def cmd_revoke(args: argparse.Namespace, settings: Settings) -> int:
    async with _client(args, settings) as client:
        await client.request("DELETE", f"/v1/tenants/{args.name}/tokens/{args.token_id}")
    print(f"revoked token {args.token_id} of tenant {args.name}")
    return 0


async def cmd_webhook_secret(args: argparse.Namespace, settings: Settings) -> int:
    async with _client(args, settings) as client:
        # Tenant names are lowercase letters, digits and '-': safe in a query as they are.
        issued = await client.request("POST", f"/v1/webhook-secret?tenant={args.name}")
    print(issued["secret"])
    until = issued["previous_valid_until"]
    previous = f"; the previous one signs deliveries too until {until}" if until else ""
    print(
        f"issued webhook secret {issued['id']} for tenant {args.name}{previous}",
        file=sys.stderr,
    )
    return 0


def _name(text: str) -> str:
    return _usage(check_name, text)


def _weight(text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid weight {text!r}: it must be a positive number"
        ) from None
    return _usage(check_weight, weight)


def _gpu_quota(text: str) -> int:
    try:
        quota = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid GPU quota {text!r}: it must be a whole number, 0 or more"
        ) from None
    return _usage(check_gpu_quota, quota)


def _limit(name: str) -> Callable[[str], float | int]:
    """An argparse type for one limit: a number that TenantLimits accepts for it."""
    number = int if TenantLimits.model_fields[name].annotation is int else float

    def parse(text: str) -> float | int:
        try:
            value = number(text)
            TenantLimits.model_validate({name: value})
        except ValueError as exc:  # pydantic's ValidationError is a ValueError too
            kind = "a whole number" if number is int else "a number"
            raise argparse.ArgumentTypeError(
                f"invalid {name} {text!r}: it must be {kind} in range ({_problem(exc)})"
            ) from None
        return value

    return parse


def _problem(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return str(exc.errors()[0]["msg"])
    return "not a number"


def _usage(check: Callable[[T], object], value: T) -> T:
    """Run a check as an argparse type: its message becomes argparse's usage error (exit 2)."""
    try:
        check(value)
    except InvalidTenant as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value

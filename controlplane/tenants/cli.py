"""`trainyard tenants …`: create tenants, list them, issue and revoke their tokens.

A token is printed once, alone on stdout (so `TOKEN=$(trainyard tenants create acme)` works);
what happened is said on stderr. Exit codes as everywhere: 2 for a usage error, 1 for a command
that failed, 3 for a database that cannot be reached (raised to `controlplane.cli.main`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from controlplane.database import create_pool, resolve_database
from controlplane.events.store import EventStore
from controlplane.events.subscription import LogListener
from controlplane.migrate import require_migrated
from controlplane.projections.runner import ProjectionRunner
from controlplane.settings import Settings
from controlplane.tenants.errors import InvalidTenant, TenantError
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import (
    create_tenant,
    issue_token,
    list_tenants,
    project_now,
    revoke_token,
)
from controlplane.tenants.validation import check_gpu_quota, check_name, check_weight
from controlplane.webhooks.tenant_secrets import rotate

# The same codes as `controlplane.cli`, which imports this module and so cannot be imported here.
EXIT_FAILED = 1
EXIT_USAGE = 2

ACTOR = "operator:cli"
"""The actor recorded in the events of these commands: whoever can reach the database."""

T = TypeVar("T")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `tenants` command group to the top-level subcommands."""
    tenants = commands.add_parser(
        "tenants",
        help="create tenants and manage their bearer tokens",
        description="Tenants submit and see only their own jobs, authenticated by bearer "
        "tokens. A token is printed once and stored only as its sha256.",
    )
    group = tenants.add_subparsers(title="commands", required=True, metavar="COMMAND")

    create = group.add_parser(
        "create",
        help="create a tenant and print its first token",
        description="Create a tenant and print its first bearer token, once, on stdout.",
    )
    create.add_argument(
        "name", type=_name, metavar="NAME", help="lowercase letters, digits and '-' (max 63)"
    )
    create.add_argument(
        "--weight",
        type=_weight,
        default=1.0,
        metavar="W",
        help="share of the cluster relative to other tenants (a positive number; default 1)",
    )
    create.add_argument(
        "--gpu-quota",
        type=_gpu_quota,
        default=None,
        metavar="N",
        help="most GPUs the tenant may hold at once (default: no quota)",
    )
    create.set_defaults(handler=cmd_create)

    listing = group.add_parser(
        "list",
        help="list tenants with their weights, quotas and active token ids",
        description="List every tenant: weight, GPU quota, creation time and the ids of its "
        "active tokens (tab-separated, one line per tenant, after a header line).",
    )
    listing.set_defaults(handler=cmd_list)

    token = group.add_parser(
        "token",
        help="issue a new token for a tenant",
        description="Issue a new bearer token for a tenant and print it once on stdout; with "
        "--revoke-others, revoke all its other tokens in the same step (rotation).",
    )
    token.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    token.add_argument(
        "--revoke-others", action="store_true", help="revoke every other token of the tenant"
    )
    token.set_defaults(handler=cmd_token)

    revoke = group.add_parser(
        "revoke",
        help="revoke one token of a tenant",
        description="Revoke one of a tenant's tokens by its id (see `tenants list`); "
        "requests with it are refused with 401 from then on.",
    )
    revoke.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    revoke.add_argument(
        "token_id", metavar="TOKEN_ID", help="the token's id (not the token itself)"
    )
    revoke.set_defaults(handler=cmd_revoke)

    secret = group.add_parser(
        "webhook-secret",
        help="issue a new webhook signing secret for a tenant",
        description="Issue a new secret that signs the tenant's webhook deliveries and print "
        "it on stdout. The secret it replaces keeps signing them too for 24 hours, so that "
        "receivers can switch. The tenant reads its secrets with GET /v1/webhook-secret.",
    )
    secret.add_argument("name", type=_name, metavar="NAME", help="the tenant")
    secret.set_defaults(handler=cmd_webhook_secret)


async def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    async with _session(settings) as session:
        try:
            token = await create_tenant(
                session.store,
                session.runner,
                args.name,
                args.weight,
                args.gpu_quota,
                actor=ACTOR,
            )
        except TenantError as exc:
            return _failed(exc)
    print(token.plaintext)
    print(
        f"created tenant {args.name}; token {token.token_id} is shown only this once",
        file=sys.stderr,
    )
    return 0


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    async with _session(settings) as session:
        await project_now(session.runner, await session.store.log_tail())
        tenants = await list_tenants(session.pool)
    print("NAME\tWEIGHT\tGPU_QUOTA\tCREATED\tACTIVE_TOKENS")
    for t in tenants:
        quota = "-" if t.gpu_quota is None else str(t.gpu_quota)
        tokens = ",".join(t.active_tokens) or "-"
        print(f"{t.name}\t{t.weight:g}\t{quota}\t{t.created_at.isoformat()}\t{tokens}")
    return 0


async def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    async with _session(settings) as session:
        try:
            token = await issue_token(
                session.store,
                session.runner,
                args.name,
                revoke_others=args.revoke_others,
                actor=ACTOR,
            )
        except TenantError as exc:
            return _failed(exc)
    print(token.plaintext)
    others = "; every other token of it is revoked" if args.revoke_others else ""
    print(
        f"issued token {token.token_id} for tenant {args.name}, shown only this once{others}",
        file=sys.stderr,
    )
    return 0


async def cmd_revoke(args: argparse.Namespace, settings: Settings) -> int:
    async with _session(settings) as session:
        try:
            await revoke_token(session.store, session.runner, args.name, args.token_id, actor=ACTOR)
        except TenantError as exc:
            return _failed(exc)
    print(f"revoked token {args.token_id} of tenant {args.name}")
    return 0


async def cmd_webhook_secret(args: argparse.Namespace, settings: Settings) -> int:
    async with _session(settings) as session:
        try:
            issued = await rotate(session.pool, session.store, args.name, actor=ACTOR)
        except TenantError as exc:
            return _failed(exc)
    assert issued is not None  # only `unless_present` rotations may issue nothing
    print(issued.secret)
    until = issued.previous_valid_until
    previous = (
        f"; the previous one signs deliveries too until {until:%Y-%m-%d %H:%M:%S%z}"
        if until
        else ""
    )
    print(
        f"issued webhook secret {issued.secret_id} for tenant {args.name}{previous}",
        file=sys.stderr,
    )
    return 0


@dataclass(frozen=True, slots=True)
class _Session:
    pool: asyncpg.Pool
    store: EventStore
    runner: ProjectionRunner
    """Runs only the `tenants` projection, so that new tokens work as soon as a command ends."""


@asynccontextmanager
async def _session(settings: Settings) -> AsyncIterator[_Session]:
    url = await resolve_database(settings)
    await require_migrated(url)
    pool = await create_pool(url, min_size=1, max_size=2)
    store = EventStore(pool)
    try:
        # The runner never waits on its listener here (only `run` does), so it is not started.
        runner = ProjectionRunner(pool, store, LogListener(url), [TenantsProjection()])
        yield _Session(pool, store, runner)
    finally:
        await store.close()
        await pool.close()


def _failed(exc: TenantError) -> int:
    print(f"trainyard: {exc}", file=sys.stderr)
    return EXIT_USAGE if isinstance(exc, InvalidTenant) else EXIT_FAILED


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


def _usage(check: Callable[[T], object], value: T) -> T:
    """Run a check as an argparse type: its message becomes argparse's usage error (exit 2)."""
    try:
        check(value)
    except InvalidTenant as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value

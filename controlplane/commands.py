"""The server's commands: `trainyard serve`, `migrate` and `projections`, and the options that
`trainyard up` shares with `serve`. Defined for every command line (the front door, `cli.main`,
lists them); their handlers import the server's modules, so that a user's `trainyard submit`
loads none of them."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from controlplane.failures import EXIT_USAGE
from controlplane.settings import (
    DAY_S,
    LOG_RETENTION_ENV,
    LOG_RETENTION_S,
    Settings,
    log_retention_days,
)

if TYPE_CHECKING:
    from controlplane.projections.runner import ProjectionRunner


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add `serve`, `migrate` and `projections` to the top-level subcommands."""
    serve = commands.add_parser(
        "serve",
        help="run the control plane (HTTP API and projections)",
        description="Run the control plane against an already migrated database until "
        "SIGINT or SIGTERM; several replicas may run against one database. Jobs may name the "
        "learner images TRAINYARD_IMAGES allows (comma-separated names or patterns, "
        "optionally NAME@sha256:DIGEST; default trainyard-learner:latest).",
    )
    listen_args(serve)
    log_retention_arg(serve)
    serve.set_defaults(handler=cmd_serve)

    mig = commands.add_parser(
        "migrate",
        help="apply pending database migrations",
        description="Apply the numbered SQL migrations not yet applied, in order, under an "
        "advisory lock (concurrent runs are safe). A changed applied migration is an error.",
    )
    mig.set_defaults(handler=cmd_migrate)

    proj = commands.add_parser(
        "projections", help="inspect or rebuild read models", description="Read models."
    )
    proj_commands = proj.add_subparsers(title="commands", required=True, metavar="COMMAND")
    listing = proj_commands.add_parser(
        "list",
        help="list projections and whether each has caught up",
        description="List every projection and whether it has applied every readable event.",
    )
    listing.set_defaults(handler=cmd_projections_list)
    rebuild = proj_commands.add_parser(
        "rebuild",
        help="empty a projection and replay the whole log into it",
        description="Empty a projection's tables and replay the event log from position zero.",
    )
    rebuild.add_argument("name", help="the projection's name (see `projections list`)")
    rebuild.set_defaults(handler=cmd_projections_rebuild)


def listen_args(command: argparse.ArgumentParser) -> None:
    command.add_argument("--host", default="127.0.0.1", help="address to listen on")
    command.add_argument("--port", type=int, default=8080, help="port to listen on")


def log_retention_arg(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--log-retention-days",
        type=_log_retention_days,
        metavar="DAYS",
        help="delete a job's log lines this many days after it ended; 0 keeps them forever "
        f"(default: ${LOG_RETENTION_ENV}, else {LOG_RETENTION_S / DAY_S:g})",
    )


def _log_retention_days(text: str) -> float:
    try:
        return log_retention_days(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def database(settings: Settings) -> str:
    """The database's URL: the external one, or the embedded one, started if need be."""
    from controlplane.database import resolve_database

    return await resolve_database(settings)


async def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from controlplane import telemetry
    from controlplane.migrate import require_migrated
    from controlplane.server import allowed_images, listening, log_retention_s, signalled

    telemetry.setup("trainyard-controlplane")
    # Before the database: a malformed setting is reported at once, whatever else is wrong.
    images = allowed_images()
    retention_s = log_retention_s(args.log_retention_days)
    url = await database(settings)
    await require_migrated(url)
    async with listening(url, args.host, args.port, settings.home, images, retention_s):
        await signalled().wait()
    return 0


async def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from controlplane.database import describe
    from controlplane.migrate import available, migrate

    url = await database(settings)
    applied = await migrate(url)
    for migration in applied:
        print(f"applied {migration.version:04d}_{migration.name}")
    if not applied:
        print(f"database {describe(url)} is up to date ({len(available())} migrations)")
    return 0


async def cmd_projections_list(args: argparse.Namespace, settings: Settings) -> int:
    async with _runner(settings) as runner:
        for name in runner.projections:
            status = "caught up" if await runner.is_caught_up(name) else "behind"
            print(f"{name}\t{status}")
    return 0


async def cmd_projections_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    async with _runner(settings) as runner:
        if args.name not in runner.projections:
            known = ", ".join(runner.projections)
            print(f"trainyard: no projection named {args.name!r} (known: {known})", file=sys.stderr)
            return EXIT_USAGE
        try:
            count = await runner.rebuild(args.name)
        except ValueError as exc:
            print(f"trainyard: {exc}", file=sys.stderr)
            return EXIT_USAGE
    print(f"rebuilt {args.name} from {count} events")
    return 0


class _runner:
    """A projection runner on a fresh pool, for one-off commands."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    async def __aenter__(self) -> ProjectionRunner:
        from controlplane.composition import projection_runner
        from controlplane.database import create_pool
        from controlplane.event_registry import EVENT_REGISTRY
        from controlplane.events.store import EventStore
        from controlplane.events.subscription import LogListener
        from controlplane.migrate import require_migrated

        url = await database(self._settings)
        await require_migrated(url)
        self._pool = pool = await create_pool(url, min_size=1, max_size=2)
        store = EventStore(pool, EVENT_REGISTRY)
        return projection_runner(pool, store, LogListener(url))

    async def __aexit__(self, *_: object) -> None:
        await self._pool.close()

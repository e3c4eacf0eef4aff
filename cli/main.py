"""The `trainyard` command line: the front door to every part, and the only module that knows
every command.

Each part defines its own commands (a module's `add_commands`); `COMMANDS` lists those modules in
the order `trainyard --help` shows them. A part whose modules load the server's, the agent's or
the benchmarks' code (`Lazy`) is imported only when the command line names its command, and
listed by name and summary otherwise, so that a user's `trainyard submit` loads none of them;
the others are light (the user's commands, over HTTP; the server's, whose handlers import what
they run) and always defined. Nothing imports this package: it sits above every part."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import logging
import sys
import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from controlplane.commands import add_commands as add_server_commands
from controlplane.failures import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    BackendUnreachable,
    CommandFailed,
)
from controlplane.settings import Settings
from trainyard.api import ApiError, NotFound, ServerUnreachable, UsageError
from trainyard.commands import add_client_commands
from trainyard.grep_command import add_grep_command
from trainyard.inference_commands import add_inference_commands
from trainyard.models_commands import add_model_commands
from trainyard.scheduling_commands import add_commands as add_scheduling_commands
from trainyard.search_commands import add_search_commands
from trainyard.serving_commands import add_serving_commands
from trainyard.tenants_commands import add_commands as add_tenant_commands

Handler = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]
AddCommands = Callable[["argparse._SubParsersAction[Any]"], None]


@dataclass(frozen=True)
class Lazy:
    """A command whose module (with its `add_commands`) is imported only when the command line
    names it."""

    name: str
    module: str
    summary: str
    """Its line in `trainyard --help`, as its module gives it."""


COMMANDS: tuple[AddCommands | Lazy, ...] = (
    Lazy("up", "cli.up", "run everything on this machine, with a demo job"),
    add_server_commands,
    Lazy(
        "simulate",
        "cli.simulate",
        "replay the recorded past under a scheduling policy (operator)",
    ),
    add_tenant_commands,
    add_scheduling_commands,
    Lazy(
        "agent",
        "node_agent.cli",
        "run a node agent: register this machine's GPUs and run the jobs it claims",
    ),
    Lazy(
        "agent-login",
        "controlplane.agents.login_cli",
        "create database logins for node agents (operator)",
    ),
    add_client_commands,
    add_model_commands,
    add_serving_commands,
    add_inference_commands,
    add_search_commands,
    add_grep_command,
    Lazy("bench", "bench.commands", "run a benchmark"),
)
"""Every command, in the order of `trainyard --help`."""

NOT_INSTALLED = {
    "bench": "the benchmarks run from a checkout of Trainyard's source, which the installed "
    "package leaves out: there, `pip install -e '.[bench]'`, then `trainyard bench NAME`",
}
"""What a command says when its part is not installed (only the benchmarks may be missing)."""


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    missing = _not_installed(_named(words))
    if missing is not None:
        print(f"trainyard: {missing}", file=sys.stderr)
        return EXIT_USAGE
    args = parser(running=words).parse_args(words)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler: Handler = args.handler
    try:
        return asyncio.run(handler(args, Settings.from_env()))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        code, message = failure(exc)
        print(f"trainyard: {message}", file=sys.stderr)
        if args.debug:
            traceback.print_exception(exc)
        return code


def failure(exc: Exception) -> tuple[int, str]:
    """The exit code and the one line that say why a command failed."""
    match exc:
        case BackendUnreachable() | ServerUnreachable():
            return EXIT_UNREACHABLE, str(exc)
        case NotFound():
            return EXIT_NOT_FOUND, str(exc)
        case UsageError():
            return EXIT_USAGE, str(exc)
        case ApiError(status=400 | 422):
            # A manifest or argument the server found invalid is the user's input to fix.
            return EXIT_USAGE, str(exc)
        case ApiError() | CommandFailed():
            return EXIT_FAILED, str(exc)
    # A bug, or a failure nobody foresaw: still one line, the traceback only when asked.
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return EXIT_FAILED, f"unexpected error ({detail}); run with --debug for the traceback"


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (exit code 2), pointing at the command's --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def parser(running: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. With `running` (the words about to be parsed), only the command
    they name among the `Lazy` ones is defined in full, the others by name and summary;
    without it, every one that is installed (for tests, and for documentation)."""
    top = _Parser(
        prog="trainyard",
        description="Trainyard: a dependable deep-learning-training service. The database is "
        "$TRAINYARD_DATABASE_URL, or else an embedded Postgres under $TRAINYARD_HOME "
        "(default ~/.local/share/trainyard).",
    )
    top.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    top.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print its traceback after the one-line message",
    )
    commands = top.add_subparsers(title="commands", required=True, metavar="COMMAND")
    named = _named(running) if running else None
    for command in COMMANDS:
        if not isinstance(command, Lazy):
            command(commands)
        elif (running is None or command.name == named) and _installed(command):
            importlib.import_module(command.module).add_commands(commands)
        else:
            commands.add_parser(command.name, help=command.summary)
    return top


def _named(words: Sequence[str]) -> str | None:
    """The command that the words name (the first that is not an option)."""
    return next((word for word in words if not word.startswith("-")), None)


def _installed(command: Lazy) -> bool:
    return importlib.util.find_spec(command.module.partition(".")[0]) is not None


def _not_installed(name: str | None) -> str | None:
    """Why the named command cannot run here, if its part is not installed."""
    for command in COMMANDS:
        if isinstance(command, Lazy) and command.name == name and not _installed(command):
            return NOT_INSTALLED[name]
    return None

"""`trainyard login | logout | submit | list | status | logs | cancel | checkpoint | nodes`: the
user's commands, built on the SDK (`trainyard.client.AsyncClient`), and the admin's `nodes
drain` and `nodes undrain`."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import aclosing
from typing import Any

from controlplane.failures import EXIT_FAILED
from controlplane.jobs.lifecycle import JobStatus
from controlplane.secret_arguments import RefusedSecret
from controlplane.settings import Settings
from trainyard import render
from trainyard.api import ApiClient, ApiError, NotFound, UsageError
from trainyard.client import AsyncClient
from trainyard.config import (
    SERVER_ENV,
    TOKEN_ENV,
    Target,
    forget_token,
    normalize_server,
    read_token_file,
    resolve,
    write_config,
)
from trainyard.manifest_file import read_manifest
from trainyard.sso import sso_sign_in

FAILED_STATES = frozenset({JobStatus.FAILED.value, JobStatus.CANCELLED.value})

RAW_HELP = "show the launcher's protocol lines (@@trainyard/1 ...) as stored, for debugging"

Handler = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]


def target_options(token_help: str) -> argparse.ArgumentParser:
    """--server and --token-file, for `parents=` of a command that talks to the API."""
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument(
        "--server", metavar="URL", help=f"the control plane (else ${SERVER_ENV}, else login's)"
    )
    target.add_argument("--token-file", metavar="FILE", help=token_help)
    target.add_argument(
        "--token",
        action=RefusedSecret,
        instead=f"--token-file FILE or ${TOKEN_ENV}",
        help=argparse.SUPPRESS,
    )
    return target


def output_options() -> argparse.ArgumentParser:
    """--output text|json, for `parents=` of a read command."""
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument(
        "--output", choices=["text", "json"], default="text", help="text (default) or json"
    )
    return output


def add_client_commands(commands: Any) -> None:
    """Add the user commands to the top-level subparsers (`add_subparsers()`'s result). Their
    errors (UsageError, ApiError, NotFound, ServerUnreachable) reach the front door (`cli.main`),
    which prints one line and exits with the documented code."""
    target = target_options(
        f"a file holding the bearer token, - for standard input (else ${TOKEN_ENV}, else login's)"
    )
    output = output_options()

    def add(name: str, summary: str, description: str, handler: Handler, *parents: Any) -> Any:
        command = commands.add_parser(
            name, help=summary, description=description, parents=[target, *parents]
        )
        command.set_defaults(handler=handler)
        return command

    login = add(
        "login",
        "save a server URL and token for the other commands",
        "Check the token against the server and save both to $TRAINYARD_HOME/client.json "
        "(mode 0600). Without --token-file, it is read from $TRAINYARD_TOKEN or asked for. "
        "With --sso, sign in through the server's identity provider instead (docs/sign-in.md).",
        cmd_login,
    )
    login.add_argument(
        "--sso",
        action="store_true",
        help="sign in through the identity provider: open the address shown, approve, and "
        "the token the server gives back is saved",
    )
    add(
        "logout",
        "end this machine's sign-in and forget its token",
        "For a token of `login --sso`, end its session at the server, which revokes the "
        "identity provider's token too; then remove the token from "
        "$TRAINYARD_HOME/client.json (the server stays). An issued token only stops being "
        "saved here: an admin revokes it.",
        cmd_logout,
    )
    submit = add(
        "submit",
        "submit a job manifest",
        "Submit the job described by FILE (YAML, or JSON when it ends in .json) and print its "
        "id. The manifest is checked first: a syntax error names the line and column, a "
        "wrong field its name (exit code 2). With --follow, show its state, attempt, restarts "
        "and logs until it ends; the exit code is then 1 if it FAILED or was CANCELLED. The "
        "launcher's reports (phases, metrics, checkpoints) are shown readably as `report` "
        "lines; --raw shows them as stored.",
        cmd_submit,
    )
    submit.add_argument(
        "file", metavar="FILE", help="the manifest (YAML or JSON), or - for standard input"
    )
    submit.add_argument("--follow", action="store_true", help="follow the job until it ends")
    submit.add_argument("--raw", action="store_true", help=RAW_HELP)
    listing = add(
        "list",
        "list jobs, newest first",
        "List jobs, newest first, optionally only those in some states or with some labels.",
        cmd_list,
        output,
    )
    listing.add_argument(
        "--state", action="append", choices=list(JobStatus), help="only this state (repeatable)"
    )
    listing.add_argument(
        "--label", action="append", metavar="K=V", help="only with this label (repeatable)"
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many (1 to 500)")
    status = add(
        "status",
        "a job's state, current attempt and full history, and why it is pending",
        "Show a job's state, attempt, restarts, nodes, GPUs, last checkpoint, exit codes and "
        "failure reason; for a job of several learners, each rank's node, GPUs, state and exit "
        "code; and every event of its history with time, actor and reason. A queued "
        "job's queue position and every reason it waits (never: it will not run as it is; "
        "waiting: for its turn, room or a backoff's end), and, for any job that waited, the "
        "time each reason held it.",
        cmd_status,
        output,
    )
    status.add_argument("job", metavar="JOB", help="the job's id")
    logs = add(
        "logs",
        "a job's learner logs",
        "Print a job's learner log lines. With -f, follow them (and the job's state) until the "
        "job and its learners have ended; the exit code is then 1 if it FAILED or was "
        "CANCELLED. The launcher's reports (phases, metrics, checkpoints) are shown readably as "
        "`report` lines; --raw shows every line as stored. A job of several learners names "
        "each line's rank (its learner index) in place of its learner, unless --raw. --output "
        "json prints one JSON object per line: only what the job's command printed, unless "
        "--raw.",
        cmd_logs,
        output,
    )
    logs.add_argument("job", metavar="JOB", help="the job's id")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    logs.add_argument("--attempt", type=int, metavar="N", help="only attempt N")
    logs.add_argument("--learner", type=int, metavar="I", help="only learner I (rank I)")
    logs.add_argument("--raw", action="store_true", help=RAW_HELP)
    cancel = add("cancel", "cancel a job", "Cancel a job that has not finished.", cmd_cancel)
    cancel.add_argument("job", metavar="JOB", help="the job's id")
    cancel.add_argument("--reason", help="why (recorded in the job's history)")
    checkpoint = add(
        "checkpoint",
        "ask a running job for a checkpoint now",
        "Ask a PROCESSING job's learners to save a checkpoint now.",
        cmd_checkpoint,
    )
    checkpoint.add_argument("job", metavar="JOB", help="the job's id")
    nodes = add(
        "nodes",
        "list nodes with their GPUs, CPUs and memory; drain and undrain one (admin)",
        "List the nodes: state (DRAINING: an operator took it out of service), lease, free "
        "GPUs, allocated CPUs and memory. With a command, the admin drains a node for "
        "maintenance or puts it back in service.",
        cmd_nodes,
        output,
    )
    _add_node_commands(nodes)


def _warn(message: str) -> None:
    print(f"trainyard: {message}", file=sys.stderr)


def client_for(args: argparse.Namespace, settings: Settings) -> AsyncClient:
    """The SDK's client for a command's --server and --token-file (or their defaults)."""
    target = resolve(args.server, args.token_file, settings.home)
    return AsyncClient(target.server, target.token)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def parse_labels(pairs: Sequence[str] | None) -> dict[str, str]:
    """--label KEY=VALUE options as a dict; UsageError for one that is not KEY=VALUE."""
    labels: dict[str, str] = {}
    for label in pairs or []:
        if "=" not in label or label.startswith("="):
            raise UsageError(f"--label must be KEY=VALUE, not {label!r}")
        key, _, value = label.partition("=")
        labels[key] = value
    return labels


async def cmd_login(args: argparse.Namespace, settings: Settings) -> int:
    server = args.server or _env(SERVER_ENV)
    if not server:
        raise UsageError(f"login needs --server URL (or ${SERVER_ENV})")
    if args.sso:
        return await _login_sso(normalize_server(server), settings)
    token = read_token_file(args.token_file) if args.token_file else _env(TOKEN_ENV)
    if not token:
        if not sys.stdin.isatty():
            raise UsageError(
                f"login needs --token-file FILE (or ${TOKEN_ENV}) when not on a terminal"
            )
        token = await asyncio.to_thread(getpass.getpass, "token: ")
    target = Target(normalize_server(server), token.strip())
    async with AsyncClient(target.server, target.token) as client:
        # Only a token that works is worth saving.
        await client.jobs(limit=1)
    path = write_config(settings.home, target)
    print(f"logged in to {target.server}; saved to {path}")
    return 0


async def _login_sso(server: str, settings: Settings) -> int:
    signed_in = await sso_sign_in(server, lambda line: print(line, flush=True))
    path = write_config(settings.home, Target(server, signed_in["token"]))
    who = "the admin" if signed_in["is_admin"] else f"tenant {signed_in['tenant']}"
    print(f"logged in to {server} as {who} until {signed_in['expires_at']}; saved to {path}")
    return 0


async def cmd_logout(args: argparse.Namespace, settings: Settings) -> int:
    target = resolve(args.server, args.token_file, settings.home)
    # The server knows which tokens are sign-in sessions: it ends those, and refuses the rest
    # (an issued token, 400; a server with no identity provider, 404).
    async with ApiClient(target.server, target.token) as api:
        try:
            answer = await api.request("DELETE", "/v1/login/session")
        except NotFound:
            print("an issued token stays valid until an admin revokes it")
        except ApiError as refused:
            if refused.status == 401:
                print("the sign-in session had already ended")
            elif refused.status == 400:
                print("an issued token stays valid until an admin revokes it")
            else:
                raise
        else:
            revoked = isinstance(answer, dict) and answer.get("revoked_at_provider")
            print(
                f"ended the sign-in session at {target.server}"
                + ("; the identity provider revoked its token" if revoked else "")
            )
    path = forget_token(settings.home, target.token)
    if path is not None:
        print(f"removed the token from {path}")
    return 0


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


async def cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    manifest = read_manifest(args.file)
    async with client_for(args, settings) as client:
        job = await client.submit(manifest)
        print(job["id"], flush=True)
        if job.get("unschedulable_reason"):
            _warn(f"warning: {job['unschedulable_reason']}")
        if not args.follow:
            return 0
        view = render.follow_view(False, args.raw, _ranks(job, args.raw))
        return await follow_job(client, job["id"], view, None, None, protocol=True)


async def follow_job(
    client: AsyncClient,
    job_id: str,
    view: render.FollowView,
    attempt: int | None,
    learner: int | None,
    *,
    protocol: bool = True,
) -> int:
    """Show the job's state changes and log lines (the launcher's protocol lines too, when
    `protocol`) until both streams have ended; 1 if the job FAILED or was CANCELLED."""
    final: dict[str, str] = {}

    async def states() -> None:
        restarts = 0
        async with aclosing(client.events(job_id)) as events:
            async for event in events:
                restarts += event["type"] == "JobRestarted"
                view.status(event["state"], event["attempt"], restarts, _detail(event))
                final["state"] = event["state"]

    async def lines() -> None:
        stream = client.logs(
            job_id, follow=True, attempt=attempt, learner=learner, protocol=protocol
        )
        async with aclosing(stream):
            async for line in stream:
                view.line(line)

    try:
        with view:
            async with asyncio.TaskGroup() as group:
                group.create_task(states())
                group.create_task(lines())
    except ExceptionGroup as failed:
        # One cause for `main` to map to an exit code and one line: the first stream's error.
        raise failed.exceptions[0] from None
    state = final["state"]
    print(f"job {job_id} {state}", file=sys.stderr)
    return EXIT_FAILED if state in FAILED_STATES else 0


def _detail(event: Mapping[str, Any]) -> str | None:
    data = event.get("data") or {}
    return data.get("reason") or ", ".join(data.get("nodes") or []) or None


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    if not 1 <= args.limit <= 500:
        raise UsageError("--limit must be between 1 and 500")
    labels = parse_labels(args.label)
    async with client_for(args, settings) as client:
        jobs = await client.jobs(states=args.state or (), labels=labels, limit=args.limit)
    if args.output == "json":
        print_json(jobs)
    else:
        print(render.jobs_table(jobs))
    return 0


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        job = await client.job(args.job)
        history = await client.history(args.job)
        pending = await client.pending(args.job)
    # A server older than webhook notifications sends no `webhooks`.
    webhooks = history.get("webhooks", [])
    if args.output == "json":
        print_json(
            {"job": job, "history": history["history"], "webhooks": webhooks, "pending": pending}
        )
    else:
        print(render.job_status(job, history["history"], webhooks, pending))
    return 0


async def cmd_logs(args: argparse.Namespace, settings: Settings) -> int:
    json_output = args.output == "json"
    # Text shows the launcher's reports readably; JSON is what the command printed, or (raw)
    # every line as stored.
    reports = args.raw or not json_output
    async with client_for(args, settings) as client:
        # JSON lines carry their learner (their rank) already; text asks whether to name ranks.
        ranks = not json_output and _ranks(await client.job(args.job), args.raw)
        if args.follow:
            view = render.follow_view(json_output, args.raw, ranks)
            return await follow_job(
                client, args.job, view, args.attempt, args.learner, protocol=reports
            )
        stream = client.logs(args.job, attempt=args.attempt, learner=args.learner, protocol=reports)
        async with aclosing(stream):
            async for line in stream:
                print(json.dumps(line) if json_output else render.log_text(line, args.raw, ranks))
    return 0


def _ranks(job: Mapping[str, Any], raw: bool) -> bool:
    """Whether a job's log lines name their ranks: its learners train together, and the lines
    are not wanted as stored."""
    return not raw and job["manifest"]["learners"] > 1


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        job = await client.cancel(args.job, args.reason)
    print(f"{job['id']} {job['state']}")
    return 0


async def cmd_checkpoint(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        job = await client.checkpoint(args.job)
    print(f"checkpoint requested for {job['id']}")
    return 0


def _add_node_commands(nodes: argparse.ArgumentParser) -> None:
    """`nodes drain` and `nodes undrain`: the admin's, with the admin token as `trainyard
    tenants` finds it."""
    group = nodes.add_subparsers(title="commands", required=False, metavar="COMMAND")
    admin = target_options(
        f"a file holding the admin token, - for standard input (else ${TOKEN_ENV}, else "
        "$TRAINYARD_HOME/admin-token, else login's)"
    )
    drain = group.add_parser(
        "drain",
        help="take a node out of service for maintenance (admin)",
        description="Drain NODE: nothing new is placed on it, and its agent preempts every "
        "job it runs there within a heartbeat (the learners are asked to checkpoint within "
        "their grace, then stopped); the jobs go back to the queue without spending a restart "
        "and run elsewhere, or there once it is undrained. The agent keeps running. Draining a "
        "draining node changes nothing. Exit code 4 for an unknown node.",
        parents=[admin],
    )
    drain.add_argument("node", metavar="NODE", help="the node's name")
    drain.add_argument("--reason", help="why (recorded in the node's history)")
    drain.set_defaults(handler=cmd_drain)
    undrain = group.add_parser(
        "undrain",
        help="put a drained node back in service (admin)",
        description="Undrain NODE: claims place work on it again. Exit code 4 for an unknown node.",
        parents=[admin],
    )
    undrain.add_argument("node", metavar="NODE", help="the node's name")
    undrain.set_defaults(handler=cmd_undrain)


def _admin_client(args: argparse.Namespace, settings: Settings) -> AsyncClient:
    target = resolve(args.server, args.token_file, settings.home, admin=True)
    return AsyncClient(target.server, target.token)


async def cmd_drain(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin_client(args, settings) as client:
        node = await client.drain_node(args.node, args.reason)
    print(
        f"node {node['name']} is draining: nothing new is placed on it, and its jobs go back "
        "to the queue (preempted)"
    )
    return 0


async def cmd_undrain(args: argparse.Namespace, settings: Settings) -> int:
    async with _admin_client(args, settings) as client:
        node = await client.undrain_node(args.node)
    print(f"node {node['name']} is back in service")
    return 0


async def cmd_nodes(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        nodes = await client.nodes()
    if args.output == "json":
        print_json(nodes)
    else:
        print(render.nodes_table(nodes))
    return 0

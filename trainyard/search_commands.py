"""`trainyard search submit | list | status | trials | best | cancel`: the user's side of
searches (hyperparameter and architecture search over many trials), built on the SDK
(`trainyard.client.AsyncClient`). Each trial is a job: `trainyard status JOB` and `trainyard
logs JOB` show it."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import aclosing
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from controlplane.failures import EXIT_FAILED
from controlplane.searches.spec import SearchSpec, searcher_for
from controlplane.settings import Settings
from trainyard import render
from trainyard.api import UsageError
from trainyard.client import AsyncClient
from trainyard.commands import (
    Handler,
    client_for,
    output_options,
    print_json,
    target_options,
)
from trainyard.config import TOKEN_ENV
from trainyard.manifest_file import read_search

STATES = ("running", "completed", "failed", "cancelled")
HPARAMS_CHARS = 60
"""A trial's hyperparameters (compact JSON) as the table shows them: at most this long."""


def add_search_commands(commands: Any) -> None:
    """Add `search` and its commands to the top-level subparsers. Their errors reach
    the front door (`cli.main`), which prints one line and exits with the documented code."""
    target = target_options(
        f"a file holding the bearer token, - for standard input (else ${TOKEN_ENV}, else login's)"
    )
    output = output_options()
    group = commands.add_parser(
        "search",
        help="hyperparameter and architecture searches",
        description="Searches: many trials of one training job template, each a job with "
        "hyperparameters drawn from a search space (TRAINYARD_HPARAMS), chosen by a searcher "
        "(random, grid, asha, evolution) from the metric the trials report.",
    )
    searches = group.add_subparsers(title="commands", required=True, metavar="COMMAND")

    def add(name: str, summary: str, description: str, handler: Handler, *parents: Any) -> Any:
        command = searches.add_parser(
            name, help=summary, description=description, parents=[target, *parents]
        )
        command.set_defaults(handler=handler)
        return command

    submit = add(
        "submit",
        "submit a search from a spec file",
        "Submit the search FILE describes (YAML, or JSON for .json: name, trial, space, "
        "searcher, metric, budget, max_trials, ...; see docs/user-guide.md, Searches) and print "
        "its id. With "
        "--follow, show its trials as a table, live, until it ends; the exit code is then 1 "
        "if it failed or was cancelled. A file that cannot be read is exit code 2, and nothing "
        "is submitted.",
        cmd_submit,
    )
    submit.add_argument("file", metavar="FILE", help="the search spec")
    submit.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    submit.add_argument(
        "--tenant", metavar="NAME", help="the tenant to submit for (the admin's token only)"
    )
    listing = add(
        "list", "list searches, newest first", "List searches, newest first.", cmd_list, output
    )
    listing.add_argument("--state", choices=STATES, help="only searches in this state")
    listing.add_argument(
        "--limit", type=int, default=50, metavar="N", help="at most N (1 to 500; default 50)"
    )
    status = add(
        "status",
        "a search's state and best trial",
        "Show a search: its state, its searcher and metric, trials created of the most "
        "allowed, its best trial so far, and why it ended.",
        cmd_status,
        output,
    )
    status.add_argument("search", metavar="ID", help="the search's id")
    trials = add(
        "trials",
        "a search's trials as a table",
        "Show a search's trials, one a row: number, state, rung, budget, metric, job and "
        "hyperparameters. With --follow, show the table again at each decision of the searcher "
        "(on a terminal, redrawn in place), until the search ends; the exit code is then 1 if "
        "it failed or was cancelled.",
        cmd_trials,
        output,
    )
    trials.add_argument("search", metavar="ID", help="the search's id")
    trials.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    best = add(
        "best",
        "a search's best trial, or the job that trains it again",
        "Show a search's best trial so far: its metric, rung and hyperparameters. With "
        "--manifest, print the job manifest that trains its model again with the whole budget "
        "(JSON: `trainyard submit` takes it as a .json file).",
        cmd_best,
        output,
    )
    best.add_argument("search", metavar="ID", help="the search's id")
    best.add_argument("--manifest", action="store_true", help="print the job manifest only")
    cancel = add(
        "cancel",
        "cancel a running search",
        "Cancel a running search: its running trials' jobs are cancelled.",
        cmd_cancel,
    )
    cancel.add_argument("search", metavar="ID", help="the search's id")
    cancel.add_argument("--reason", metavar="TEXT", help="why (kept in its history)")


async def cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    spec = read_search(args.file)
    async with client_for(args, settings) as client:
        search = await client.submit_search(spec, tenant=args.tenant)
        print(search["id"], flush=True)
        if not args.follow:
            return 0
        return await _follow(client, search["id"], json_output=False)


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    if not 1 <= args.limit <= 500:
        raise UsageError("--limit must be between 1 and 500")
    async with client_for(args, settings) as client:
        found = await client.searches(state=args.state, limit=args.limit)
    if args.output == "json":
        print_json(found)
        return 0
    rows = [
        (
            s["id"],
            render.printable(s["name"]),
            s["state"],
            s["searcher"],
            f"{s['trials']}/{s['max_trials']}",
            _best(s),
            s["created_at"],
        )
        for s in found
    ]
    print(render.table(["ID", "NAME", "STATE", "SEARCHER", "TRIALS", "BEST", "CREATED"], rows))
    return 0


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        search = await client.search(args.search)
    if args.output == "json":
        print_json(search)
    else:
        print(status_text(search))
    return 0


async def cmd_trials(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        if args.follow:
            return await _follow(client, args.search, json_output=args.output == "json")
        trials = await client.search_trials(args.search)
    if args.output == "json":
        print_json(trials)
    else:
        print(trials_table(trials))
    return 0


async def cmd_best(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        best = await client.search_best(args.search)
    if args.manifest:
        print(json.dumps(best["manifest"], indent=2))
    elif args.output == "json":
        print_json(best)
    else:
        metric = best["metric"]
        print(
            render.fields(
                [
                    ("trial", best["trial"]),
                    ("rung", best["rung"]),
                    (metric["name"], f"{metric['value']:.6g} ({metric['mode']})"),
                    ("job", best["job_id"]),
                    ("hparams", render.printable(json.dumps(best["hparams"]))),
                ]
            )
        )
    return 0


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        search = await client.cancel_search(args.search, args.reason)
    print(f"search {search['id']} {search['state']}")
    return 0


def _best(search: dict[str, Any]) -> str:
    best = search["best"]
    return "-" if best is None else f"{best['metric']:.6g} (trial {best['trial']})"


def status_text(search: dict[str, Any]) -> str:
    metric = search["metric"]
    return render.fields(
        [
            ("search", search["id"]),
            ("name", render.printable(search["name"])),
            ("state", search["state"]),
            ("searcher", search["searcher"]),
            ("metric", f"{metric['name']} ({metric['mode']})"),
            ("trials", f"{search['trials']} of at most {search['max_trials']}"),
            ("best", _best(search)),
            ("reason", render.printable(search["reason"] or "-")),
            ("created", search["created_at"]),
            ("ended", search["ended_at"] or "-"),
        ]
    )


def trials_table(trials: list[dict[str, Any]]) -> str:
    rows = []
    for trial in trials:
        hparams = json.dumps(trial["hparams"], separators=(",", ":"))
        if len(hparams) > HPARAMS_CHARS:
            hparams = hparams[: HPARAMS_CHARS - 1] + "…"
        rows.append(
            (
                trial["number"],
                trial["state"],
                trial["rung"],
                trial["budget"],
                "-" if trial["metric"] is None else f"{trial['metric']:.6g}",
                trial["job_id"],
                render.printable(hparams),
            )
        )
    headers = ["TRIAL", "STATE", "RUNG", "BUDGET", "METRIC", "JOB", "HPARAMS"]
    return render.table(headers, rows)


async def _follow(client: AsyncClient, search_id: str, *, json_output: bool) -> int:
    """The trials, folded from the search's events as they come (the stream is the truth; the
    trials' read model may lag it), shown at each one until the search ends; 1 if it failed
    or was cancelled."""
    live = (
        Live(Text("connecting"), console=Console(), auto_refresh=False)
        if sys.stdout.isatty() and not json_output
        else None
    )
    trials: dict[int, dict[str, Any]] = {}
    ended: dict[str, Any] = {}
    if live is not None:
        live.start()
    try:
        async with aclosing(client.search_events(search_id)) as events:
            async for event in events:
                if event["type"] == "SearchEnded":
                    ended = event["data"]
                fold(trials, event)
                if json_output:
                    print(json.dumps(event), flush=True)
                elif live is not None:
                    # Text(...) so that nothing a tenant wrote is read as rich markup.
                    live.update(Text(trials_table(_rows(trials))), refresh=True)
                else:
                    print(_event_line(event), flush=True)
    finally:
        if live is not None:
            live.stop()
    if not json_output and live is None:
        print(trials_table(_rows(trials)))
    state = ended.get("state", "running")
    print(f"search {search_id} {state}: {ended.get('reason', '')}", file=sys.stderr)
    return EXIT_FAILED if state in ("failed", "cancelled") else 0


def fold(trials: dict[int, dict[str, Any]], event: dict[str, Any]) -> None:
    """`trials` (rows as GET .../trials gives them) with the search's `event` applied; the
    searcher's rungs are kept under key -1 (SearchSubmitted holds the spec)."""
    data = event["data"]
    kind = event["type"]
    if kind == "SearchSubmitted":
        spec = SearchSpec.model_validate(data["spec"])
        trials[-1] = {"rungs": len(searcher_for(spec).rungs)}
        return
    if kind == "TrialCreated":
        trials[data["number"]] = {
            "number": data["number"],
            "state": "running",
            "rung": 0,
            "budget": data["budget"],
            "metric": None,
            "job_id": data["job_id"],
            "hparams": data["point"],
        }
        return
    if kind == "SearchEnded":
        for trial in _rows(trials):
            if trial["state"] == "running":
                trial["state"] = "cancelled"
        return
    number = data.get("number")
    if number is None or number not in trials:
        return
    trial = trials[number]
    match kind:
        case "TrialPromoted":
            trial.update(state="running", rung=data["rung"], budget=data["budget"])
            trial["job_id"] = data["job_id"]
        case "TrialRungFinished":
            top = data["rung"] >= trials[-1]["rungs"] - 1
            trial.update(state="completed" if top else "paused", metric=data["metric"])
        case "TrialFailed":
            trial["state"] = "failed"
        case "TrialPruned":
            trial["state"] = "pruned"


def _rows(trials: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [trial for number, trial in sorted(trials.items()) if number >= 0]


def _event_line(event: dict[str, Any]) -> str:
    data = event["data"]
    number = data.get("number")
    what = event["type"] if number is None else f"{event['type']} trial {number}"
    detail = data.get("reason") or (f"metric {data['metric']:.6g}" if "metric" in data else "")
    return render.printable(f"{data.get('at', '')} {what} {detail}".strip())

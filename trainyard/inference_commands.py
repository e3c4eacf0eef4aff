"""`trainyard infer | stats | queries`: the user's side of inference jobs, built on the SDK
(`trainyard.client.AsyncClient`): run a published model version over an input set as a job, one
query per batch of items, sharing the cluster with the other inference jobs by weight;
watch its statistics (exact: counts, rates, latency percentiles, each replica's figures), live
if need be; and read its queries' results in order.

An inference job is a job: `trainyard status JOB` shows it and `trainyard cancel JOB` stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import sys
from contextlib import aclosing
from types import TracebackType
from typing import Any, Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text

from controlplane.deployments.spec import Resources
from controlplane.failures import EXIT_FAILED
from controlplane.inference.spec import MAX_DIMENSIONS, MAX_ITEM_ELEMENTS, InferenceRequest
from controlplane.settings import Settings
from trainyard import render
from trainyard.api import UsageError
from trainyard.commands import (
    FAILED_STATES,
    Handler,
    client_for,
    output_options,
    parse_labels,
    print_json,
    target_options,
)
from trainyard.config import TOKEN_ENV
from trainyard.serving_commands import read_items as serving_items
from trainyard.serving_commands import server_default

ITEMS_HELP = (
    "the items, a JSON array (one input each): inline ('[[1, 2], [3, 4]]'), @FILE to read it "
    "from FILE, or - for standard input"
)
MAX_SEED = 2**63 - 1
DEFAULT_QUERIES_PAGE = 100
MAX_QUERIES_PAGE = 1000
RESULT_CHARS = 80
"""A query's outputs (compact JSON) or error, as `queries` shows them: at most this long."""
REPLICA_CHARS = 8
"""A replica's id as `stats` shows it: its first characters."""

_SHAPE = re.compile(r"[0-9]+(?:x[0-9]+)*", re.ASCII)


def add_inference_commands(commands: Any) -> None:
    """Add `infer`, `stats` and `queries` to the top-level subparsers (`add_subparsers()`'s
    result). Their errors reach the front door (`cli.main`), which prints one line and exits with
    the documented code."""
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

    infer = add(
        "infer",
        "run a model version over an input set, as a job",
        "Submit inference job NAME: the model version --model names (resolved now) run over "
        "generated items (--generate) or the items given (--items), one query per batch of "
        "--batch-size items, on --replicas replicas placed like jobs' learners, and print its "
        "id (--output json: the whole job). With --generate it runs until cancelled unless "
        "--queries says how many; with --items, once over them (or their first --queries "
        "batches). Follow it with `trainyard stats ID --follow`, read its results with "
        "`trainyard queries ID`, stop it with `trainyard cancel ID`. A bad SHAPE, both "
        "--generate and --items, or ITEMS that cannot be read or are not a JSON array of "
        "items is exit code 2, and nothing is submitted.",
        cmd_infer,
        output,
    )
    infer.add_argument("name", metavar="NAME", help="the job's name")
    infer.add_argument(
        "--model",
        metavar="REF",
        required=True,
        help="the version: [TENANT/]NAME (its latest), NAME:N or NAME@ALIAS",
    )
    source = infer.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--generate",
        metavar="SHAPE",
        type=parse_shape,
        help="generate the items: float32 arrays of SHAPE, its dimensions joined by x (e.g. "
        f"3x224x224; at most {MAX_DIMENSIONS} dimensions), standard normal, each a function of "
        "the seed and its number",
    )
    source.add_argument("--items", metavar="ITEMS", help=ITEMS_HELP)
    infer.add_argument(
        "--seed",
        type=parse_seed,
        metavar="N",
        help="with --generate: the generator's seed (default 0)",
    )
    infer.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help=f"items per query ({server_default(InferenceRequest, 'batch_size')})",
    )
    infer.add_argument(
        "--queries",
        type=int,
        metavar="N",
        help="how many queries to run (default: with --generate, until cancelled; with "
        "--items, as many as cover them once)",
    )
    infer.add_argument(
        "--weight",
        type=float,
        metavar="W",
        help="its share against the other inference jobs running: their query throughputs go "
        f"as their weights (0.01 to 100; {server_default(InferenceRequest, 'weight')})",
    )
    infer.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help=f"replicas running it ({server_default(InferenceRequest, 'replicas')})",
    )
    infer.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help=f"GPUs per replica ({server_default(Resources, 'gpus')})",
    )
    infer.add_argument(
        "--cpus",
        type=float,
        metavar="X",
        help=f"CPUs per replica ({server_default(Resources, 'cpus')})",
    )
    infer.add_argument(
        "--memory-mb",
        type=int,
        metavar="N",
        help=f"memory per replica, MiB ({server_default(Resources, 'memory_mb')})",
    )
    infer.add_argument(
        "--image",
        metavar="IMAGE",
        help="the learner image replicas run in under the Docker runtime, one the operator "
        "allows (default: the server's)",
    )
    infer.add_argument(
        "--query-timeout",
        type=float,
        metavar="S",
        help="seconds a replica may hold a query before it is replaced and the query retried "
        f"({server_default(InferenceRequest, 'query_timeout_s')})",
    )
    infer.add_argument(
        "--label", action="append", metavar="K=V", help="a label of the job (repeatable)"
    )
    infer.add_argument(
        "--tenant", metavar="NAME", help="the tenant to submit for (the admin's token only)"
    )
    stats = add(
        "stats",
        "an inference job's statistics",
        "Show an inference job's statistics, exact, over every query recorded: its state, its "
        "queries' counts (finished of all, succeeded, failed, running, queued, retried), the "
        "rate of results (over the last seconds, and overall), the latency (mean, std, median, "
        "p90, p95, p99), the query rate (1 / each query's time: the same figures, where the "
        "server gives them), and one row per replica (node, queries finished, rate, median "
        "and p99 latency). "
        "With --follow, show them again at each change of the job's state or counts, until the "
        "job ends (on a terminal, redrawn in place; else each update after a blank line); the "
        "exit code is then 1 if it FAILED or was CANCELLED. --output json prints the figures "
        "(with --follow, each update as one line).",
        cmd_stats,
        output,
    )
    stats.add_argument("job", metavar="JOB", help="the inference job's id")
    stats.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    queries = add(
        "queries",
        "an inference job's queries and their results, in order",
        "List an inference job's queries in order, one a line: index, state, node, latency "
        "(claimed to recorded), tries, and the outputs as compact JSON or the error (a "
        f"traceback's last line), cut to {RESULT_CHARS} characters. One page: the queries "
        "after --after, at most --limit; when the page is full, the command for the next one "
        "goes to standard error. --output json prints the page as the API gives it.",
        cmd_queries,
        output,
    )
    queries.add_argument("job", metavar="JOB", help="the inference job's id")
    queries.add_argument(
        "--after",
        type=int,
        metavar="N",
        help="only the queries with an index above N (default: from the first)",
    )
    queries.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_QUERIES_PAGE,
        metavar="N",
        help=f"at most N queries (1 to {MAX_QUERIES_PAGE}; default {DEFAULT_QUERIES_PAGE})",
    )


def parse_shape(text: str) -> list[int]:
    """SHAPE (`3x224x224`) as its dimensions; ArgumentTypeError (a usage error) saying what is
    wrong."""
    if not _SHAPE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"invalid SHAPE {text[:80]!r}: its dimensions joined by x, e.g. 3x224x224"
        )
    shape = [int(size) for size in text.split("x")]
    if len(shape) > MAX_DIMENSIONS:
        raise argparse.ArgumentTypeError(
            f"invalid SHAPE {text[:80]!r}: at most {MAX_DIMENSIONS} dimensions"
        )
    if min(shape) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid SHAPE {text[:80]!r}: every dimension is at least 1"
        )
    if math.prod(shape) > MAX_ITEM_ELEMENTS:
        raise argparse.ArgumentTypeError(
            f"invalid SHAPE {text[:80]!r}: an item holds at most {MAX_ITEM_ELEMENTS} numbers"
        )
    return shape


def parse_seed(text: str) -> int:
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(
            f"invalid seed {text[:80]!r}: an integer from 0 to {MAX_SEED}"
        )
    return seed


def read_items(text: str) -> list[Any]:
    """--items: `serving_commands.read_items`'s array, not empty."""
    items = serving_items(text, "--items")
    if not items:
        raise UsageError("--items: the array of items is empty")
    return items


def _qps(value: float) -> str:
    return f"{value:.2f} q/s"


def _latency(latency: dict[str, Any] | None) -> str:
    if latency is None:
        return "- (no query has finished)"
    names = ("mean", "std", "median", "p90", "p95", "p99")
    return ", ".join(f"{name} {render.milliseconds(latency[name])}" for name in names)


def _query_rate(rate: dict[str, Any]) -> str:
    names = ("mean", "std", "median", "p90", "p95", "p99")
    return ", ".join(f"{name} {'-' if rate[name] is None else _qps(rate[name])}" for name in names)


def stats_text(figures: dict[str, Any]) -> str:
    """The job's figures, then a row per replica."""
    counts, rate = figures["queries"], figures["rate"]
    total = figures["total_queries"]
    finished = (
        f"{counts['finished']} (until cancelled)"
        if total is None
        else f"{counts['finished']} of {total}"
    )
    fields: list[tuple[str, object]] = [
        ("job", figures["job_id"]),
        ("state", figures["state"]),
        (
            "model",
            f"{figures['model']}, batches of {figures['batch_size']} items, "
            f"weight {figures['weight']:g}",
        ),
        (
            "queries",
            f"{finished} finished: {counts['succeeded']} succeeded, {counts['failed']} "
            f"failed; {counts['running']} running, {counts['queued']} queued, "
            f"{counts['retried']} retried",
        ),
        (
            "rate",
            f"{_qps(rate['window_qps'])} over the last {figures['window_s']:g} s, "
            f"{_qps(rate['overall_qps'])} overall",
        ),
        ("latency", _latency(figures["latency_ms"])),
    ]
    # IDunno's query rate (1 / each query's time): absent from servers older than it, None
    # before a query has finished.
    if figures.get("query_rate"):
        fields.append(("query rate", _query_rate(figures["query_rate"])))
    text = render.fields(fields)
    rows = [
        (
            replica["replica"][:REPLICA_CHARS],
            replica["node"],
            replica["queries"]["finished"],
            _qps(replica["rate"]["window_qps"]),
            render.milliseconds((replica["latency_ms"] or {}).get("median")),
            render.milliseconds((replica["latency_ms"] or {}).get("p99")),
        )
        for replica in figures["replicas"]
    ]
    if rows:
        window = f"RATE ({figures['window_s']:g} s)"
        headers = ["REPLICA", "NODE", "FINISHED", window, "MEDIAN", "P99"]
        text += "\n\n" + render.table(headers, rows)
    return text


def _result(query: dict[str, Any]) -> str | None:
    """The query's outputs as compact JSON, or its error's gist (a traceback's last line: the
    exception), cut to RESULT_CHARS; None while it has neither."""
    error: str | None = query["error"]
    if error is not None:
        lines = [line for line in error.splitlines() if line.strip()] or [""]
        text = lines[-1] if lines[0].startswith("Traceback (most recent call last)") else lines[0]
    elif query["outputs"] is not None:
        # JSON escapes every control character (and, ASCII only, every other one).
        text = json.dumps(query["outputs"], separators=(",", ":"))
    else:
        return None
    return text if len(text) <= RESULT_CHARS else text[: RESULT_CHARS - 1] + "…"


def queries_table(page: dict[str, Any]) -> str:
    rows = [
        (
            query["index"],
            query["state"],
            query["node"],
            None if query["latency_ms"] is None else f"{query['latency_ms']:.1f}",
            query["tries"],
            _result(query),
        )
        for query in page["queries"]
    ]
    return render.table(["INDEX", "STATE", "NODE", "LATENCY MS", "TRIES", "RESULT"], rows)


class StatsView(Protocol):
    """What `stats --follow` shows of each update."""

    def show(self, figures: dict[str, Any]) -> None: ...

    def __enter__(self) -> StatsView: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class PlainStats:
    """Each update's table after the one before and a blank line: for pipes and files."""

    def __init__(self) -> None:
        self._shown = False

    def show(self, figures: dict[str, Any]) -> None:
        if self._shown:
            print()
        print(stats_text(figures), flush=True)
        self._shown = True

    def __enter__(self) -> PlainStats:
        return self

    def __exit__(self, *_: object) -> None:
        return None


class JsonStats(PlainStats):
    """Each update as one line of JSON."""

    def show(self, figures: dict[str, Any]) -> None:
        print(json.dumps(figures), flush=True)


class LiveStats:
    """The table redrawn in place at each update: for a terminal."""

    def __init__(self) -> None:
        self._live = Live(Text("connecting"), console=Console(), auto_refresh=False)

    def show(self, figures: dict[str, Any]) -> None:
        # Text(...) so that nothing in the figures is read as rich markup.
        self._live.update(Text(stats_text(figures)), refresh=True)

    def __enter__(self) -> LiveStats:
        self._live.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._live.stop()


def stats_view(json_output: bool) -> StatsView:
    if json_output:
        return JsonStats()
    return LiveStats() if sys.stdout.isatty() else PlainStats()


async def cmd_infer(args: argparse.Namespace, settings: Settings) -> int:
    if args.seed is not None and args.generate is None:
        raise UsageError("--seed goes with --generate (items given with --items are not generated)")
    if args.items == "-" and args.token_file == "-":
        raise UsageError("standard input holds --items or the token (--token-file -), not both")
    labels = parse_labels(args.label)
    source: dict[str, Any]
    if args.generate is not None:
        generate: dict[str, Any] = {"shape": args.generate}
        if args.seed is not None:
            generate["seed"] = args.seed
        source = {"generate": generate}
    else:
        source = {"items": await asyncio.to_thread(read_items, args.items)}
    given = {"gpus": args.gpus, "cpus": args.cpus, "memory_mb": args.memory_mb, "image": args.image}
    # Only what the user set: the server decides the rest.
    resources = {name: value for name, value in given.items() if value is not None}
    async with client_for(args, settings) as client:
        job = await client.infer(
            args.name,
            args.model,
            input=source,
            batch_size=args.batch_size,
            queries=args.queries,
            weight=args.weight,
            replicas=args.replicas,
            resources=resources,
            query_timeout_s=args.query_timeout,
            labels=labels,
            tenant=args.tenant,
        )
    if args.output == "json":
        print_json(job)
    else:
        print(job["id"])
    return 0


async def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    json_output = args.output == "json"
    async with client_for(args, settings) as client:
        if not args.follow:
            figures = await client.inference_stats(args.job)
            if json_output:
                print_json(figures)
            else:
                print(stats_text(figures))
            return 0
        last: dict[str, Any] | None = None
        with stats_view(json_output) as view:
            stream = client.follow_inference_stats(args.job)
            async with aclosing(stream):
                async for figures in stream:
                    view.show(figures)
                    last = figures
    return EXIT_FAILED if last is not None and last["state"] in FAILED_STATES else 0


async def cmd_queries(args: argparse.Namespace, settings: Settings) -> int:
    if args.after is not None and args.after < 0:
        raise UsageError("--after must be at least 0")
    if not 1 <= args.limit <= MAX_QUERIES_PAGE:
        raise UsageError(f"--limit must be between 1 and {MAX_QUERIES_PAGE}")
    async with client_for(args, settings) as client:
        page = await client.inference_queries(args.job, after=args.after, limit=args.limit)
    if args.output == "json":
        print_json(page)
        return 0
    print(queries_table(page))
    if len(page["queries"]) == args.limit and page["next_after"] is not None:
        more = f"trainyard queries {args.job} --after {page['next_after']} --limit {args.limit}"
        print(f"more: {more}", file=sys.stderr)
    return 0

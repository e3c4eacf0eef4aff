"""`trainyard deploy | undeploy | deployments | predict | task | pipelines`: the user's side of
model serving, built on the SDK (`trainyard.client.AsyncClient`): deploy a published model
version on replicas, scale it, run it on inputs (DLHub's `run`), follow its tasks, and chain
deployments into pipelines.

Each command takes `--tenant NAME`, the tenant the admin acts for (a tenant's token acts as its
own tenant).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from controlplane.deployments.spec import Autoscaling, DeploymentRequest, Resources, Serving
from controlplane.failures import EXIT_FAILED
from controlplane.settings import Settings
from trainyard import render
from trainyard.api import PredictionFailed, UsageError
from trainyard.commands import (
    Handler,
    client_for,
    output_options,
    print_json,
    target_options,
)
from trainyard.config import TOKEN_ENV

INPUT_HELP = (
    "the items, a JSON array (one input each): inline ('[1, 2]'), @FILE to read it from FILE, "
    "or - for standard input"
)


def server_default(model: type[BaseModel], field: str) -> str:
    """What --help says of a flag left out: the command sends nothing, and the server's
    request model (the one place the default is decided) fills it in."""
    return f"default: the server's, {model.model_fields[field].default:g}"


def add_serving_commands(commands: Any) -> None:
    """Add `deploy`, `undeploy`, `deployments`, `predict`, `task` and `pipelines` to the
    top-level subparsers (`add_subparsers()`'s result). Their errors reach
    the front door (`cli.main`), which prints one line and exits with the documented code."""
    target = target_options(
        f"a file holding the bearer token, - for standard input (else ${TOKEN_ENV}, else login's)"
    )
    target.add_argument(
        "--tenant", metavar="NAME", help="the tenant to act for (the admin's token only)"
    )
    output = output_options()

    def add(
        parsers: Any, name: str, summary: str, description: str, handler: Handler, *parents: Any
    ) -> Any:
        command = parsers.add_parser(
            name, help=summary, description=description, parents=[target, *parents]
        )
        command.set_defaults(handler=handler)
        return command

    deploy = add(
        commands,
        "deploy",
        "serve a model version on replicas",
        "Deploy the model version --model names (resolved now: a later version or a moved "
        "alias does not change the deployment) as NAME, on replicas placed like jobs' "
        "learners; print the deployment. Each call of the model's entry point gets a batch "
        "of items, up to --max-batch-size, gathered for up to --max-wait-ms after the first; "
        "the memo answers an input it has seen from the stored result, unless --no-memo.",
        cmd_deploy,
    )
    deploy.add_argument("name", metavar="NAME", help="the deployment's name, unique in the tenant")
    deploy.add_argument(
        "--model",
        metavar="REF",
        required=True,
        help="the version: [TENANT/]NAME (its latest), NAME:N or NAME@ALIAS",
    )
    deploy.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help=f"replicas (0 to 64; {server_default(DeploymentRequest, 'replicas')})",
    )
    deploy.add_argument(
        "--min-replicas",
        type=int,
        metavar="N",
        help="autoscaled (instead of --replicas): the fewest replicas, 0 to scale to zero when "
        f"idle ({server_default(Autoscaling, 'min_replicas')})",
    )
    deploy.add_argument(
        "--max-replicas",
        type=int,
        metavar="N",
        help="autoscaled: the most replicas (1 to 64, at least --min-replicas; required "
        "with any of the autoscaling flags)",
    )
    deploy.add_argument(
        "--target-in-flight",
        type=float,
        metavar="X",
        help="autoscaled: requests in flight each replica should have "
        f"({server_default(Autoscaling, 'target_in_flight')})",
    )
    deploy.add_argument(
        "--scale-down-delay",
        type=float,
        metavar="S",
        help="autoscaled: seconds after its last change before it has fewer replicas, and "
        f"idle before none ({server_default(Autoscaling, 'scale_down_delay_s')})",
    )
    deploy.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help=f"GPUs per replica ({server_default(Resources, 'gpus')})",
    )
    deploy.add_argument(
        "--cpus",
        type=float,
        metavar="X",
        help=f"CPUs per replica ({server_default(Resources, 'cpus')})",
    )
    deploy.add_argument(
        "--memory-mb",
        type=int,
        metavar="N",
        help=f"memory per replica, MiB ({server_default(Resources, 'memory_mb')})",
    )
    deploy.add_argument(
        "--image",
        metavar="IMAGE",
        help="the learner image replicas run in under the Docker runtime, one the operator "
        "allows (default: the server's)",
    )
    deploy.add_argument(
        "--max-batch-size",
        type=int,
        metavar="N",
        help="most items one call of the entry point gets; a task of more items runs in "
        f"several calls ({server_default(Serving, 'max_batch_size')})",
    )
    deploy.add_argument(
        "--max-wait-ms",
        type=float,
        metavar="X",
        help="how long a batch that is not full waits for more items (a synchronous "
        "prediction to a replica with no call in flight runs at once) "
        f"({server_default(Serving, 'max_wait_ms')})",
    )
    deploy.add_argument(
        "--no-memo",
        action="store_true",
        help="run the model on every input, never answering from stored results",
    )
    deploy.add_argument(
        "--task-timeout",
        type=float,
        metavar="S",
        help="seconds a replica may hold a task before it is replaced and the task retried "
        f"({server_default(Serving, 'task_timeout_s')})",
    )
    undeploy = add(
        commands,
        "undeploy",
        "delete a deployment",
        "Delete deployment NAME: it takes no more tasks and its replicas stop (it shows as "
        "deleting until they have).",
        cmd_undeploy,
    )
    undeploy.add_argument("name", metavar="NAME", help="the deployment")
    deployments = add(
        commands,
        "deployments",
        "list deployments, or show, scale or measure one",
        "Without NAME, list the deployments. With NAME, show it: model version, entry point, "
        "resources, serving settings and each replica job's state; with --scale N, first "
        "serve it on N replicas; with --metrics, show its figures instead (requests, outcomes, "
        "queue depth, memo hits, batch sizes, latencies p50 and p99).",
        cmd_deployments,
        output,
    )
    deployments.add_argument("name", metavar="NAME", nargs="?", help="a deployment")
    change = deployments.add_mutually_exclusive_group()
    change.add_argument(
        "--scale", type=int, metavar="N", help="with NAME: serve it on N replicas (0 to 64)"
    )
    change.add_argument("--metrics", action="store_true", help="with NAME: show its figures")
    change.add_argument(
        "--history",
        action="store_true",
        help="with NAME: show its events (each change of its replicas, and why)",
    )
    change.add_argument(
        "--autoscale",
        type=autoscale_bounds,
        metavar="MIN:MAX[:TARGET[:DELAY]]",
        help="with NAME: its replicas follow its load, between MIN and MAX, TARGET requests in "
        "flight each, fewer DELAY seconds after a change (the last two: the server's defaults "
        "when left out)",
    )
    change.add_argument(
        "--no-autoscale",
        action="store_true",
        help="with NAME: turn its autoscaling off (its replicas stay what they are now)",
    )
    change.add_argument(
        "--canary",
        metavar="MODEL",
        help="with NAME and --weight: serve MODEL (another version of its model, as name:3) "
        "beside it, taking --weight percent of its requests; again, its weight moves",
    )
    change.add_argument(
        "--promote",
        action="store_true",
        help="with NAME: make its canary its version (the old version's replicas stop)",
    )
    change.add_argument(
        "--rollback",
        action="store_true",
        help="with NAME: roll its canary back (every request to its own version again)",
    )
    deployments.add_argument(
        "--weight",
        type=int,
        metavar="N",
        help="with --canary: percent of requests to the canary (0 to 100)",
    )
    deployments.add_argument(
        "--canary-replicas",
        type=int,
        metavar="N",
        help="with --canary: the canary's replicas (default 1)",
    )
    deployments.add_argument(
        "--auto-rollback",
        type=rollback_rule,
        metavar="RATE[:REQUESTS[:WINDOW]]",
        help="with --canary: roll it back by itself once more than RATE (0 to 1) of its "
        "requests failed, of at least REQUESTS in the last WINDOW seconds (the last two: the "
        "server's defaults, 10 and 60, when left out)",
    )
    predict = add(
        commands,
        "predict",
        "run a deployment's model on inputs",
        "Run the model of DEPLOYMENT (with --pipeline, the pipeline's deployments in order) on "
        "INPUT's items and print the outputs, a JSON array, one per item (--output json: the "
        "whole task, with its memo use and times). A failed task's error goes to standard "
        "error, exit code 1; an INPUT that is not a JSON array is exit code 2. With --async, "
        "print the task's id at once, for `trainyard task ID --wait`. With --stream (a "
        "streaming model, whose entry point is a generator function; INPUT one item), print "
        "each output as the model yields it, one JSON value a line; an error mid-stream goes "
        "to standard error, exit code 1.",
        cmd_predict,
        output,
    )
    predict.add_argument("deployment", metavar="DEPLOYMENT", help="the deployment (or pipeline)")
    predict.add_argument("input", metavar="INPUT", help=INPUT_HELP)
    predict.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="print the task's id without waiting for its result",
    )
    predict.add_argument(
        "--no-cache",
        action="store_true",
        help="run the model even on inputs whose result the memo holds",
    )
    predict.add_argument("--pipeline", action="store_true", help="DEPLOYMENT names a pipeline")
    predict.add_argument(
        "--stream",
        action="store_true",
        help="print each output as the streaming model yields it (INPUT: one item)",
    )
    task = add(
        commands,
        "task",
        "a task's state, result and times",
        "Show a task: its state (queued, running, succeeded, failed), its outputs or error, "
        "memo use, tries and times (request, invocation, inference). With --wait, wait for "
        "it to finish first; the exit code is then 1 if it failed. With --cancel, cancel it "
        "first (it fails, 'cancelled by its owner'; refused once it has finished).",
        cmd_task,
        output,
    )
    task.add_argument("task_id", metavar="ID", help="the task's id, as predict --async prints it")
    when = task.add_mutually_exclusive_group()
    when.add_argument("--wait", action="store_true", help="wait until the task has finished")
    when.add_argument(
        "--cancel",
        action="store_true",
        help="cancel the task: queued, no replica runs it; in a replica's call, the call "
        "finishes and its result is not kept",
    )

    group = commands.add_parser(
        "pipelines",
        help="chain deployments into pipelines",
        description="Pipelines: deployments run in order on one task, each step's outputs "
        "the next one's inputs (`trainyard predict NAME INPUT --pipeline`).",
    )
    pipelines = group.add_subparsers(title="commands", required=True, metavar="COMMAND")
    define = add(
        pipelines,
        "define",
        "define a pipeline of deployments",
        "Define pipeline NAME: the deployments STEP..., run in that order.",
        cmd_pipeline_define,
    )
    define.add_argument("name", metavar="NAME", help="the pipeline's name")
    define.add_argument("steps", metavar="STEP", nargs="+", help="a deployment, in order")
    show = add(
        pipelines, "show", "show a pipeline", "Show a pipeline's steps.", cmd_pipeline_show, output
    )
    show.add_argument("name", metavar="NAME", help="the pipeline")
    remove = add(
        pipelines,
        "rm",
        "remove a pipeline",
        "Remove pipeline NAME; its deployments stay.",
        cmd_pipeline_rm,
    )
    remove.add_argument("name", metavar="NAME", help="the pipeline")


def read_items(text: str, argument: str = "INPUT") -> list[Any]:
    """The items `argument` gives: a JSON array given inline, in a file (`@FILE`) or on
    standard input (`-`); UsageError saying what is wrong otherwise."""
    name = argument
    if text == "-":
        name, text = "standard input", sys.stdin.read()
    elif text.startswith("@"):
        name = text[1:]
        try:
            text = Path(name).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {name}: {exc}") from exc
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{name}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); {argument} "
            "is a JSON array of items, e.g. '[1, 2]'"
        ) from exc
    if not isinstance(items, list):
        raise UsageError(
            f"{name}: {argument} is a JSON array of items, e.g. '[1, 2]', not {_json_kind(items)}"
        )
    return items


def _json_kind(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "null" if value is None else "a number"


def deployment_text(view: dict[str, Any]) -> str:
    resources, serving = view["resources"], view["serving"]
    memo = f"on, keeping {serving['memo_max_entries']} results" if serving["memo"] else "off"
    text = render.fields(
        [
            ("name", view["name"]),
            ("model", f"{view['model']} (deployed as {view['reference']})"),
            ("entry point", view["entry_point"]),
            ("artifact sha256", view["artifact_sha256"]),
            ("state", view["state"]),
            ("replicas", view["replicas"]),
            (
                "autoscaling",
                "off" if view.get("autoscaling") is None else _autoscaled(view["autoscaling"]),
            ),
            (
                "resources",
                f"{resources['gpus']} GPU(s), {resources['cpus']:g} CPU(s), "
                f"{resources['memory_mb']} MiB, image {resources['image']}",
            ),
            (
                "batches",
                f"up to {serving['max_batch_size']} items, waiting up to "
                f"{serving['max_wait_ms']:g} ms",
            ),
            ("memo", memo),
            ("task timeout", f"{serving['task_timeout_s']:g} s"),
            ("created", view["created_at"]),
            ("updated", view["updated_at"]),
        ]
    )
    jobs = [
        (job["job_id"], view["version"], job["state"], job["attempt"])
        for job in view["replica_jobs"]
    ]
    canary = view.get("canary")
    if canary is not None:
        rule = canary["rollback"]
        text += "\n" + render.fields(
            [
                (
                    "canary",
                    f"{canary['model']} taking {canary['weight']}% of requests on "
                    f"{canary['replicas']} replica(s)",
                ),
                (
                    "auto rollback",
                    "off (by command only)"
                    if rule is None
                    else f"past {rule['max_error_rate']:g} failed, of at least "
                    f"{rule['min_requests']} requests in {rule['window_s']:g} s",
                ),
            ]
        )
        jobs += [
            (job["job_id"], canary["version"], job["state"], job["attempt"])
            for job in canary["replica_jobs"]
        ]
    if jobs:
        text += "\n\n" + render.table(["REPLICA JOB", "VERSION", "STATE", "ATTEMPT"], jobs)
    return text


def autoscale_bounds(text: str) -> dict[str, Any]:
    """--autoscale's MIN:MAX[:TARGET[:DELAY]] as `AsyncClient.autoscale`'s settings (the server
    checks their values)."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX[:TARGET[:DELAY]]")
    names = ("min_replicas", "max_replicas", "target_in_flight", "scale_down_delay_s")
    kinds: tuple[type[int] | type[float], ...] = (int, int, float, float)
    try:
        return {name: kind(part) for name, kind, part in zip(names, kinds, parts, strict=False)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX[:TARGET[:DELAY]]") from None


def rollback_rule(text: str) -> dict[str, Any]:
    """--auto-rollback's RATE[:REQUESTS[:WINDOW]] as `AsyncClient.set_canary`'s settings (the
    server checks their values)."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"{text!r} is not RATE[:REQUESTS[:WINDOW]]")
    names = ("max_error_rate", "min_requests", "window_s")
    kinds: tuple[type[int] | type[float], ...] = (float, int, float)
    try:
        return {name: kind(part) for name, kind, part in zip(names, kinds, parts, strict=False)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not RATE[:REQUESTS[:WINDOW]]") from None


def _autoscaled(autoscaling: dict[str, Any]) -> str:
    return (
        f"{autoscaling['min_replicas']} to {autoscaling['max_replicas']} replicas, "
        f"{autoscaling['target_in_flight']:g} request(s) in flight each, fewer "
        f"{autoscaling['scale_down_delay_s']:g} s after a change"
    )


def deployments_table(items: list[dict[str, Any]]) -> str:
    rows = [
        (
            item["name"],
            item["model"],
            item["replicas"],
            item["replica_jobs"],
            item["state"],
            item["created_at"],
        )
        for item in items
    ]
    return render.table(["NAME", "MODEL", "REPLICAS", "REPLICA JOBS", "STATE", "CREATED"], rows)


def history_table(history: list[dict[str, Any]]) -> str:
    rows = [
        (entry["at"], entry["event"], entry["actor"], json.dumps(entry["data"], sort_keys=True))
        for entry in history
    ]
    return render.table(["AT", "EVENT", "ACTOR", "DATA"], rows)


def metrics_text(figures: dict[str, Any]) -> str:
    memo, latency, batches = figures["memo"], figures["latency_ms"], figures["batches"]
    mean = batches["mean_size"]
    return render.fields(
        [
            ("deployment", figures["deployment"]),
            (
                "requests",
                f"{figures['requests']} ({figures['succeeded']} succeeded, "
                f"{figures['failed']} failed)",
            ),
            ("queue", f"{figures['queue_depth']} queued, {figures['running']} running"),
            (
                "memo",
                f"{memo['hits']} hit(s), {memo['misses']} miss(es), {memo['entries']} entries",
            ),
            (
                "latency",
                f"p50 {render.milliseconds(latency['p50'])}, "
                f"p99 {render.milliseconds(latency['p99'])}",
            ),
            (
                "batches",
                f"{batches['count']} of {batches['items']} item(s), mean size "
                f"{'-' if mean is None else f'{mean:.2f}'}, largest {batches['max_size'] or '-'}; "
                f"{batches['full']} left full, {batches['timeout']} after the wait, "
                f"{batches['idle']} at once to an idle replica",
            ),
            (
                "invocation",
                f"p50 {render.milliseconds(batches['invocation_ms']['p50'])}, "
                f"p99 {render.milliseconds(batches['invocation_ms']['p99'])}",
            ),
            (
                "inference",
                f"p50 {render.milliseconds(batches['inference_ms']['p50'])}, "
                f"p99 {render.milliseconds(batches['inference_ms']['p99'])}",
            ),
        ]
    )


def task_text(task: dict[str, Any]) -> str:
    times = task["times"]
    target = (
        f"pipeline {task['pipeline']} (step {task['step']})"
        if "pipeline" in task
        else f"deployment {task['deployment']}"
    )
    text = render.fields(
        [
            ("task", task["task_id"]),
            ("status", task["status"]),
            ("target", target),
            ("items", task["items"]),
            ("memo", task.get("memo")),
            ("tries", task.get("tries")),
            ("submitted", task.get("submitted_at")),
            ("finished", task.get("finished_at")),
            (
                "times",
                f"request {render.milliseconds(times['request_ms'])}, "
                f"invocation {render.milliseconds(times['invocation_ms'])}, "
                f"inference {render.milliseconds(times['inference_ms'])}",
            ),
        ]
    )
    if "outputs" in task:
        # JSON escapes every control character: the model's outputs are printed safely.
        text += f"\n\noutputs: {json.dumps(task['outputs'])}"
    if "error" in task:
        text += "\n\nerror:\n" + render.printable(task["error"], layout=True)
    return text


def pipeline_text(pipeline: dict[str, Any]) -> str:
    return render.fields(
        [
            ("name", pipeline["name"]),
            ("steps", " -> ".join(pipeline["steps"])),
            ("created", pipeline["created_at"]),
        ]
    )


def _failed(task: dict[str, Any]) -> int:
    """EXIT_FAILED, its error on standard error, for a failed task; else 0."""
    if task["status"] != "failed":
        return 0
    error = render.printable(task.get("error") or "no error recorded", layout=True)
    print(f"trainyard: task {task['task_id']} failed: {error}", file=sys.stderr)
    return EXIT_FAILED


async def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        view = await client.deploy(
            args.name,
            args.model,
            replicas=args.replicas,
            gpus=args.gpus,
            cpus=args.cpus,
            memory_mb=args.memory_mb,
            image=args.image,
            max_batch_size=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            # Only turning the memo off is a choice; otherwise the server's default stands.
            memo=False if args.no_memo else None,
            task_timeout_s=args.task_timeout,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_in_flight=args.target_in_flight,
            scale_down_delay_s=args.scale_down_delay,
            tenant=args.tenant,
        )
    autoscaling = view.get("autoscaling")
    if autoscaling is None:
        print(f"{view['name']} serves {view['model']} on {view['replicas']} replica(s)")
    else:
        print(f"{view['name']} serves {view['model']} on {_autoscaled(autoscaling)}")
    return 0


async def cmd_undeploy(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        view = await client.undeploy(args.name, tenant=args.tenant)
    print(f"{view['name']} {view['state']}")
    return 0


async def cmd_deployments(args: argparse.Namespace, settings: Settings) -> int:
    changes = (args.scale is not None, args.metrics, args.history, args.autoscale is not None)
    canary = (args.canary is not None, args.promote, args.rollback)
    if args.name is None and (any(changes) or args.no_autoscale or any(canary)):
        raise UsageError(
            "--scale, --metrics, --history, --autoscale, --no-autoscale, --canary, --promote "
            "and --rollback need a deployment's NAME"
        )
    canary_settings = (args.weight, args.canary_replicas, args.auto_rollback)
    if args.canary is None and any(setting is not None for setting in canary_settings):
        raise UsageError("--weight, --canary-replicas and --auto-rollback go with --canary")
    if args.canary is not None and args.weight is None:
        raise UsageError("--canary needs --weight (the percent of requests it takes)")
    async with client_for(args, settings) as client:
        if args.name is None:
            items = await client.deployments(tenant=args.tenant)
            if args.output == "json":
                print_json(items)
            else:
                print(deployments_table(items))
            return 0
        if args.metrics:
            figures = await client.deployment_metrics(args.name, tenant=args.tenant)
            if args.output == "json":
                print_json(figures)
            else:
                print(metrics_text(figures))
            return 0
        if args.history:
            history = await client.deployment_history(args.name, tenant=args.tenant)
            if args.output == "json":
                print_json(history)
            else:
                print(history_table(history))
            return 0
        if args.autoscale is not None:
            view = await client.autoscale(args.name, **args.autoscale, tenant=args.tenant)
        elif args.no_autoscale:
            view = await client.stop_autoscaling(args.name, tenant=args.tenant)
        elif args.canary is not None:
            view = await client.set_canary(
                args.name,
                args.canary,
                args.weight,
                replicas=args.canary_replicas,
                **(args.auto_rollback or {}),
                tenant=args.tenant,
            )
        elif args.promote:
            view = await client.promote_canary(args.name, tenant=args.tenant)
        elif args.rollback:
            view = await client.roll_back_canary(args.name, tenant=args.tenant)
        elif args.scale is not None:
            view = await client.scale(args.name, args.scale, tenant=args.tenant)
        else:
            view = await client.deployment(args.name, tenant=args.tenant)
    if args.output == "json":
        print_json(view)
    else:
        print(deployment_text(view))
    return 0


async def cmd_predict(args: argparse.Namespace, settings: Settings) -> int:
    if args.input == "-" and args.token_file == "-":
        raise UsageError("standard input holds INPUT or the token (--token-file -), not both")
    items = await asyncio.to_thread(read_items, args.input)
    if args.stream:
        return await _streamed(args, settings, items)
    async with client_for(args, settings) as client:
        task = await client.predict(
            args.deployment,
            items,
            asynchronous=args.asynchronous,
            no_cache=args.no_cache,
            pipeline=args.pipeline,
            tenant=args.tenant,
        )
    if args.output == "json":
        print_json(task)
    elif args.asynchronous:
        print(task["task_id"])
    elif task["status"] == "succeeded":
        print(json.dumps(task["outputs"]))
    # Asynchronously, the task has just begun (or the memo answered it): it has not failed.
    return 0 if args.asynchronous else _failed(task)


async def _streamed(args: argparse.Namespace, settings: Settings, items: list[Any]) -> int:
    """`predict --stream`: each output on a line of its own, printed as it comes."""
    if args.asynchronous or args.no_cache or args.pipeline:
        raise UsageError("--stream takes none of --async, --no-cache and --pipeline")
    async with client_for(args, settings) as client:
        outputs = client.stream_predict(args.deployment, items, tenant=args.tenant)
        try:
            async for output in outputs:
                print(json.dumps(output), flush=True)
        except PredictionFailed as failed:
            error = render.printable(str(failed), layout=True)
            print(
                f"trainyard: task {failed.task_id} failed after {failed.chunks} outputs: {error}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        finally:
            await outputs.aclose()
    return 0


async def cmd_task(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        if args.wait:
            task = await client.wait_task(args.task_id, tenant=args.tenant)
        elif args.cancel:
            task = await client.cancel_task(args.task_id, tenant=args.tenant)
        else:
            task = await client.task(args.task_id, tenant=args.tenant)
    if args.output == "json":
        print_json(task)
    else:
        print(task_text(task))
    return _failed(task) if args.wait else 0


async def cmd_pipeline_define(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        pipeline = await client.define_pipeline(args.name, args.steps, tenant=args.tenant)
    print(f"pipeline {pipeline['name']}: {' -> '.join(pipeline['steps'])}")
    return 0


async def cmd_pipeline_show(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        pipeline = await client.pipeline(args.name, tenant=args.tenant)
    if args.output == "json":
        print_json(pipeline)
    else:
        print(pipeline_text(pipeline))
    return 0


async def cmd_pipeline_rm(args: argparse.Namespace, settings: Settings) -> int:
    async with client_for(args, settings) as client:
        await client.remove_pipeline(args.name, tenant=args.tenant)
    print(f"removed pipeline {args.name}")
    return 0

"""`trainyard bench …`: the benchmarks' commands, which the front door (`cli.main`) defines only
when the benchmarks are there: they run from a checkout of the source, not from the installed
package. Each handler imports its benchmark, which prints JSON."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from controlplane.database import resolve_database
from controlplane.failures import EXIT_FAILED, EXIT_USAGE
from controlplane.settings import Settings


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the `bench` command group to the top-level subcommands."""
    bench = commands.add_parser(
        "bench", help="run a benchmark", description="Benchmarks that print JSON."
    )
    bench_commands = bench.add_subparsers(title="benchmarks", required=True, metavar="NAME")
    eventstore = bench_commands.add_parser(
        "eventstore",
        help="append throughput against raw inserts and the eventsourcing library",
        description="Measure appends (8 writers, one event per transaction; and 100 events per "
        "append) against plain asyncpg INSERTs and eventsourcing's PostgreSQL recorder, in one "
        "run, in a scratch database that is dropped afterwards.",
    )
    eventstore.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    eventstore.add_argument("--json", action="store_true", help="print only the JSON object")
    eventstore.set_defaults(handler=cmd_bench_eventstore)
    api = bench_commands.add_parser(
        "api",
        help="submit latency and SSE delivery latency of a served control plane",
        description="Start `trainyard serve` on a scratch database and submit jobs at a steady "
        "rate from concurrent clients, in turns with the same submits to the floor (a bare "
        "aiohttp server inserting one row a submit: the same run's reference); then hold many "
        "SSE subscribers while events are appended at a steady rate. Print latencies (p50, "
        "p99) and the submit p99's ratio to the floor's as JSON.",
    )
    api.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    api.add_argument("--rate", type=float, default=200.0, help="submits per second")
    api.add_argument("--subscribers", type=int, default=1000, help="open SSE streams")
    api.add_argument("--jobs", type=int, default=100, help="jobs the subscribers watch")
    api.add_argument("--event-rate", type=float, default=50.0, help="events appended per second")
    api.add_argument("--json", action="store_true", help="print only the JSON object")
    api.set_defaults(handler=cmd_bench_api)
    contract = bench_commands.add_parser(
        "contract",
        help="schemathesis against a served control plane: does the server keep its OpenAPI?",
        description="Start `trainyard serve` on a scratch database with a tenant, and run "
        "schemathesis against its /openapi.json: valid and invalid data, every phase (stateful "
        "too, following the document's links), every check, every route but the streams that "
        "last until a job ends. Prints JSON: cases, failures by check, errors, the seed "
        "(definitions: bench/api_contract.py). Needs schemathesis (the bench extra).",
    )
    contract.add_argument("--seed", type=int, default=20261128, help="schemathesis's seed")
    contract.add_argument(
        "--examples", type=int, default=100, help="generated cases per operation and phase"
    )
    contract.add_argument("--json", action="store_true", help="print only the JSON object")
    contract.set_defaults(handler=cmd_bench_contract)
    claims = bench_commands.add_parser(
        "claims",
        help="claim throughput, submit-to-running latency and log lines, against procrastinate",
        description="On scratch databases: 8 agents claiming from a queue of 10,000 jobs "
        "(claims/s, double claims from the log and the allocations); one real agent running "
        "small jobs submitted at a steady rate (submit to PROCESSING, p50 and p99); one "
        "learner's log lines stored per second; and the same no-op jobs enqueued, claimed and "
        "finished through Trainyard and through the procrastinate task queue. Prints JSON.",
    )
    claims.add_argument(
        "--seconds", type=float, default=10.0, help="for claiming, and for storing log lines"
    )
    claims.add_argument(
        "--only",
        action="append",
        choices=("claims", "latency", "logs", "peer"),
        metavar="PART",
        help="run only this part: claims, latency, logs or peer (repeatable; default: all)",
    )
    claims.add_argument("--json", action="store_true", help="print only the JSON object")
    claims.set_defaults(handler=cmd_bench_claims)
    overhead = bench_commands.add_parser(
        "overhead",
        help="training speed through the system against the bare script",
        description="Run the PyTorch example (runners.examples.classifier) bare, as a plain "
        "process, and as a job through the control plane and one node agent (process runtime, "
        "in this process, on a scratch database), alternating for some rounds; compare the "
        "training steps per second that the learner's own metric reports show (median), and "
        "report the checkpoint time and size. Prints JSON.",
    )
    overhead.add_argument(
        "--steps", type=int, default=12_000, help="training steps per run (at least 50)"
    )
    overhead.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="bare and system runs, alternated (one run varies by ~3%%)",
    )
    overhead.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="train on the CPU (one thread) or on a GPU, which the system run's agent finds "
        "with NVML and pins the learner to (default: cpu)",
    )
    overhead.add_argument("--json", action="store_true", help="print only the JSON object")
    overhead.set_defaults(handler=cmd_bench_overhead)
    docker = bench_commands.add_parser(
        "docker",
        help="learner container start through the Docker runtime against the docker CLI",
        description="Start the learner image's container through the Docker runtime (create, "
        "start, until its first log line) and with `docker run` of the same settings, "
        "alternating for some rounds (p50, p99, and our p50 over the CLI's); then submit "
        "no-op jobs to one Docker-runtime agent on a scratch database (submit to PROCESSING, "
        "p50 and p99). Needs a Docker engine and the learner image. Prints JSON.",
    )
    docker.add_argument("--rounds", type=int, default=30, help="container starts each way")
    docker.add_argument("--json", action="store_true", help="print only the JSON object")
    docker.set_defaults(handler=cmd_bench_docker)
    recovery = bench_commands.add_parser(
        "recovery",
        help="time to recover from kill -9 of each component (DLaaS Fig. 4, IDunno)",
        description="With real processes on a scratch database (a served control plane, two "
        "agents with a 3 s lease, their learners), kill -9 the control plane, an agent, a "
        "learner, a whole node (agent and learners) and the active manager's replica (with a "
        "standby), and time each recovery; print the medians, the settings, the targets and "
        "the DLaaS and IDunno figures as JSON (definitions: bench/recovery.py).",
    )
    recovery.add_argument("--trials", type=int, default=3, help="trials of each crash")
    recovery.add_argument("--json", action="store_true", help="print only the JSON object")
    recovery.set_defaults(handler=cmd_bench_recovery)
    failover = bench_commands.add_parser(
        "failover",
        help="kill -9 the primary of a Patroni-run Postgres under load and time the failover",
        description="Start etcd and two Patroni-run Postgres servers (a primary and a "
        "synchronous standby) of its own, a control plane and a process-runtime agent on them, "
        "jobs running, submitting and streaming logs; kill -9 the primary's postmaster and print "
        "what was lost, repeated or restarted and how long the API and the claims stopped, as "
        "JSON (definitions: bench/failover.py; needs patroni and etcd).",
    )
    failover.add_argument("--json", action="store_true", help="print only the JSON object")
    failover.set_defaults(handler=cmd_bench_failover)
    ddp = bench_commands.add_parser(
        "ddp",
        help="a job whose learners train together: rendezvous, a rank's failure, resume, scaling",
        description="One agent (process runtime, sandboxed when root) on the in-memory agent "
        "port, or with --nodes 2 two agents acting as two nodes in network namespaces made on "
        "this machine (root; on a scratch database of the configured Postgres, which they must "
        "reach by Unix socket, as the embedded one), running the digits example in "
        "DistributedDataParallel (gloo, CPU): one learner and two learners uninterrupted, then "
        "two whose rank 1 is SIGKILLed halfway. Prints rendezvous_s, rank_failure_stop_s, "
        "resume_exact, lost_steps and scaling_efficiency as JSON (definitions: bench/ddp.py).",
    )
    ddp.add_argument(
        "--nodes",
        type=int,
        choices=(1, 2),
        default=1,
        help="one agent, or two as two nodes (a learner on each; needs root)",
    )
    ddp.add_argument("--steps", type=int, default=60, help="training steps of each job")
    ddp.add_argument("--global-batch", type=int, default=64, help="images a step, all ranks")
    ddp.add_argument(
        "--checkpoint-every", type=int, default=10, metavar="STEPS", help="rank 0 saves every"
    )
    ddp.add_argument(
        "--step-seconds", type=float, default=0.1, help="a pause a step in the killed job"
    )
    ddp.add_argument("--json", action="store_true", help="print only the JSON object")
    ddp.set_defaults(handler=cmd_bench_ddp)
    registry = bench_commands.add_parser(
        "registry",
        help="model search latency and publications per second, against MLflow's registry",
        description="On scratch databases: publish MODELS x VERSIONS model versions with "
        "realistic metadata through the model repository, then run twelve mixed searches "
        "(free text, partial names, metric ranges, facets) REPEATS times each, checked "
        "against the reference evaluation; the same versions and searches through MLflow's "
        "model registry on the same Postgres when the `bench` extra is installed "
        "(ratio_vs_mlflow: its median over ours). Prints JSON (definitions: "
        "bench/model_repository.py).",
    )
    registry.add_argument("--models", type=int, default=1000, help="models to publish")
    registry.add_argument("--versions", type=int, default=10, help="versions of each model")
    registry.add_argument("--repeats", type=int, default=20, help="runs of each search")
    registry.add_argument("--json", action="store_true", help="print only the JSON object")
    registry.set_defaults(handler=cmd_bench_registry)
    serving = bench_commands.add_parser(
        "serving",
        help="model serving throughput and latency against Ray Serve and BentoML; kill -9 "
        "of async tasks",
        description="With real processes on a scratch database (a served control plane, one "
        "process-runtime agent): publish a PyTorch MLP (784-256-10, CPU) and a no-op model, "
        "serve the MLP with 2 replicas (batches of up to 8, 5 ms wait, memo off) under "
        "closed-loop clients at concurrency 1, 8, 32 and 256 (tail_growth: p99 at 256 over "
        "p99 at 1), and Ray Serve and BentoML serving "
        "the same model with the same settings in the same run (when the `bench` extra is "
        "installed); the same at concurrency 32 without batching (batching_gain), the no-op "
        "model's latency, memo hits' latency; then asynchronous tasks while a replica, the "
        "agent and the control plane are killed with SIGKILL, counting the tasks lost, "
        "duplicated and retried and checking every output. Prints JSON (definitions: "
        "bench/serving.py).",
    )
    serving.add_argument(
        "--duration",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds measured at each concurrency, after a warm-up of up to 2 s (default: 10)",
    )
    serving.add_argument(
        "--tasks",
        type=int,
        default=200,
        metavar="N",
        help="asynchronous tasks of the kill -9 run (default: 200)",
    )
    serving.add_argument("--no-peers", action="store_true", help="leave Ray Serve and BentoML out")
    serving.add_argument("--json", action="store_true", help="print only the JSON object")
    serving.set_defaults(handler=cmd_bench_serving)
    autoscale = bench_commands.add_parser(
        "autoscale",
        help="how long an autoscaled deployment takes to follow its load",
        description="With real processes on a scratch database (a served control plane, one "
        "process-runtime agent): an autoscaled deployment (0 to 4 replicas, 1 request in "
        "flight each) of a model that sleeps 50 ms per call; cold_start_s: from zero replicas, "
        "a synchronous prediction's time to its answer; scale_up_s: then, under --clients "
        "closed-loop clients, from the load's start until a new replica answers; "
        "scale_to_zero_s: from the load's end until no replica is left. Prints JSON "
        "(definitions: bench/autoscale.py).",
    )
    autoscale.add_argument(
        "--clients",
        type=int,
        default=4,
        metavar="N",
        help="closed-loop clients of the load (default: 4)",
    )
    autoscale.add_argument("--json", action="store_true", help="print only the JSON object")
    autoscale.set_defaults(handler=cmd_bench_autoscale)
    inference = bench_commands.add_parser(
        "inference",
        help="IDunno's experiment: two inference jobs in fair time, a replica and the control "
        "plane killed",
        description="With real processes on a scratch database (a served control plane, two "
        "process-runtime agents): endless inference jobs of ResNet18 and AlexNet (random "
        "weights, batches of 16 generated images, 2 replicas each): the second job's start, "
        "the ratio of their query rates at weights 1:1 and 2:1, the time until the cluster's "
        "rate is back to 90 % after a kill -9 of a replica and of the control plane, queries "
        "lost and results duplicated, and the statistics checked against the audit view. "
        "Prints JSON (definitions: bench/inference.py).",
    )
    inference.add_argument(
        "--window",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds over which the jobs' rates are compared (default: 30)",
    )
    inference.add_argument(
        "--size",
        type=int,
        default=224,
        metavar="PX",
        help="the generated images' height and width (default: 224)",
    )
    inference.add_argument(
        "--warm",
        type=int,
        default=1,
        metavar="N",
        help="warm sandboxes each agent keeps ready, with torch imported (`trainyard agent "
        "--warm N --warm-import torch`); 0: every replica starts cold (default: 1)",
    )
    inference.add_argument("--json", action="store_true", help="print only the JSON object")
    inference.set_defaults(handler=cmd_bench_inference)
    simulation = bench_commands.add_parser(
        "simulate",
        help="record a run of many short jobs on fake-GPU agents, then replay it",
        description="With real processes on a scratch database (a served control plane, "
        "process-runtime agents with fake GPUs): one-GPU jobs of three tenants (weights 1, 2, "
        "3; some of priority 1) running `sleep`, a burst and then at the cluster's "
        "pace, until all have ended; then the log replayed by the scheduling simulator under "
        "the current policy: its speed against real time, how closely it reproduces the "
        "recorded start order and times, whether three replays agree, and each policy's "
        "figures. Prints JSON (definitions: bench/simulate.py).",
    )
    simulation.add_argument(
        "--jobs", type=int, default=2000, metavar="N", help="jobs recorded (default: 2000)"
    )
    simulation.add_argument(
        "--agents", type=int, default=3, metavar="N", help="node agents (default: 3)"
    )
    simulation.add_argument(
        "--gpus", type=int, default=4, metavar="N", help="fake GPUs per agent (default: 4)"
    )
    simulation.add_argument(
        "--seed", type=int, default=17, help="the jobs' random generator's seed (default: 17)"
    )
    simulation.add_argument(
        "--claim-queue",
        type=int,
        default=6000,
        metavar="N",
        help="the queue's depth while claims are timed with and without the pending reasons "
        "(default: 6000)",
    )
    simulation.add_argument(
        "--claim-seconds",
        type=float,
        default=4.0,
        metavar="S",
        help="how long each round of those claims is timed (default: 4)",
    )
    simulation.add_argument("--json", action="store_true", help="print only the JSON object")
    simulation.set_defaults(handler=cmd_bench_simulate)
    searches = bench_commands.add_parser(
        "search",
        help="searches: trial efficiency, next-trial latency, kill -9 of the control plane, "
        "ASHA's compute",
        description="With real processes on a scratch database (a served control plane, two "
        "process-runtime agents of one fake GPU each): a random search of 1 s trials, two at a "
        "time (trial_efficiency: ideal time over the search's time; next_trial_ms: a trial's "
        "end to the next trial's DEPLOYING, p50 and p99; where the time goes); a second search "
        "while the control plane is killed with SIGKILL and restarted (lost_trials and "
        "duplicate_trials, counted with SQL over the event log); then, in this process, ASHA "
        "against random search and Optuna on the digits search (bench/search_quality.py). "
        "Prints JSON (definitions: bench/search.py).",
    )
    searches.add_argument(
        "--trials",
        type=int,
        default=64,
        metavar="N",
        help="trials of the first search (default: 64)",
    )
    searches.add_argument(
        "--kills",
        type=int,
        default=5,
        metavar="N",
        help="kill -9s of the control plane during the second search (default: 5)",
    )
    searches.add_argument(
        "--kill-trials",
        type=int,
        default=24,
        metavar="N",
        help="trials of the second search (default: 24)",
    )
    searches.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the searchers' seed, the kills' random moments' and the digits search's (default: 0)",
    )
    searches.add_argument(
        "--skip-quality",
        action="store_true",
        help="leave out the digits search (asha_compute_ratio, best_accuracy, "
        "optuna_best_accuracy)",
    )
    searches.add_argument("--json", action="store_true", help="print only the JSON object")
    searches.set_defaults(handler=cmd_bench_search)
    ui = bench_commands.add_parser(
        "ui",
        help="the dashboard's data with a big history: page times, first load, SSE resumption",
        description="Start `trainyard serve` on a scratch database holding --jobs jobs of one "
        "tenant, sign in to the dashboard, and time the jobs page's data (GET /v1/jobs with its "
        "total: pages by cursor, filtered by state and label) and a job page's (its four reads "
        "at once), p95; the first load's bytes (the page, its scripts and styles, the session, "
        "the first jobs page, compressed as sent); and a job's log stream dropped and resumed "
        "--reconnects times (lines missed or doubled). Prints JSON (definitions: bench/ui.py).",
    )
    ui.add_argument("--jobs", type=int, default=100_000, metavar="N", help="jobs in the database")
    ui.add_argument(
        "--requests", type=int, default=200, metavar="N", help="requests timed per page"
    )
    ui.add_argument("--reconnects", type=int, default=5, metavar="N", help="forced SSE reconnects")
    ui.add_argument("--json", action="store_true", help="print only the JSON object")
    ui.set_defaults(handler=cmd_bench_ui)
    scale = bench_commands.add_parser(
        "scale",
        help="hot paths' p99 with 1,000 nodes, 10,000 queued jobs and 10 k to 10 M events",
        description="For each size of history (databases trainyard_scale_10k, _1m and _10m "
        "on the configured server, see --database-prefix; filled on first use with finished "
        "jobs through the store's batch append, and kept for later runs), start `trainyard "
        "serve`, register --nodes simulated agents (8 fake GPUs each, heartbeating), queue "
        "--queued jobs, and measure claims, submits, statuses, filtered lists, SSE to "
        "--subscribers streams, projection lag, a restart's time to ready, an agent's "
        "reconcile, the rebuild (at the fill) and the database's size; plots as PNG under "
        "--out. Prints JSON.",
    )
    scale.add_argument(
        "--sizes",
        default="10k,1m,10m",
        help="sizes of history to measure, smallest first, from 10k, 1m and 10m",
    )
    scale.add_argument("--nodes", type=int, default=1000, help="simulated agents")
    scale.add_argument("--queued", type=int, default=10_000, help="jobs waiting in the queue")
    scale.add_argument(
        "--seconds", type=float, default=20.0, help="of claims, and of submits (SSE: half)"
    )
    scale.add_argument("--subscribers", type=int, default=5000, help="open SSE streams")
    scale.add_argument(
        "--out", type=Path, default=Path(".artifacts/bench-scale"), help="where the PNGs go"
    )
    scale.add_argument(
        "--database-prefix",
        default="trainyard_scale",
        help="the kept databases are named PREFIX_10k, PREFIX_1m and PREFIX_10m",
    )
    scale.add_argument(
        "--no-pooler",
        action="store_true",
        help="leave out the fleet through pgBouncer (twenty real agents, about 80 s)",
    )
    scale.add_argument("--json", action="store_true", help="print only the JSON object")
    scale.set_defaults(handler=cmd_bench_scale)
    logs = bench_commands.add_parser(
        "logs",
        help="log search latency over 10 M lines, and ingestion with and without its index",
        description="In a database kept on the configured server for later runs (PREFIX_SIZE, "
        "see --database-prefix; filled on first use), --size stored log lines of many jobs of "
        "several tenants: search p50/p95 of the largest tenant's lines for a rare and a common "
        "substring and a regular expression, and log lines stored per second with the search "
        "index and without it (same run, same table; the ingested lines are rolled back). "
        "Prints JSON (definitions: bench/logs.py).",
    )
    logs.add_argument("--size", type=int, default=10_000_000, help="stored lines (at least 10,000)")
    logs.add_argument("--searches", type=int, default=20, help="timed searches per pattern")
    logs.add_argument("--seconds", type=float, default=10.0, help="of ingestion, per variant")
    logs.add_argument(
        "--database-prefix",
        default="trainyard_logs",
        help="the kept database is named PREFIX_SIZE",
    )
    logs.add_argument("--json", action="store_true", help="print only the JSON object")
    logs.set_defaults(handler=cmd_bench_logs)


async def cmd_bench_eventstore(args: argparse.Namespace, settings: Settings) -> int:
    from bench.eventstore import run

    url = await resolve_database(settings)
    result = await run(url, seconds=args.seconds, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_api(args: argparse.Namespace, settings: Settings) -> int:
    from bench.api import run

    url = await resolve_database(settings)
    result = await run(
        url,
        seconds=args.seconds,
        rate=args.rate,
        subscribers=args.subscribers,
        jobs=args.jobs,
        event_rate=args.event_rate,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_contract(args: argparse.Namespace, settings: Settings) -> int:
    from bench.api_contract import run

    if args.examples < 1:
        print("trainyard: --examples must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(url, seed=args.seed, max_examples=args.examples, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0 if not result["failures"] and not result["errors"] else EXIT_FAILED


async def cmd_bench_claims(args: argparse.Namespace, settings: Settings) -> int:
    from bench.claims import PARTS, run

    url = await resolve_database(settings)
    result = await run(url, seconds=args.seconds, parts=args.only or PARTS, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_overhead(args: argparse.Namespace, settings: Settings) -> int:
    from bench.overhead import run

    # The example reports every 25 steps; the speed needs two reports.
    if args.steps < 50 or args.rounds < 1:
        print("trainyard: --steps must be at least 50 and --rounds at least 1", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url, steps=args.steps, rounds=args.rounds, device=args.device, progress=not args.json
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_docker(args: argparse.Namespace, settings: Settings) -> int:
    from bench.docker import EngineMissing, run

    if args.rounds < 2:
        print("trainyard: --rounds must be at least 2", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    try:
        result = await run(url, rounds=args.rounds, progress=not args.json)
    except EngineMissing as exc:
        print(f"trainyard bench docker: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_recovery(args: argparse.Namespace, settings: Settings) -> int:
    from bench.recovery import run

    if args.trials < 1:
        print("trainyard: --trials must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(url, trials=args.trials, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_failover(args: argparse.Namespace, settings: Settings) -> int:
    from bench.failover import run
    from harness.ha import HaUnavailable

    try:
        result = await run(progress=not args.json)
    except HaUnavailable as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_ddp(args: argparse.Namespace, settings: Settings) -> int:
    from bench.ddp import run
    from bench.ddp_agents import BenchFailed

    if min(args.steps, args.global_batch, args.checkpoint_every) < 1 or args.steps < 4:
        print(
            "trainyard: --steps must be at least 4, --global-batch and --checkpoint-every at "
            "least 1",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.global_batch % 2 or args.step_seconds < 0:
        print(
            "trainyard: --global-batch must be even, --step-seconds not negative", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        result = await run(
            steps=args.steps,
            global_batch=args.global_batch,
            checkpoint_every=args.checkpoint_every,
            step_seconds=args.step_seconds,
            nodes=args.nodes,
            database=await resolve_database(settings) if args.nodes == 2 else None,
            progress=not args.json,
        )
    except BenchFailed as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_registry(args: argparse.Namespace, settings: Settings) -> int:
    from bench.model_repository import run

    if min(args.models, args.versions, args.repeats) < 1:
        print("trainyard: --models, --versions and --repeats must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url,
        models=args.models,
        versions=args.versions,
        repeats=args.repeats,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_serving(args: argparse.Namespace, settings: Settings) -> int:
    from bench.serving import run

    if args.duration <= 0 or args.tasks < 1:
        print("trainyard: --duration must be > 0 and --tasks at least 1", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url,
        duration_s=args.duration,
        tasks=args.tasks,
        peers=not args.no_peers,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_autoscale(args: argparse.Namespace, settings: Settings) -> int:
    from bench.autoscale import run

    if not 2 <= args.clients <= 256:
        print("trainyard: --clients must be 2 to 256", file=sys.stderr)
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(url, clients=args.clients, progress=not args.json)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_inference(args: argparse.Namespace, settings: Settings) -> int:
    from bench.inference import run

    if args.window <= 0 or not 32 <= args.size <= 1024 or args.warm < 0:
        print(
            "trainyard: --window must be > 0, --size 32 to 1024 and --warm at least 0",
            file=sys.stderr,
        )
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url, window_s=args.window, size=args.size, warm=args.warm, progress=not args.json
    )
    print(json.dumps(result, indent=None if args.json else 2, default=str))
    return 0


async def cmd_bench_simulate(args: argparse.Namespace, settings: Settings) -> int:
    from bench.simulate import run

    if min(args.jobs, args.agents, args.gpus, args.claim_queue) < 1 or args.claim_seconds <= 0:
        print(
            "trainyard: --jobs, --agents, --gpus and --claim-queue must be at least 1, "
            "--claim-seconds more than 0",
            file=sys.stderr,
        )
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url,
        jobs=args.jobs,
        agents=args.agents,
        gpus=args.gpus,
        seed=args.seed,
        claim_queue=args.claim_queue,
        claim_seconds=args.claim_seconds,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_search(args: argparse.Namespace, settings: Settings) -> int:
    from bench.search import run

    if args.trials < 1 or args.kill_trials < 1 or args.kills < 0 or args.seed < 0:
        print(
            "trainyard: --trials and --kill-trials must be at least 1, --kills and --seed at "
            "least 0",
            file=sys.stderr,
        )
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url,
        trials=args.trials,
        kills=args.kills,
        kill_trials=args.kill_trials,
        seed=args.seed,
        quality=not args.skip_quality,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


async def cmd_bench_ui(args: argparse.Namespace, settings: Settings) -> int:
    from bench.ui import run

    if args.jobs < 1 or args.requests < 2 or args.reconnects < 0:
        print(
            "trainyard: --jobs must be at least 1, --requests at least 2, --reconnects at least 0",
            file=sys.stderr,
        )
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url,
        jobs=args.jobs,
        requests=args.requests,
        reconnects=args.reconnects,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


DATABASE_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,39}")


async def cmd_bench_scale(args: argparse.Namespace, settings: Settings) -> int:
    from bench.scale import run
    from bench.scale_fill import SIZES

    sizes = args.sizes.split(",")
    if not sizes or any(size not in SIZES for size in sizes):
        print(f"trainyard: --sizes takes some of {', '.join(SIZES)}", file=sys.stderr)
        return EXIT_USAGE
    if args.nodes < 1 or args.queued < 1 or args.seconds <= 0 or args.subscribers < 1:
        print(
            "trainyard: --nodes, --queued, --seconds and --subscribers must be positive",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not _database_prefix_ok(args.database_prefix):
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run(
        url,
        sizes=sizes,
        nodes=args.nodes,
        queued=args.queued,
        seconds=args.seconds,
        subscribers=args.subscribers,
        out=args.out,
        homes=settings.home / "bench-scale",
        prefix=args.database_prefix,
        pooler=not args.no_pooler,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def _database_prefix_ok(prefix: str) -> bool:
    """Whether a benchmark's --database-prefix is a plain identifier (it names databases the
    benchmark creates and drops); says why not on stderr."""
    if DATABASE_PREFIX.fullmatch(prefix):
        return True
    print(
        "trainyard: --database-prefix takes lowercase letters, digits and _ (at most 40, "
        "a letter or _ first)",
        file=sys.stderr,
    )
    return False


async def cmd_bench_logs(args: argparse.Namespace, settings: Settings) -> int:
    from bench.logs import run_search

    if args.size < 10_000 or args.searches < 1 or args.seconds <= 0:
        print(
            "trainyard: --size must be at least 10000, --searches and --seconds positive",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not _database_prefix_ok(args.database_prefix):
        return EXIT_USAGE
    url = await resolve_database(settings)
    result = await run_search(
        url,
        lines=args.size,
        searches=args.searches,
        seconds=args.seconds,
        database=f"{args.database_prefix}_{args.size}",
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))
    return 0

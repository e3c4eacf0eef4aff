"""`trainyard bench search`: searches (controlplane/searches) with real processes on a scratch
database: how much of two agent slots a search of short trials keeps busy, how soon a trial's
end starts the next one, whether kill -9s of the control plane during a search lose or
duplicate a trial; and, in-process, how good ASHA is on the digits search (bench/search_quality.py).

The cluster (`harness.processes`): a control plane process (`trainyard serve`: its search
driver, projections and lifecycle manager) and two node agents (`trainyard agent`, process
runtime, one fake GPU each, lease TTL LEASE_TTL_S). A trial's job needs one GPU (and a CPU), so
each agent runs one trial at a time: SLOTS slots. A trial's learner is
`python -c TRIAL_SCRIPT`: it reads TRAINYARD_HPARAMS, sleeps TRIAL_S, then reports its metric
(`runners.metrics.log(step=budget, score=...)`) and exits; the agent starts it through the
learner launcher (`runners.launch`, a Python process of its own) as it starts any learner. Each
search is random search over one real parameter, a budget of 1 step, `max_concurrent_trials`
SLOTS, `max_failed_trials` 0, trials' `max_restarts` 0 (any failure shows), submitted with
`POST /v1/searches` by tenant `recovery` (the harness's). Every figure is computed from the event
log (`events`) after the search has ended: instants are the events' own `at` (the clock of the
process that decided them: the driver's, the agents'), stage breakdowns the rows' `recorded_at`
(the appending transaction's start).

First search (`trials` trials, default 64), made twice, the same way: on agents that start each
trial's sandbox as it is claimed (`cold`, its figures under that key), then on agents that keep
one warm sandbox ready each (WARM: `node_agent.warm`), whose figures are the top level's;
`warm_speedup` = the cold search's search_s / the warm one's.

- trial_efficiency: ideal_s / search_s. ideal_s = trials x TRIAL_S / SLOTS (the trials' sleeps,
  back to back on both slots); search_s = from the first TrialCreated's `at` (recorded with the
  submission) to the SearchEnded's `at`. Target >= 0.87 (Ray Tune's published figure). Every
  second of a trial beyond its sleep counts against it: the learner launcher's and the trial
  command's interpreter start-ups included.
- per_trial_overhead_s: where a slot's time beyond the sleeps went, medians over the trials:
  `in_job` = a trial job's JobCompleted `at` - its JobDeploying `at` - TRIAL_S (claimed to
  completed, less the sleep), split into `deploying_to_processing` (the agent starts the
  launcher, which reports DOWNLOADING then PROCESSING: the launcher's own start-up) and
  `processing_to_completed_less_sleep` (the command's interpreter start-up, `runners.metrics`'
  import, its exit, STORING, the agent storing the job's last log lines and recording the end);
  `between_trials` = next_trial_ms's p50 in seconds.
- next_trial_ms: `p50`, `p99`, `max` and `samples` of, for each trial created after a trial
  ended, the finished trial's job's JobCompleted `at` to the new trial's job's (first)
  JobDeploying `at`. Each new trial is paired with the trial whose end the searcher recorded
  (TrialRungFinished) in the same append as its TrialCreated, oldest first. `next_trial_p99_ms`
  is its p99. Target p99 <= 200. `max_stages`: the slowest gap's stages (as below, its own).
- next_trial_stages_ms: medians of that gap's stages, by `recorded_at`: `driver` (JobCompleted
  to the TrialCreated: the search driver woke, read the job's end and metric, decided and
  appended), `submit` (TrialCreated to the new job's JobSubmitted) and `claim` (JobSubmitted to
  JobDeploying: the jobs projection queued it, NOTIFY woke the agent, the agent claimed).
- in_job_stages_ms: medians of `in_job`'s stages, in milliseconds (IN_JOB_STAGES).

Second search (`kill_trials` trials, default 24), during which the control plane is killed with
SIGKILL `kills` times (default 5) and, DOWN_S later, started again (same port; `start` returns
once its /readyz answers 200). The kills' moments are drawn from `random.Random(seed)`, against
the search's own progress so that each falls within it whatever the outages cost: kill k comes
once the search's trial jobs have completed n_k times (n_k uniform in 1 .. kill_trials - SLOTS -
1, the draws sorted), then after a delay: for about half of the kills (AIMED_SHARE, drawn),
uniform in [0, AIM_S] (`aimed`: in the window where the driver records the trial's end and
creates and submits the next trial), for the others uniform in [0, pace] (`random`: pace is a
slot's time per trial in the first search, so the kill falls anywhere before the next trial
ends or soon after). A kill that the search's end comes before is not made: `kills_made` says
how many were; `kill_moments` when (seconds after the submission), of which kind, after which
trial end and delay, and how many trials had been created by then. Then, counted with SQL over
`events` (LOST_SQL, DUPLICATES_SQL):

- lost_trials: of the trial numbers 0 .. kill_trials - 1, those not done, where done means: a
  TrialCreated with that number, its (latest) job has a JobCompleted, and the search recorded
  its result (TrialRungFinished at that rung); plus one when the search has not ended
  `completed` (waited for up to twice its expected time, at the first search's pace, plus
  SETTLE_S). `lost` breaks it down: `never_created`,
  `job_never_submitted`, `job_never_ended`, `not_done`, `search_state`.
- duplicate_trials: the sum of `duplicates`: `trials_created_twice` (TrialCreated events beyond
  one per number), `trials_beyond_max` (distinct trial numbers beyond max_trials),
  `jobs_submitted_twice` (JobSubmitted events of the search's trials beyond one per (trial,
  rung), whatever their job ids) and `results_recorded_twice` (TrialRungFinished beyond one per
  (trial, rung)).
- failed_trials (TrialFailed events) and trial_reattempts (JobDeploying events of the search's
  trial jobs beyond one per job: restarts, rollbacks), for context: both should be 0.
- kill_search: the second search's trial_efficiency and next_trial_ms, for context (the
  outages are in them).

From bench/search_quality.py (in-process, after the cluster is gone; left out with
`quality=False`), defined there, with `seed`: asha_compute_ratio (target <= 0.34), best_accuracy
(ASHA's), random_best_accuracy, asha_reached_random_best (whether ASHA's best reached random
search's: when it did not, the ratio is ASHA's whole compute over random's), optuna_best_accuracy
(Optuna's TPE with its successive-halving pruner, for context; null without Optuna, the `bench`
extra, and `quality.optuna.missing` says so), and both reports whole under `quality`.

`targets` holds each figure's target; `cpus` and `load_average_1m` the machine's state (every
figure counts process start-ups, slower on a busy machine).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg

from bench.scratch import scratch_database
from controlplane.database import create_pool
from controlplane.jobs.images import DEFAULT_IMAGES
from controlplane.searches.streams import search_stream
from harness.processes import Cluster, cluster
from harness.served import ServedControlPlane
from trainyard.api import ApiClient

TRIAL_S = 1.0
"""How long a trial's command sleeps before it reports its metric."""
SLOTS = 2
"""Trials running at once: two agents of one fake GPU each, trials of one GPU each."""
WARM = ("--warm", "1")
"""How the agents of the measured search run: each keeps a warm sandbox ready, so a trial starts
without waiting for its sandbox, its interpreter or its launcher's imports (`cold`: the same
search before it, on agents without)."""
LEASE_TTL_S = 5.0
HEARTBEAT_S = 0.5
DOWN_S = 0.5
"""How long a killed control plane stays down before it is started again."""
AIM_S = 0.05
"""An aimed kill comes within this long after a trial job's JobCompleted is seen (the driver
records the end and submits the next trial within some tens of milliseconds)."""
AIMED_SHARE = 0.5
"""The share of kills aimed at a trial's end (the others fall at a random moment)."""
PROBE_S = 0.005
"""How often a kill waiting for its trial end looks again."""
SETTLE_S = 120.0
"""How long past its expected end a search may take before it is called stuck."""
DEFAULT_TRIALS = 64
DEFAULT_KILL_TRIALS = 24
DEFAULT_KILLS = 5
TARGETS = {
    "trial_efficiency": ">= 0.87",
    "next_trial_p99_ms": "<= 200",
    "lost_trials": "0",
    "duplicate_trials": "0",
    "asha_compute_ratio": "<= 0.34",
}

TRIAL_SCRIPT = f"""
import json, os, time
from runners import metrics
hparams = json.loads(os.environ["TRAINYARD_HPARAMS"])
time.sleep({TRIAL_S})
metrics.log(step=int(os.environ["TRAINYARD_BUDGET"]), score=-(hparams["x"] - 3) ** 2)
"""

SEARCH_SQL = """
SELECT stream_version, type, (data->>'number')::int AS number,
       coalesce((data->>'rung')::int, 0) AS rung, (data->>'job_id')::uuid AS job_id,
       data->>'state' AS state, (data->>'at')::timestamptz AS at, recorded_at
FROM events WHERE stream_id = $1 ORDER BY stream_version
"""
"""The search's own stream, in order."""

TRIAL_JOBS_SQL = """
WITH streams AS (
    SELECT 'job-' || (data->>'job_id') AS stream_id FROM events
    WHERE stream_id = $1 AND type IN ('TrialCreated', 'TrialPromoted')
    UNION
    SELECT stream_id FROM events
    WHERE type = 'JobSubmitted' AND data->'manifest'->'trial'->>'search_id' = $2
)
SELECT e.stream_id, e.type, (e.data->>'at')::timestamptz AS at, e.recorded_at
FROM events e JOIN streams s USING (stream_id)
ORDER BY e.stream_id, e.stream_version
"""
"""Every event of the search's trial jobs: those the search named, and any other job submitted
as one of its trials."""

LOST_SQL = """
WITH decided AS (
    SELECT DISTINCT ON ((data->>'number')::int)
           (data->>'number')::int AS number, coalesce((data->>'rung')::int, 0) AS rung,
           'job-' || (data->>'job_id') AS job_stream
    FROM events
    WHERE stream_id = $1 AND type IN ('TrialCreated', 'TrialPromoted')
    ORDER BY (data->>'number')::int, stream_version DESC
), done AS (
    SELECT d.number FROM decided d
    WHERE EXISTS (SELECT 1 FROM events e
                  WHERE e.stream_id = d.job_stream AND e.type = 'JobCompleted')
      AND EXISTS (SELECT 1 FROM events e
                  WHERE e.stream_id = $1 AND e.type = 'TrialRungFinished'
                    AND (e.data->>'number')::int = d.number AND (e.data->>'rung')::int = d.rung)
)
SELECT
    (SELECT count(*) FROM generate_series(0, $2 - 1) n
     WHERE n NOT IN (SELECT number FROM done)) AS not_done,
    (SELECT count(*) FROM generate_series(0, $2 - 1) n
     WHERE n NOT IN (SELECT number FROM decided)) AS never_created,
    (SELECT count(*) FROM decided d
     WHERE NOT EXISTS (SELECT 1 FROM events e
                       WHERE e.stream_id = d.job_stream AND e.type = 'JobSubmitted'))
        AS job_never_submitted,
    (SELECT count(*) FROM decided d
     WHERE NOT EXISTS (SELECT 1 FROM events e
                       WHERE e.stream_id = d.job_stream
                         AND e.type IN ('JobCompleted', 'JobFailed', 'JobCancelled')))
        AS job_never_ended,
    (SELECT data->>'state' FROM events
     WHERE stream_id = $1 AND type = 'SearchEnded') AS search_state
"""
"""$1: the search's stream; $2: its max_trials. A random search must run every trial to its
end: one not done is lost."""

DUPLICATES_SQL = """
WITH created AS (
    SELECT (data->>'number')::int AS number FROM events
    WHERE stream_id = $1 AND type = 'TrialCreated'
), submitted AS (
    SELECT (data->'manifest'->'trial'->>'number')::int AS number,
           (data->'manifest'->'trial'->>'rung')::int AS rung
    FROM events
    WHERE type = 'JobSubmitted' AND data->'manifest'->'trial'->>'search_id' = $2
), finished AS (
    SELECT (data->>'number')::int AS number, (data->>'rung')::int AS rung FROM events
    WHERE stream_id = $1 AND type = 'TrialRungFinished'
), trial_jobs AS (
    SELECT 'job-' || (data->>'job_id') AS stream_id FROM events
    WHERE stream_id = $1 AND type IN ('TrialCreated', 'TrialPromoted')
)
SELECT
    (SELECT count(*) - count(DISTINCT number) FROM created) AS trials_created_twice,
    (SELECT greatest(count(DISTINCT number) - $3, 0) FROM created) AS trials_beyond_max,
    (SELECT count(*) - count(DISTINCT (number, rung)) FROM submitted) AS jobs_submitted_twice,
    (SELECT count(*) - count(DISTINCT (number, rung)) FROM finished) AS results_recorded_twice,
    (SELECT count(*) FROM events
     WHERE stream_id = $1 AND type = 'TrialFailed') AS failed_trials,
    (SELECT count(*) - count(DISTINCT stream_id) FROM events
     WHERE type = 'JobDeploying' AND stream_id IN (SELECT stream_id FROM trial_jobs))
        AS trial_reattempts
"""
"""$1: the search's stream; $2: its id (text); $3: its max_trials."""

TRIAL_ENDS_SQL = """
SELECT count(*) FROM events
WHERE type = 'JobCompleted'
  AND stream_id IN (SELECT 'job-' || (data->>'job_id') FROM events
                    WHERE stream_id = $1 AND type IN ('TrialCreated', 'TrialPromoted'))
"""

JOB_PHASES = ("JobDeploying", "JobDownloading", "JobProcessing", "JobStoring", "JobCompleted")
IN_JOB_STAGES = (
    "deploying_to_downloading",
    "downloading_to_processing",
    "processing_to_storing_less_sleep",
    "storing_to_completed",
    "storing_recorded_after",
    "completed_recorded_after",
)
"""`in_job_stages_ms`, a trial job's time in its job split by its phases' events: the spans
between consecutive `at`s (DOWNLOADING's, PROCESSING's and STORING's are the launcher's own
instants, as it reports each; the others the agent's), the sleep taken out of PROCESSING's; then
how long after its `at` the agent's transaction that recorded STORING, and COMPLETED, began
(`recorded_at`)."""

Say = Callable[[str], None]


def search_document(name: str, trials: int, seed: int) -> dict[str, Any]:
    """The benchmark's search, as a user posts it."""
    return {
        "name": name,
        "trial": {
            "name": "trial",
            "image": DEFAULT_IMAGES,
            "command": [sys.executable, "-c", TRIAL_SCRIPT],
            "gpus_per_learner": 1,
            # A core each, as Ray Tune's trials get (one CPU per trial): the sandbox holds a
            # learner to the CPU it asks for (cgroup quota), and at a tenth of a core the
            # trial's two Python starts alone took 0.6 s of its slot.
            "cpus": 1.0,
            "memory_mb": 256,
            "max_restarts": 0,
        },
        "space": {"params": {"x": {"type": "uniform", "low": 0, "high": 6}}},
        "searcher": {"name": "random", "seed": seed},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"unit": "steps", "max": 1},
        "max_trials": trials,
        "max_concurrent_trials": SLOTS,
    }


async def run(
    url: str,
    *,
    trials: int = DEFAULT_TRIALS,
    kills: int = DEFAULT_KILLS,
    kill_trials: int = DEFAULT_KILL_TRIALS,
    seed: int = 0,
    quality: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    def say(what: str) -> None:
        if progress:
            print(what, file=sys.stderr)

    load_before = os.getloadavg()[0]
    async with scratch_database(url, "search") as database:
        pool = await create_pool(database, min_size=2, max_size=4)
        try:
            with tempfile.TemporaryDirectory(prefix="trainyard-search-") as root:
                # Passable by learners that run as users of their own (the agents are root).
                os.chmod(root, 0o711)
                async with cluster(database, Path(root), pool) as running:
                    plane = await running.add_plane()
                    cold = await _agents(running, ())
                    say(f"a search of {trials} trials of {TRIAL_S:g} s on {SLOTS} slots ...")
                    started_cold = await _efficiency(running, plane, trials, seed)
                    for name in cold:
                        await running.remove_agent(name)
                    await _agents(running, WARM)
                    say(f"again, on {SLOTS} agents that keep warm sandboxes ({' '.join(WARM)}) ...")
                    efficiency = await _efficiency(running, plane, trials, seed)
                    efficiency["cold"] = started_cold
                    efficiency["warm_speedup"] = round(
                        started_cold["search_s"] / efficiency["search_s"], 3
                    )
                    say(
                        f"a search of {kill_trials} trials, the control plane killed "
                        f"{kills} times ..."
                    )
                    pace_s = efficiency["search_s"] * SLOTS / trials
                    crashes = await _kill_run(running, plane, kill_trials, kills, seed, pace_s, say)
        finally:
            await pool.close()
    load_after = os.getloadavg()[0]
    result: dict[str, Any] = {
        "trials": trials,
        "trial_s": TRIAL_S,
        "slots": SLOTS,
        "slots_are": f"{SLOTS} agents (process runtime) of one fake GPU each; trials of one GPU",
        "seed": seed,
        **efficiency,
        **crashes,
    }
    if quality:
        say("search quality on the digits search (in-process) ...")
        result.update(_quality(seed))
    result["cpus"] = os.cpu_count()
    result["load_average_1m"] = {"before": load_before, "after": load_after}
    result["targets"] = TARGETS
    return result


async def _agents(running: Cluster, options: tuple[str, ...]) -> list[str]:
    """SLOTS more agents started with `options`: their names."""
    started = []
    for _ in range(SLOTS):
        agent = await running.add_agent(ttl_s=LEASE_TTL_S, heartbeat_s=HEARTBEAT_S, options=options)
        started.append(agent.name)
    return started


def _quality(seed: int) -> dict[str, Any]:
    from bench.search_quality import asha_compute_ratio, optuna_comparison

    asha = asha_compute_ratio(seed=seed)
    try:
        optuna = optuna_comparison(asha["trials"], seed)
    except ModuleNotFoundError as missing:  # Optuna is the `bench` extra's
        optuna = {"missing": str(missing)}
    return {
        "asha_compute_ratio": asha["asha_compute_ratio"],
        "best_accuracy": asha["best_accuracy"],
        "random_best_accuracy": asha["random_best_accuracy"],
        "asha_reached_random_best": asha["asha_reached_random_best"],
        "optuna_best_accuracy": optuna.get("optuna_best_accuracy"),
        "quality": {"asha": asha, "optuna": optuna},
    }


async def _submit(running: Cluster, plane: ServedControlPlane, document: dict[str, Any]) -> UUID:
    async with ApiClient(plane.url, running.token) as client:
        search = await client.request("POST", "/v1/searches", body=document)
    return UUID(search["id"])


async def _search_state(pool: asyncpg.Pool, search_id: UUID) -> str | None:
    """How the search ended, as its stream says; None while it runs."""
    state: str | None = await pool.fetchval(
        "SELECT data->>'state' FROM events WHERE stream_id = $1 AND type = 'SearchEnded'",
        search_stream(search_id),
    )
    return state


async def _until_ended(pool: asyncpg.Pool, search_id: UUID, within_s: float) -> str | None:
    """How the search ended, once it has; None if it has not within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if (state := await _search_state(pool, search_id)) is not None:
            return state
        await asyncio.sleep(0.1)
    return None


async def _efficiency(
    running: Cluster, plane: ServedControlPlane, trials: int, seed: int
) -> dict[str, Any]:
    search_id = await _submit(running, plane, search_document("efficiency", trials, seed))
    ideal_s = trials * TRIAL_S / SLOTS
    state = await _until_ended(running.pool, search_id, 4 * ideal_s + SETTLE_S)
    if state != "completed":
        raise RuntimeError(f"search {search_id} did not complete: it ended {state}")
    timing = await _timing(running.pool, search_id)
    gaps = timing.pop("gaps_ms")
    return {
        "ideal_s": ideal_s,
        "search_s": round(timing["search_s"], 3),
        "trial_efficiency": round(ideal_s / timing["search_s"], 3),
        "next_trial_p99_ms": gaps["p99"],
        "next_trial_ms": gaps,
        "per_trial_overhead_s": {
            **timing["overhead_s"],
            "between_trials": None if gaps["p50"] is None else round(gaps["p50"] / 1000, 3),
        },
        "next_trial_stages_ms": timing["stages_ms"],
        "in_job_stages_ms": timing["in_job_stages_ms"],
    }


async def _timing(pool: asyncpg.Pool, search_id: UUID) -> dict[str, Any]:
    """The search's duration, its trials' time in their jobs, and the gaps from a trial's end
    to the next trial's start (see the module's description)."""
    stream = search_stream(search_id)
    search = await pool.fetch(SEARCH_SQL, stream)
    rows = await pool.fetch(TRIAL_JOBS_SQL, stream, str(search_id))
    firsts: dict[str, dict[str, asyncpg.Record]] = {}
    for row in rows:
        firsts.setdefault(row["stream_id"], {}).setdefault(row["type"], row)
    created = [r for r in search if r["type"] == "TrialCreated"]
    [ended] = [r for r in search if r["type"] == "SearchEnded"]
    jobs_of = {r["number"]: f"job-{r['job_id']}" for r in created}

    in_job, launch, command = [], [], []
    stages: dict[str, list[float]] = {name: [] for name in IN_JOB_STAGES}
    for job in firsts.values():
        if {"JobDeploying", "JobProcessing", "JobCompleted"} <= job.keys():
            deploying, processing = job["JobDeploying"]["at"], job["JobProcessing"]["at"]
            completed = job["JobCompleted"]["at"]
            in_job.append(_s(completed - deploying) - TRIAL_S)
            launch.append(_s(processing - deploying))
            command.append(_s(completed - processing) - TRIAL_S)
        if set(JOB_PHASES) <= job.keys():
            at = [job[phase]["at"] for phase in JOB_PHASES]
            seen = [job[phase]["recorded_at"] for phase in JOB_PHASES]
            spans = [_s(later - earlier) * 1000 for earlier, later in itertools.pairwise(at)]
            spans[2] -= TRIAL_S * 1000
            spans += [_s(seen[3] - at[3]) * 1000, _s(seen[4] - at[4]) * 1000]
            for name, span in zip(IN_JOB_STAGES, spans, strict=True):
                stages[name].append(span)

    gaps: list[float] = []
    gap_stages: dict[str, list[float]] = {"driver": [], "submit": [], "claim": []}
    finished: list[asyncpg.Record] = []
    for row in search:
        if row["type"] in ("TrialRungFinished", "TrialFailed"):
            finished.append(row)
        elif row["type"] == "TrialCreated" and finished:
            done = firsts.get(jobs_of[finished.pop(0)["number"]], {}).get("JobCompleted")
            new = firsts.get(jobs_of[row["number"]], {})
            deploying, submitted = new.get("JobDeploying"), new.get("JobSubmitted")
            if done is None or deploying is None or submitted is None:
                continue
            gaps.append(_s(deploying["at"] - done["at"]) * 1000)
            gap_stages["driver"].append(_s(row["recorded_at"] - done["recorded_at"]) * 1000)
            gap_stages["submit"].append(_s(submitted["recorded_at"] - row["recorded_at"]) * 1000)
            gap_stages["claim"].append(
                _s(deploying["recorded_at"] - submitted["recorded_at"]) * 1000
            )
    # The slowest gap's own stages: a tail is a stage's stall, which the medians hide.
    slowest = max(range(len(gaps)), key=gaps.__getitem__, default=None)
    return {
        "search_s": _s(ended["at"] - created[0]["at"]),
        "gaps_ms": {
            "p50": _percentile(gaps, 50),
            "p99": _percentile(gaps, 99),
            "max": None if slowest is None else round(gaps[slowest], 1),
            "max_stages": None
            if slowest is None
            else {name: round(spans[slowest], 1) for name, spans in gap_stages.items()},
            "samples": len(gaps),
        },
        "overhead_s": {
            "in_job": _median(in_job),
            "deploying_to_processing": _median(launch),
            "processing_to_completed_less_sleep": _median(command),
        },
        "in_job_stages_ms": {name: _median(spans, 1) for name, spans in stages.items()},
        "stages_ms": {name: _median(spans, 1) for name, spans in gap_stages.items()},
    }


async def _kill_run(
    running: Cluster,
    plane: ServedControlPlane,
    trials: int,
    kills: int,
    seed: int,
    pace_s: float,
    say: Say,
) -> dict[str, Any]:
    rng = random.Random(seed)
    # Kill k comes after the search's ends[k]-th trial end, early enough that trials remain.
    ends = sorted(rng.randint(1, max(1, trials - SLOTS - 1)) for _ in range(kills))
    plan = [(end, rng.random() < AIMED_SHARE) for end in ends]
    search_id = await _submit(running, plane, search_document("kills", trials, seed))
    submitted = time.perf_counter()
    expected_s = trials * pace_s / SLOTS
    moments: list[dict[str, Any]] = []
    for number, (end, aimed) in enumerate(plan, start=1):
        delay_s = rng.uniform(0, AIM_S) if aimed else rng.uniform(0, pace_s)
        if not await _trial_ends(running.pool, search_id, end):
            break  # the search ended first: no kill during it to make
        await asyncio.sleep(delay_s)
        if await _search_state(running.pool, search_id) is not None:
            break
        created = await running.pool.fetchval(
            "SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'TrialCreated'",
            search_stream(search_id),
        )
        moments.append(
            {
                "at_s": round(time.perf_counter() - submitted, 3),
                "kind": "aimed" if aimed else "random",
                "after_trial_end": end,
                "delay_s": round(delay_s, 3),
                "trials_created": created,
            }
        )
        say(f"  kill -9 {number}/{kills} of the control plane ({moments[-1]['kind']}) ...")
        await plane.kill()
        await asyncio.sleep(DOWN_S)
        await plane.start()
    state = await _until_ended(running.pool, search_id, 2 * expected_s + SETTLE_S)
    stream = search_stream(search_id)
    lost = await _row(running.pool, LOST_SQL, stream, trials)
    counted = await _row(running.pool, DUPLICATES_SQL, stream, str(search_id), trials)
    failed, reattempts = counted.pop("failed_trials"), counted.pop("trial_reattempts")
    context: dict[str, Any] = {}
    if state is not None:
        timing = await _timing(running.pool, search_id)
        context = {
            "search_s": round(timing["search_s"], 3),
            "trial_efficiency": round(trials * TRIAL_S / SLOTS / timing["search_s"], 3),
            "next_trial_ms": timing["gaps_ms"],
        }
    return {
        "kill_trials": trials,
        "kills": kills,
        "kills_made": len(moments),
        "kill_moments": moments,
        "lost_trials": lost["not_done"] + (0 if state == "completed" else 1),
        "lost": lost,
        "duplicate_trials": sum(counted.values()),
        "duplicates": counted,
        "failed_trials": failed,
        "trial_reattempts": reattempts,
        "kill_search": context,
    }


async def _trial_ends(pool: asyncpg.Pool, search_id: UUID, count: int) -> bool:
    """Wait until `count` of the search's trial jobs have completed (True), or the search has
    ended (False)."""
    stream = search_stream(search_id)
    while await pool.fetchval(TRIAL_ENDS_SQL, stream) < count:
        if await _search_state(pool, search_id) is not None:
            return False
        await asyncio.sleep(PROBE_S)
    return True


async def _row(pool: asyncpg.Pool, query: str, *args: object) -> dict[str, Any]:
    row = await pool.fetchrow(query, *args)
    if row is None:  # a SELECT of scalar subqueries has one row
        raise RuntimeError("the count returned no row")
    return dict(row)


def _s(delta: timedelta) -> float:
    return delta.total_seconds()


def _median(values: list[float], digits: int = 3) -> float | None:
    return round(statistics.median(values), digits) if values else None


def _percentile(values: list[float], percent: int) -> float | None:
    """The nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-percent * len(ordered) // 100))
    return round(ordered[rank - 1], 1)

"""The pending reasons' figures of `trainyard bench simulate` (issue 17):

- claim_slowdown: 1 - (claims per second with the pending-reasons recorder running) / (claims
  per second without it). AGENTS agents (one task per registered fake node, NODE_GPUS GPUs
  each) claim one-GPU jobs of TENANTS tenants for `seconds` (SECONDS), holding HELD claims
  each and releasing the oldest as they take a new one (as `bench claims` does), from a queue
  topped up to `queue` (QUEUE) jobs before each round, so that thousands wait throughout. The
  queue's projections run in a process of their own, as the control plane runs them, and in
  the rounds "with", the recorder and the `pending` projection (which reads every claim's
  event) beside them in that process (`bench.projector --pending`). Its first rounds (every
  queued job shown, and its reasons recorded a chunk a round) are done, and as long again as a
  round is timed waited (in every round), before the clock starts: what is timed is the
  recorder as it goes on, round after round, while claims move the queue. PAIRS pairs of
  rounds, one of each kind back to back, the first kind in turn; the figure is the median of
  the pairs' slowdowns, all of them listed (`claim_slowdown_pairs`). Rounds alike in all but
  the recorder differ by a third on a 2-core machine (one run's rounds without it: 758, 1,138,
  1,126, 1,110 claims/s), and its speed drifts over minutes: the medians of each kind's rounds
  compared, with the rounds without it always first, moved from 0.04 to 0.25 between runs of
  the same code.
- ReasonWatch, beside a recorded run (`bench.simulate`), reads what the API reads
  (`pending_reasons`) every WATCH_S:
  - reason_latency_p99_ms: for each job, from its submission (`submitted_at`) until its first
    reasons are visible, and from its claim (its JobDeploying's time) until its reasons are
    gone; the 99th percentile of both together. Both include the queue's projection and the
    recorder's round; WATCH_S is their resolution.
  - reasons_coverage: every SAMPLE_S while at least COVERAGE_QUEUE jobs are QUEUED, the QUEUED
    jobs that have at least one reason for their current attempt, over the jobs queued for
    longer than SETTLE_S (one recorder round and the projection's lag: a job submitted a
    millisecond before a sample cannot have been judged yet), the samples pooled;
    reasons_coverage_min the lowest sample's share (the burst's first round, which judges a
    thousand jobs at once, is its likely moment); reasons_coverage_all counts every QUEUED
    job, however new.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.claims import Plane, opened_plane, submit_batch
from bench.projector import projector
from bench.scratch import scratch_database
from controlplane.agents.claims import Releases, claim
from controlplane.jobs.projection import JobsProjection
from controlplane.scheduling.claim import Claim
from controlplane.tenants.projection import TenantsProjection
from controlplane.tenants.service import create_tenant
from controlplane.workers import pause

AGENTS = 8
NODE_GPUS = 8
HELD = 4
TENANTS = {"small": 1.0, "medium": 2.0, "large": 3.0}
QUEUE = 6000
SECONDS = 4.0
PAIRS = 4
WATCH_S = 0.025
SAMPLE_S = 1.0
SETTLE_S = 1.0
COVERAGE_QUEUE = 1000


async def claim_slowdown(
    url: str, *, queue: int = QUEUE, seconds: float = SECONDS, pairs_of: int = PAIRS
) -> dict[str, Any]:
    async with (
        scratch_database(url, "pending") as scratch,
        opened_plane(scratch, [JobsProjection(), TenantsProjection()], AGENTS + 4) as plane,
    ):
        for tenant, weight in TENANTS.items():
            await create_tenant(plane.store, plane.runner, tenant, weight, actor="bench")
        nodes = [f"bench-{k}" for k in range(AGENTS)]
        for name in nodes:
            await plane.node(name)
        pairs: list[tuple[float, float]] = []
        for k in range(pairs_of):
            # Each pair's two rounds back to back, in turn one order and the other: a machine
            # whose speed drifts over the run moves both rounds of a pair alike, and a drift
            # one way does not always favour the same side.
            order = (False, True) if k % 2 == 0 else (True, False)
            rate: dict[bool, float] = {}
            for pending in order:
                await _top_up(plane, queue)
                async with projector(scratch, pending=pending):
                    # What the top-up and the recorder's first round left (its WAL, autovacuum
                    # of the new rows) settles first, in both kinds of round alike.
                    await asyncio.sleep(seconds)
                    rate[pending] = await _claim_round(plane, nodes, seconds)
            pairs.append((rate[False], rate[True]))
    slowdowns = sorted(1 - with_ / without for without, with_ in pairs)
    return {
        "claim_slowdown": round(statistics.median(slowdowns), 3),
        "claim_slowdown_pairs": [round(x, 3) for x in slowdowns],
        "claims_per_s_without_reasons": round(statistics.median(p[0] for p in pairs), 1),
        "claims_per_s_with_reasons": round(statistics.median(p[1] for p in pairs), 1),
    }


async def _top_up(plane: Plane, queue: int) -> None:
    """Submit jobs of each tenant in turn until `queue` wait, all of them projected."""
    waiting = await plane.pool.fetchval("SELECT count(*) FROM job_status WHERE state = 'QUEUED'")
    missing = max(queue - waiting, 0)
    tenants = list(TENANTS)
    last = None
    for k in range(0, missing, 500):
        tenant = tenants[(k // 500) % len(tenants)]
        last = await submit_batch(plane, min(500, missing - k), tenant)
    for projection in plane.runner.projections.values():
        await plane.runner.catch_up(projection)
    if last is not None:
        await plane.runner.wait_applied(JobsProjection.name, last)


async def _claim_round(plane: Plane, nodes: list[str], seconds: float) -> float:
    """Claims per second of every node's agent for `seconds`."""
    won = 0
    deadline = time.perf_counter() + seconds

    async def agent(node: str) -> None:
        nonlocal won
        releases = Releases(plane.pool, node)
        held: deque[Claim] = deque()
        while time.perf_counter() < deadline:
            taken = await claim(plane.pool, plane.store, node)
            won += len(taken)
            held.extend(taken)
            while len(held) > HELD:
                oldest = held.popleft()
                await releases.release(oldest.job.job_id, oldest.attempt)
        for left in held:  # the next round starts with the nodes' room free
            await releases.release(left.job.job_id, left.attempt)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for node in nodes:
            group.create_task(agent(node))
    return won / (time.perf_counter() - start)


@dataclass
class ReasonWatch:
    """Watches the reasons a recorded run's jobs get, as the API would show them."""

    pool: asyncpg.Pool
    latencies: list[float] = field(default_factory=list)
    covered: list[tuple[int, int]] = field(default_factory=list)
    """Each sample's (judged, queued), over the jobs queued longer than SETTLE_S."""
    covered_all: list[tuple[int, int]] = field(default_factory=list)
    _seen: set[tuple[Any, int, bool]] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until `stop` is set."""
        next_sample = time.monotonic()
        since = datetime(1970, 1, 1, tzinfo=UTC)
        while not stop.is_set():
            now = datetime.now(UTC)
            for row in await self.pool.fetch(_CHANGED, since):
                # A job's first reasons, and its reasons gone after a claim, once each.
                since = max(since, row["updated_at"])
                key = (row["job_id"], row["attempt"], row["queued"])
                if key not in self._seen and row["began"] is not None:
                    self._seen.add(key)
                    self.latencies.append((now - row["began"]).total_seconds())
            if time.monotonic() >= next_sample:
                next_sample += SAMPLE_S
                await self._sample()
            await pause(stop, WATCH_S)

    async def _sample(self) -> None:
        row = await self.pool.fetchrow(_COVERAGE, SETTLE_S)
        if row is None or row["queued"] < COVERAGE_QUEUE:
            return
        self.covered_all.append((row["judged"], row["queued"]))
        if row["settled"]:
            self.covered.append((row["settled_judged"], row["settled"]))

    def figures(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None
        return {
            "reasons_coverage": _share(self.covered),
            "reasons_coverage_min": min((_share([s]) or 0.0 for s in self.covered), default=None),
            "reasons_coverage_all": _share(self.covered_all),
            "coverage_samples": len(self.covered),
            "reason_latency_p99_ms": round(p99 * 1000, 1) if p99 is not None else None,
            "reason_changes_timed": len(ordered),
        }


# The rows that changed since $1: a queued job's first reasons (timed from its submission), a
# job's reasons gone (timed from its claim).
_CHANGED = """
SELECT p.job_id, p.attempt, p.queued, p.updated_at,
       CASE WHEN p.queued THEN s.submitted_at ELSE h.at END AS began
FROM pending_reasons p
JOIN job_status s USING (job_id)
LEFT JOIN job_history h ON h.job_id = p.job_id AND h.attempt = p.attempt
                       AND h.event = 'JobDeploying'
WHERE p.updated_at > $1 AND p.attempt = 1
ORDER BY p.updated_at
"""

_COVERAGE = """
SELECT count(*) AS queued,
       count(*) FILTER (WHERE p.queued AND p.attempt = s.attempt
                        AND cardinality(p.kinds) > 0) AS judged,
       count(*) FILTER (WHERE s.updated_at < now() - make_interval(secs => $1)) AS settled,
       count(*) FILTER (WHERE s.updated_at < now() - make_interval(secs => $1)
                        AND p.queued AND p.attempt = s.attempt
                        AND cardinality(p.kinds) > 0) AS settled_judged
FROM job_status s
LEFT JOIN pending_reasons p USING (job_id)
WHERE s.state = 'QUEUED' AND NOT s.inference
"""


def _share(samples: list[tuple[int, int]]) -> float | None:
    """Judged over queued, the samples pooled."""
    queued = sum(total for _, total in samples)
    return round(sum(judged for judged, _ in samples) / queued, 4) if queued else None

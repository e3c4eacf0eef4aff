"""The pending-reasons recorder: every round, it reads the queue and the cluster, judges each
queued job (`reasons.assess`, its walk resumed from the last round's where the queue ahead did
not change: `resume`), and writes what changed (`changes`): the reasons' rows, shown at once,
and events in the jobs' pending streams that record the changes of their sets of reasons, a
bounded number a round. Every control plane replica runs one; a round's read and its write
each take an advisory lock, and the write goes ahead only if no other recorder wrote since the
read, so one replica writes at a time, from the rows it read.

It reads only, with plain SELECTs, what claims lock: a claim never waits for it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID, uuid4

import asyncpg

from controlplane.clock import SYSTEM_CLOCK, Clock
from controlplane.database import DATABASE_ERRORS, Executor
from controlplane.events.metadata import Metadata
from controlplane.events.records import StreamAppend
from controlplane.events.store import EventStore
from controlplane.pending.changes import BUDGET, MOVED, Change, Queued, Recorded, Round, changes
from controlplane.pending.cpu_budget import CpuBudget
from controlplane.pending.estimates import Holding, estimated_in_order
from controlplane.pending.reasons import (
    Assessment,
    Blocking,
    NodeRoom,
    Pending,
    Reason,
    assess,
    queue_order,
)
from controlplane.pending.resume import ResumedWalk
from controlplane.pending.streams import pending_stream
from controlplane.queries import Q
from controlplane.scheduling.application import policy_in_force
from controlplane.scheduling.claim_order import QueuedJob, TenantShare, shares
from controlplane.scheduling.placement import Capacity, Demand
from controlplane.scheduling.policy import ClaimPolicy, Order
from controlplane.scheduling.unschedulable import out_of_bounds
from controlplane.workers import item_failed, pause

log = logging.getLogger(__name__)

ROUND_S = 0.25
"""How often the reasons are judged again: a change shows within about this long."""
DURATIONS = timedelta(seconds=30)
"""How often the typical run times (of each tenant's job names) are read again: from every job
that completed in a week, too much to read each round, and slow to change."""
RECORDING = timedelta(seconds=2)
"""How often a round records changes in the jobs' histories (a budget's worth) and rewrites
the rows whose position, details or estimate alone moved. Every round shows a change of a
job's reasons, its arrival and its departure at once; the rest waits for a recording round, so
that the writes a claim competes with in the database (and the events the `pending` projection
applies) stay as many a second however often the rounds come."""
APPEND_CHUNK = 256
ACTOR = "system:pending-reasons"
WORKER = "pending-reasons"
REPLICAS = Pending(
    Reason.REPLICAS,
    Blocking.WAITING,
    "an inference job needs no node: it waits for a replica of its deployment to load the "
    "model and take its first query",
)


class PendingRecorder:
    def __init__(
        self,
        pool: asyncpg.Pool,
        store: EventStore,
        *,
        interval_s: float = ROUND_S,
        recording: timedelta = RECORDING,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._pool = pool
        self._store = store
        self._interval_s = interval_s
        self._recording = recording
        self._clock = clock
        self._stopping = asyncio.Event()
        self._durations: dict[tuple[str, str], timedelta] = {}
        self._durations_read: datetime | None = None
        self._judged_from: tuple[object, ...] | None = None
        """The fingerprint of what the last round judged (see `pending_fingerprint`)."""
        self._due: datetime | None = None
        """When time alone changes a judgement: a backoff or an expected end passes."""
        self._id = uuid4()
        self._rows: dict[UUID, Recorded] = {}
        """The rows of the jobs queued, as this recorder wrote them at its round `_round`."""
        self._round: int | None = None
        self._recorded_at: datetime | None = None
        """When a round last recorded history and moved details (every `recording`)."""
        self._walk = ResumedWalk()
        """The last round's walk of the queue: a round walks again only from where the queue
        changed (see `resume`)."""
        self._made = QueuedJobs()
        """The last round's queue rows, made jobs."""
        self._budget = CpuBudget()
        """The rounds' CPU budget: their share of a core, and the CPU time spent ahead of it."""

    async def run(self) -> None:
        """Record a round every interval until `stop()`."""
        while not self._stopping.is_set():
            started = time.process_time()
            try:
                await self.record()
            except DATABASE_ERRORS as exc:
                log.warning("recording pending reasons failed: %s; retrying", exc)
            # A long queue makes long rounds: they keep to a share of a core
            # (`pending.cpu_budget`), so that claims and the API keep the CPU. Counted in the
            # round's CPU time, not its wall time: on a busy machine the wall time counts the
            # others' work too, and paced on it the reasons came seconds late just when the queue
            # moved most. All of it, in every thread (decoding the queue's rows, judging,
            # encoding the writes), not the judging alone: paced on that, a round under claims
            # took a quarter of a core. Apart (`pending.apart`, as `trainyard serve` runs it) the
            # process's time is the round's; beside the API, the API's counts too, and the
            # rounds come less often.
            spent = time.process_time() - started
            wait = self._budget.pause_after(spent, time.monotonic())
            await pause(self._stopping, max(self._interval_s, wait))

    def stop(self) -> None:
        self._stopping.set()

    async def record(self) -> int:
        """One round; how many jobs' rows it wrote (0 also when another replica's round held
        the lock, or wrote between this round's read and its write, or when nothing it judges
        from changed).

        Two short transactions, with the judging between them in none: a consistent read of
        the queue, the cluster and the rows, then the writes. A transaction open across the
        judging (tenths of a second with a long queue on a busy machine) held back the oldest
        snapshot that Postgres must keep, so that the row versions the claims leave behind in
        the queue could not be pruned while it lasted, and the claims scanned them all: with
        it, some transaction was older than 20 ms in a third of the instants of a claim round,
        up to half a second (`bench simulate`'s claim_slowdown)."""
        async with self._pool.acquire() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                if not await conn.fetchval(Q["pending_lock"]):
                    return 0
                at = self._clock.now()
                seen = tuple(await conn.fetchrow(Q["pending_fingerprint"]) or ())
                stale = self._durations_read is None or at - self._durations_read > DURATIONS
                if (
                    not stale
                    and seen == self._judged_from
                    and (self._due is None or at < self._due)
                ):
                    return 0
                if stale:
                    self._durations = {
                        (r["tenant"], r["name"]): timedelta(seconds=r["seconds"])
                        for r in await conn.fetch(Q["pending_durations"])
                    }
                    self._durations_read = at
                snapshot = await _snapshot(conn)
                last = _round_of(await conn.fetchrow(Q["pending_round"]))
                rows = await self._recorded(conn, last, [r["job_id"] for r in snapshot.jobs])
            recording = self._recorded_at is None or at - self._recorded_at >= self._recording
            # Long with a long queue that changes ahead (tenths of a second for ten thousand
            # jobs on a thousand nodes, after a claim): in a thread, so that the API, the
            # projections and SSE sharing this event loop are not held for it.
            decided = await asyncio.to_thread(
                _decided, snapshot, rows, self._durations, at, recording, self._walk, self._made
            )
            written = decided.round.changes
            round_ = self._round
            if written:
                async with conn.transaction():
                    # The rows it judged against are still the database's only if no other
                    # recorder wrote since its read (each write moves the round): else the
                    # next round judges again, from theirs.
                    if not await conn.fetchval(Q["pending_lock"]) or last != _round_of(
                        await conn.fetchrow(Q["pending_round"])
                    ):
                        return 0
                    await self._write(conn, written, at)
                    round_ = await conn.fetchval(Q["pending_next_round"], self._id)
        # Only once committed: a round rolled back is judged again, from the database's rows.
        self._judged_from, self._round = seen, round_
        if recording:
            self._recorded_at = at
        # What a round defers is history and moved details: the next recording round's.
        deferred = decided.round.deferred
        if deferred is not None and self._recorded_at is not None:
            deferred = max(deferred, self._recorded_at + self._recording)
        self._due = min((when for when in (decided.due, deferred) if when), default=None)
        rows.update((change.row.job_id, change.row) for change in written)
        self._rows = {job_id: row for job_id, row in rows.items() if row.queued}
        return len(written)

    async def _recorded(
        self, conn: Executor, last: tuple[UUID, int] | None, queue: Sequence[UUID]
    ) -> dict[UUID, Recorded]:
        """The rows of the jobs queued at the last round and of those in `queue`: kept from
        this recorder's last round unless another recorder wrote since (`last`, the round that
        wrote last, is not its own)."""
        if last != (self._id, self._round):
            self._rows = {
                r["job_id"]: _recorded(r) for r in await conn.fetch(Q["pending_queued_rows"])
            }
        rows = dict(self._rows)
        missing = [job_id for job_id in queue if job_id not in rows]
        if missing:
            rows.update(
                (r["job_id"], _recorded(r)) for r in await conn.fetch(Q["pending_rows_of"], missing)
            )
        return rows

    async def _write(self, conn: Executor, written: Sequence[Change], at: datetime) -> None:
        appends = [
            StreamAppend(
                pending_stream(change.row.job_id),
                change.expected_version,
                list(change.events),
                Metadata(actor=ACTOR, tenant=change.row.tenant),
            )
            for change in written
            if change.events
        ]
        # In chunks: one statement's cost grows faster than its streams (a round appends to a
        # budget's streams, and to every stream whose unrecorded change cannot wait).
        for first in range(0, len(appends), APPEND_CHUNK):
            results = await self._store.append_many(
                appends[first : first + APPEND_CHUNK], conn=conn
            )
            if any(result is None for result in results):
                # A stream moved under us: only another recorder appends there, and the lock
                # keeps it out, so this is a bug; write nothing, the next round starts afresh.
                raise RuntimeError("a pending stream was not at the version its row records")
        rows = [change.row for change in written]
        await conn.execute(
            Q["pending_write"],
            [r.job_id for r in rows],
            [r.tenant for r in rows],
            [r.attempt for r in rows],
            [r.version for r in rows],
            [r.queued for r in rows],
            [r.position for r in rows],
            [json.dumps([_shown(reason) for reason in r.reasons]) for r in rows],
            [r.since for r in rows],
            [r.estimated_start for r in rows],
            [r.recorded for r in rows],
            at,
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a round judges from, as read in its transaction."""

    jobs: Sequence[asyncpg.Record]
    policy: ClaimPolicy
    tenants: Sequence[asyncpg.Record]
    nodes: Sequence[asyncpg.Record]
    running: Sequence[asyncpg.Record]


@dataclass(frozen=True, slots=True)
class Decided:
    round: Round
    """The rows and events to write."""
    due: datetime | None
    """The next instant at which time alone changes a judgement (a backoff's end, a running
    job's expected end), if any."""


async def _snapshot(conn: Executor) -> Snapshot:
    return Snapshot(
        await conn.fetch(Q["pending_queue"]),
        # Judged under the claim policy in force, as the claims take the queue.
        await policy_in_force(conn),
        await conn.fetch(Q["pending_tenants"]),
        await conn.fetch(Q["pending_nodes"]),
        await conn.fetch(Q["pending_running"]),
    )


def _decided(
    snapshot: Snapshot,
    recorded: Mapping[UUID, Recorded],
    durations: Mapping[tuple[str, str], timedelta],
    at: datetime,
    recording: bool,
    walk: ResumedWalk,
    made: QueuedJobs,
) -> Decided:
    """What a round writes (`changes`) to bring `recorded` to the queue's judgement now, and,
    `recording`, the history and moved details it may write; run in a thread (see
    `PendingRecorder.record`), pure but for `walk` and `made`, which go on from the last
    round's."""
    queue, due = _judged(snapshot, at, durations, walk, made)
    decided = changes(
        recorded, queue, at, budget=BUDGET if recording else 0, moved_rows=MOVED if recording else 0
    )
    return Decided(decided, due)


def _judged(
    snapshot: Snapshot,
    at: datetime,
    durations: Mapping[tuple[str, str], timedelta],
    walk: ResumedWalk | None = None,
    made: QueuedJobs | None = None,
) -> tuple[list[Queued], datetime | None]:
    """Every queued job with its reasons and estimated start now, in queue order (inference
    jobs, which take no node, last); and the next instant at which time alone changes them.
    With `walk`, the queue's walk resumes from the last one's where the queue did not change
    (the same judgement; without it, the whole queue is walked); with `made`, the rows that
    did not change are the jobs it made of them before."""
    jobs = snapshot.jobs
    tenants = shares(
        [TenantShare(r["name"], r["weight"], r["gpu_quota"], r["held"]) for r in snapshot.tenants],
        snapshot.policy,
    )
    nodes = [
        NodeRoom(
            # The view's memory is numeric (a bigint less a sum): placement counts whole MiB.
            Capacity(r["name"], list(r["free_gpus"]), r["free_cpus"], int(r["free_memory_mb"])),
            gpus=r["healthy"],
            unhealthy=r["unhealthy"],
            cpus=r["cpus"],
            memory_mb=r["memory_mb"],
        )
        for r in snapshot.nodes
    ]
    running = [
        Holding(
            r["tenant"],
            r["node"],
            tuple(r["gpus"]),
            r["cpus"],
            r["memory_mb"],
            _ends(r["allocated_at"], durations.get((r["tenant"], r["name"]))),
        )
        for r in snapshot.running
    ]
    rows = {r["job_id"]: r for r in jobs}
    every = (made or QueuedJobs()).of(jobs)
    # A job whose demand is outside the manifest's bounds (stored before a bound was raised)
    # is judged on its own: never placed, so its values never reach the others' arithmetic.
    set_aside = {job.job_id: why for job in every if (why := out_of_bounds(job.demand))}
    queue = [job for job in every if job.job_id not in set_aside]
    expected = {
        job_id: took
        for job_id, r in rows.items()
        if (took := durations.get((r["tenant"], r["name"]))) is not None
    }
    assessed, starts, failed = _judge(
        nodes, tenants, queue, running, expected, at, snapshot.policy.order, walk
    )
    for job_id, why in set_aside.items():
        log.warning("pending reasons: job %s is never placed: %s", job_id, why)
    judged = [
        Queued(
            a.job_id,
            rows[a.job_id]["tenant"],
            rows[a.job_id]["attempt"],
            a.position,
            a.reasons,
            # One that can start now has no estimate to give: the next claim takes it.
            start if (start := starts.get(a.job_id)) is not None and start > at else None,
        )
        for a in assessed
    ]
    unjudged = {
        **{job_id: _unschedulable(why) for job_id, why in set_aside.items()},
        **{job_id: _unjudged(why) for job_id, why in failed.items()},
    }
    judged += [
        Queued(job_id, rows[job_id]["tenant"], rows[job_id]["attempt"], len(judged) + k, (why,))
        for k, (job_id, why) in enumerate(unjudged.items(), start=1)
    ]
    inference = sorted((r for r in jobs if r["inference"]), key=lambda r: r["submitted_at"])
    judged += [
        Queued(r["job_id"], r["tenant"], r["attempt"], len(judged) + k, (REPLICAS,))
        for k, r in enumerate(inference, start=1)
    ]
    instants = [job.not_before for job in queue if job.not_before is not None]
    instants += [holding.ends for holding in running if holding.ends is not None]
    return judged, min((when for when in instants if when > at), default=None)


class QueuedJobs:
    """The queue's rows as the walk takes them (`QueuedJob`), each kept from the last round
    while its row is the same: a row changes with its job's claim, restart or priority, and
    making 6,000 of them anew was a tenth of a round's CPU. Not thread-safe: one recorder's
    rounds, one at a time."""

    def __init__(self) -> None:
        self._made: dict[UUID, tuple[asyncpg.Record, QueuedJob]] = {}

    def of(self, rows: Sequence[asyncpg.Record]) -> list[QueuedJob]:
        """The jobs of `rows` (`pending_queue`'s) but inference jobs, which take no node, in
        the rows' order."""
        made = {}
        for r in rows:
            if r["inference"]:
                continue
            kept = self._made.get(r["job_id"])
            made[r["job_id"]] = kept if kept is not None and kept[0] == r else (r, _queued(r))
        self._made = made
        return [job for _, job in made.values()]


def _queued(r: asyncpg.Record) -> QueuedJob:
    return QueuedJob(
        r["job_id"],
        r["tenant"],
        Demand(
            r["learners"],
            r["gpus_per_learner"],
            r["cpus_per_learner"],
            r["memory_mb_per_learner"],
            r["learners_per_node"],
        ),
        r["priority"],
        r["submitted_at"],
        r["not_before"],
        r["allocated"],
    )


def _judge(
    nodes: Sequence[NodeRoom],
    tenants: Sequence[TenantShare],
    queue: Sequence[QueuedJob],
    running: Sequence[Holding],
    expected: Mapping[UUID, timedelta],
    at: datetime,
    order: Order,
    walk: ResumedWalk | None,
) -> tuple[list[Assessment], dict[UUID, datetime], dict[UUID, str]]:
    """The queue's assessments and estimated starts, and the jobs that could not be judged
    (with why). The walk judges the jobs together; should it fail, each job is judged alone to
    find those it fails on, which are recorded (see `workers.item_failed`) and left out, and
    the others are judged without them: one job's data never stops the reasons of all."""
    try:
        return (*_together(nodes, tenants, queue, running, expected, at, order, walk), {})
    except Exception:
        failed: dict[UUID, str] = {}
        for job in queue:
            try:
                _together(nodes, tenants, [job], running, expected, at, order, None)
            except Exception as exc:
                item_failed(WORKER, f"job {job.job_id}")
                failed[job.job_id] = f"{type(exc).__name__}: {exc}"
        if not failed:
            raise  # no one job's data: a bug of the walk itself, for an operator to see
    rest = [job for job in queue if job.job_id not in failed]
    return (*_together(nodes, tenants, rest, running, expected, at, order, None), failed)


def _together(
    nodes: Sequence[NodeRoom],
    tenants: Sequence[TenantShare],
    queue: Sequence[QueuedJob],
    running: Sequence[Holding],
    expected: Mapping[UUID, timedelta],
    at: datetime,
    order: Order,
    walk: ResumedWalk | None,
) -> tuple[list[Assessment], dict[UUID, datetime]]:
    ordered = queue_order(tenants, queue, order)
    return (
        assess(nodes, tenants, queue, now=at, order=order)
        if walk is None
        else walk.assess(nodes, tenants, ordered, now=at, order=order),
        estimated_in_order(nodes, tenants, ordered, running, expected, now=at),
    )


def _unschedulable(why: str) -> Pending:
    return Pending(Reason.UNSCHEDULABLE, Blocking.NEVER, why)


def _unjudged(why: str) -> Pending:
    detail = f"its reasons could not be judged ({why}); the operator is told in the log"
    return Pending(Reason.UNSCHEDULABLE, Blocking.NEVER, detail)


def _ends(allocated_at: datetime, took: timedelta | None) -> datetime | None:
    return None if took is None else allocated_at + took


def _round_of(row: asyncpg.Record | None) -> tuple[UUID, int] | None:
    """The recorder that wrote last, and its round (`pending_round`); None before any wrote."""
    return None if row is None else (row["writer"], row["round"])


def _recorded(row: asyncpg.Record) -> Recorded:
    return Recorded(
        job_id=row["job_id"],
        tenant=row["tenant"],
        attempt=row["attempt"],
        version=row["version"],
        queued=row["queued"],
        position=row["position"],
        reasons=tuple(
            Pending(Reason(r["reason"]), Blocking(r["blocking"]), r["detail"])
            for r in json.loads(row["reasons"])
        ),
        since=row["since"],
        estimated_start=row["estimated_start"],
        updated_at=row["updated_at"],
        recorded=row["recorded"],
    )


def _shown(reason: Pending) -> dict[str, str]:
    return {"reason": reason.reason, "blocking": reason.blocking, "detail": reason.detail}

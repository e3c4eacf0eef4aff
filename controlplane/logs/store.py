"""Storing learner log lines in batches (one COPY each) and reading them back in order.

Each job's lines carry `id`, a per-job counter taken under a lock on the job's row of
`job_log_heads` (see migrations/0007_job_logs.sql): ids commit in increasing order, so `id` is
a cursor that never skips a line that commits late. Writes are idempotent per series: lines at
or below the series' stored seq are left out, so a retried batch or a resumed agent never
stores a line twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Final
from uuid import UUID

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from controlplane.database import Executor
from controlplane.invariants import InvariantBroken
from controlplane.logs.lines import LogLine, Series, StoredLine, Stream
from controlplane.queries import Q

Connection = asyncpg.Connection | PoolConnectionProxy
"""A single connection, from a pool or not: a batch is written in one of its transactions."""

COLUMNS: Final = ("job_id", "attempt", "learner", "stream", "seq", "id", "at", "line")
WRITTEN_COLUMNS: Final = (*COLUMNS, "tenant")
"""What the writer stores: a line, and its job's tenant (for search, migration 0034)."""


async def write_lines(db: asyncpg.Pool | Connection, lines: Sequence[LogLine]) -> int:
    """Store `lines` in one transaction with one COPY; returns how many were new.

    Within a batch, each series' seqs must increase; across batches, a series' lines must be
    written in seq order (one writer at a time, as one log shipper per node does), because a
    line at or below its series' stored seq counts as stored already and is left out. In the
    caller's transaction when `db` is a connection in one (which must be READ COMMITTED).
    """
    if not lines:
        return 0
    last_seqs = _last_seq_per_series(lines)
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await _write(conn, lines, last_seqs)
    return await _write(db, lines, last_seqs)


def _last_seq_per_series(lines: Sequence[LogLine]) -> dict[Series, int]:
    last: dict[Series, int] = {}
    for line in lines:
        previous = last.get(line.series, 0)
        if line.seq <= previous:
            raise ValueError(
                f"seq of {line.stream} of job {line.job_id} attempt {line.attempt} learner "
                f"{line.learner} goes from {previous} to {line.seq} in one batch: it must increase"
            )
        last[line.series] = line.seq
    return last


async def _write(conn: Connection, lines: Sequence[LogLine], last_seqs: dict[Series, int]) -> int:
    per_job = Counter(line.job_id for line in lines)
    series = list(last_seqs)
    async with conn.transaction():
        # First the lock (and the ids), then the stored seqs: in READ COMMITTED, the second
        # statement's snapshot is taken after the lock is granted, so it sees what the job's
        # previous writer committed.
        heads = await conn.fetch(Q["reserve_log_ids"], list(per_job), list(per_job.values()))
        next_id = {row["job_id"]: row["last_id"] - per_job[row["job_id"]] + 1 for row in heads}
        tenant = {row["job_id"]: row["tenant"] for row in heads}
        stored_rows = await conn.fetch(
            Q["advance_log_series"],
            [s[0] for s in series],
            [s[1] for s in series],
            [s[2] for s in series],
            [s[3].value for s in series],
            list(last_seqs.values()),
        )
        stored = {
            (r["job_id"], r["attempt"], r["learner"], Stream(r["stream"])): r["last_seq"]
            for r in stored_rows
        }
        records = []
        for line in lines:
            if line.seq <= stored.get(line.series, 0):
                continue  # stored by an earlier try of this batch, or before a restart
            records.append(
                (
                    line.job_id,
                    line.attempt,
                    line.learner,
                    line.stream.value,
                    line.seq,
                    next_id[line.job_id],
                    line.at,
                    line.text,
                    tenant[line.job_id],
                )
            )
            next_id[line.job_id] += 1
        if records:
            await conn.copy_records_to_table("job_logs", records=records, columns=WRITTEN_COLUMNS)
    return len(records)


async def last_seqs(db: Executor, job_id: UUID, attempt: int) -> dict[tuple[int, Stream], int]:
    """The last stored seq of each (learner, stream) of an attempt: an agent that resumes
    shipping numbers on from there. A series with nothing stored is absent (resume at 1)."""
    rows = await db.fetch(Q["log_last_seqs"], job_id, attempt)
    return {(r["learner"], Stream(r["stream"])): r["last_seq"] for r in rows}


async def read_lines(
    db: Executor,
    job_id: UUID,
    *,
    attempt: int | None = None,
    learner: int | None = None,
    after: int = 0,
    limit: int = 1000,
) -> list[StoredLine]:
    """Up to `limit` of a job's lines with an id above `after`, in id order (the order they
    were stored in; within a series, seq order), optionally of one attempt and learner."""
    rows = await db.fetch(Q["read_job_logs"], job_id, after, attempt, learner, limit)
    return [
        StoredLine(
            id=r["id"],
            line=LogLine(
                job_id=job_id,
                attempt=r["attempt"],
                learner=r["learner"],
                stream=Stream(r["stream"]),
                seq=r["seq"],
                at=r["at"],
                text=r["line"],
            ),
        )
        for r in rows
    ]


async def quiet_s(db: Executor, job_id: UUID, since: datetime | None = None) -> float | None:
    """Seconds (by the database's clock) since the job's log last moved: its last lines were
    stored, one of its learners ended, or `since`, whichever is latest. None while one of its
    learners is still allocated, or when nothing of the kind is known."""
    value: float | None = await db.fetchval(Q["job_log_quiet_s"], job_id, since)
    return value


async def last_id(db: Executor, job_id: UUID) -> int:
    """The id of the job's last stored line (0 when none): every line up to it is readable."""
    value: int = await db.fetchval(Q["job_log_last_id"], job_id)
    return value


async def log_usage(db: Executor, job_id: UUID) -> tuple[int, int]:
    """The lines and bytes (UTF-8) a job's log holds, over all its attempts."""
    row = await db.fetchrow(Q["job_log_usage"], job_id)
    if row is None:  # an aggregate without GROUP BY: one row, always
        raise InvariantBroken("job_log_usage returned no row")
    return row["lines"], row["bytes"]

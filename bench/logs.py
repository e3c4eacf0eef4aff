"""`trainyard bench logs`: how many log lines per second one learner's lines are stored at.

- log_lines_per_s: one writer (as one learner's shipper is) storing batches of BATCH lines with
  `write_lines`: the id reservation, the idempotency check and one COPY per batch.
- raw_copy_lines_per_s: the same lines, batches and connection, COPYed straight into a table of
  the same shape with no reservation and no idempotency check: the ceiling, measured in the
  same run so that the ratio says what the ordering and the exactly-once writes cost.

Both build their LogLines inside the timed loop, as the agent does. Everything runs in a
scratch database on the configured server, dropped at the end.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bench.scratch import scratch_database
from controlplane.database import connect
from controlplane.logs.lines import LogLine, Stream
from controlplane.logs.store import COLUMNS, write_lines

BATCH = 5000
TARGET_LINES_PER_S = 50_000


def _line(job_id: uuid.UUID, seq: int, at: datetime) -> LogLine:
    """A line shaped like a training progress report (about 90 characters)."""
    return LogLine(
        job_id=job_id,
        attempt=1,
        learner=0,
        stream=Stream.STDOUT,
        seq=seq,
        at=at,
        text=f"epoch 3 step {seq} loss {1.0 / seq:.6f} lr 0.000100 throughput 1834.2 samples/s",
    )


class _Learner:
    """One learner's output: batches of consecutive lines of one series."""

    def __init__(self) -> None:
        self.job_id = uuid.uuid4()
        self.next_seq = 1

    def batch(self) -> list[LogLine]:
        at = datetime.now(UTC)
        first, self.next_seq = self.next_seq, self.next_seq + BATCH
        return [_line(self.job_id, seq, at) for seq in range(first, self.next_seq)]


async def run(url: str, *, seconds: float) -> dict[str, Any]:
    async with scratch_database(url, "logs") as scratch:
        return await _measure(scratch, seconds)


async def _measure(url: str, seconds: float) -> dict[str, Any]:
    owner = await connect(url, role=None)
    try:
        # Same columns, constraints and indexes as `job_logs`.
        await owner.execute(
            "CREATE TABLE bench_raw_logs (LIKE job_logs INCLUDING ALL);"
            "GRANT SELECT, INSERT ON bench_raw_logs TO trainyard_app"
        )
    finally:
        await owner.close()
    conn = await connect(url)
    stored, copied = _Learner(), _Learner()

    async def store_batch() -> None:
        await write_lines(conn, stored.batch())

    async def copy_batch() -> None:
        # The per-job id is stood in for by seq: one writer, nothing to reserve.
        records = [
            (x.job_id, x.attempt, x.learner, x.stream.value, x.seq, x.seq, x.at, x.text)
            for x in copied.batch()
        ]
        await conn.copy_records_to_table("bench_raw_logs", records=records, columns=COLUMNS)

    try:
        # Halves alternated, so that drift in the machine's load hits both alike.
        store_s: list[float] = []
        copy_s: list[float] = []
        for _ in range(2):
            store_s += await _batches(seconds / 2, store_batch)
            copy_s += await _batches(seconds / 2, copy_batch)
        rows = await conn.fetchval("SELECT count(*) FROM job_logs")
    finally:
        await conn.close()
    if rows != stored.next_seq - 1:
        raise AssertionError(f"{stored.next_seq - 1} lines written, but {rows} stored")
    per_s = BATCH * len(store_s) / sum(store_s)
    raw_per_s = BATCH * len(copy_s) / sum(copy_s)
    return {
        "seconds": seconds,
        "batch_size": BATCH,
        "log_lines_per_s": round(per_s),
        "target_lines_per_s": TARGET_LINES_PER_S,
        "meets_target": per_s >= TARGET_LINES_PER_S,
        "batch_ms_p50": round(statistics.median(store_s) * 1000, 2),
        "batch_ms_max": round(max(store_s) * 1000, 2),
        "raw_copy_lines_per_s": round(raw_per_s),
        "ratio_vs_raw_copy": round(per_s / raw_per_s, 3),
    }


async def _batches(seconds: float, write: Callable[[], Awaitable[None]]) -> list[float]:
    """The duration of each batch written until the deadline (at least one)."""
    durations: list[float] = []
    deadline = time.perf_counter() + seconds
    while not durations or time.perf_counter() < deadline:
        start = time.perf_counter()
        await write()
        durations.append(time.perf_counter() - start)
    return durations

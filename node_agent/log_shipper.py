"""Shipping learner log lines to Postgres in batches, without ever making a learner wait.

`add` is synchronous and never blocks: it puts the line in a bounded buffer, and `run` stores
the buffer in batches (one COPY each) whenever `batch_lines` lines are waiting, or every
`flush_interval_s`. A chatty learner therefore costs one COPY per batch, not a round trip per
line.

Backpressure: when the database is slow or away, the buffer fills up to `max_buffered_chars`.
Blocking `add` then would stall the pipe readers and, once the pipe's 64 KiB are full, the
learner itself, for as long as the database is away: training must not depend on the log store.
So beyond the bound lines are dropped, but never silently: the dropped lines of a series are
counted, and once there is room again a marker line saying how many were dropped (and which
seqs) is stored in their place, under the last dropped seq, before the series' next line.
Memory stays bounded and the log shows exactly where it has a hole.

Batches are written one at a time (a lock, see `flush`), so each series reaches the database
in seq order; `write_lines` leaves out lines already stored, so a batch whose commit went
unacknowledged is simply written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, replace
from itertools import islice

import asyncpg

from controlplane.database import DATABASE_ERRORS
from controlplane.instruments import LOG_LINES
from controlplane.logs.lines import LogLine, Series
from controlplane.logs.store import write_lines

log = logging.getLogger(__name__)

LINE_OVERHEAD = 200
"""Roughly what a buffered line costs beyond its text (the object and its fields), in bytes."""


@dataclass
class _Gap:
    """Consecutive lines of one series dropped for want of room."""

    first: LogLine
    last_seq: int
    count: int

    def marker(self) -> LogLine:
        lines = "line" if self.count == 1 else "lines"
        seqs = (
            f"seq {self.first.seq}" if self.count == 1 else f"seqs {self.first.seq}-{self.last_seq}"
        )
        text = f"[trainyard] {self.count} {lines} dropped ({seqs}): log storage fell behind"
        return replace(self.first, seq=self.last_seq, text=text)


class LogShipper:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        batch_lines: int = 5000,
        flush_interval_s: float = 0.2,
        max_buffered_chars: int = 64 << 20,
        retry_s: float = 1.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self._pool = pool
        self._batch_lines = batch_lines
        self._flush_interval_s = flush_interval_s
        self._capacity = max_buffered_chars
        self._retry_s = retry_s
        self._stop_timeout_s = stop_timeout_s
        self._buffer: deque[LogLine] = deque()
        self._buffered_chars = 0
        self._gaps: dict[Series, _Gap] = {}
        self._added = 0
        """Lines put in the buffer so far (markers included); `_stored` counts those stored."""
        self._stored = 0
        self._dropped = 0
        self._writing = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    @property
    def pending(self) -> int:
        """Lines buffered and not yet stored."""
        return len(self._buffer)

    @property
    def dropped(self) -> int:
        """Lines dropped for want of room so far (each one accounted for by a marker)."""
        return self._dropped

    def add(self, line: LogLine) -> None:
        """Buffer a line for storing; never blocks (see the module's note on backpressure)."""
        cost = len(line.text) + LINE_OVERHEAD
        if self._buffered_chars + cost > self._capacity:
            self._drop(line)
            return
        gap = self._gaps.pop(line.series, None)
        if gap is not None:
            # Before the line: a series' seqs must reach the database in order.
            self._push(gap.marker())
        self._push(line)
        if len(self._buffer) >= self._batch_lines:
            self._wake.set()

    def _drop(self, line: LogLine) -> None:
        self._dropped += 1
        gap = self._gaps.get(line.series)
        if gap is None:
            self._gaps[line.series] = _Gap(first=line, last_seq=line.seq, count=1)
        else:
            gap.last_seq, gap.count = line.seq, gap.count + 1

    def _push(self, line: LogLine) -> None:
        self._buffer.append(line)
        self._buffered_chars += len(line.text) + LINE_OVERHEAD
        self._added += 1

    async def flush(self) -> None:
        """Store every line added before the call (and a marker for every gap so far); raises
        the database's error when it cannot, keeping the lines for the next try."""
        # One writer at a time, `run` or a caller: two batches of one series in flight at
        # once could commit out of order, and the earlier one would then count as stored.
        async with self._writing:
            # Markers of series that have fallen silent since their gap: they may exceed the
            # bound by one short line per series, so that no gap goes unreported.
            for gap in self._gaps.values():
                self._push(gap.marker())
            self._gaps.clear()
            target = self._added
            while self._stored < target:
                batch = list(islice(self._buffer, self._batch_lines))
                LOG_LINES.add(await write_lines(self._pool, batch))
                for _ in batch:
                    self._buffered_chars -= len(self._buffer.popleft().text) + LINE_OVERHEAD
                self._stored += len(batch)

    async def run(self) -> None:
        """Ship lines until `stop()`, retrying while the database is away; then ship what is
        left, for up to `stop_timeout_s`."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_interval_s)
            self._wake.clear()  # before flushing: a batch filled meanwhile wakes the next round
            try:
                await self.flush()
            except DATABASE_ERRORS as exc:
                log.warning(
                    "log shipper: %s; %d lines wait, retrying in %.1fs",
                    exc,
                    self.pending,
                    self._retry_s,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self._retry_s)
        await self._last_flush()

    async def _last_flush(self) -> None:
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                while True:
                    try:
                        await self.flush()
                        return
                    except DATABASE_ERRORS as exc:
                        log.warning("log shipper stopping: %s; retrying", exc)
                        await asyncio.sleep(self._retry_s)
        except TimeoutError:
            log.error(
                "log shipper stopped with %d line(s) not stored: the database did not take them "
                "within %.0fs",
                self.pending,
                self._stop_timeout_s,
            )

    def stop(self) -> None:
        """Make `run` ship what is buffered and return."""
        self._stopping.set()
        self._wake.set()

"""Shipping learner log lines to Postgres in batches, without ever making a learner wait.

`add` is synchronous and never blocks: it puts the line in its job's bounded buffer, and `run`
stores the buffers in batches (one COPY each) whenever `batch_lines` lines are waiting, or every
`flush_interval_s`. A chatty learner therefore costs one COPY per batch, not a round trip per
line.

Backpressure: when the database is slow or away, a job's buffer fills up to `job_buffer_chars`.
Blocking `add` then would stall the pipe readers and, once the pipe's 64 KiB are full, the
learner itself, for as long as the database is away: training must not depend on the log store.
So beyond the bound lines are dropped, but never silently: the dropped lines of a series are
counted, and once there is room again a marker line saying how many were dropped (and which
seqs) is stored in their place, under the last dropped seq, before the series' next line.
Memory stays bounded and the log shows exactly where it has a hole. The bound is per job, so
that one learner's flood fills only its own job's buffer and never drops another job's lines.

Limits: a job opened with its `JobLimits` (`open`) may store so many lines and bytes over all
its attempts, counted from what its log already holds (after an agent restart too). The first
line past either limit is replaced by a marker saying the limit is reached; the later ones are
dropped and counted, and `seal` (when the attempt ends) stores a marker per series saying how
many. Markers do not count towards the limits.

Batches are written one at a time (a lock, see `flush`), so each series reaches the database
in seq order; `write_lines` leaves out lines already stored, so a batch whose commit went
unacknowledged is simply written again. Jobs take turns, a batch each, so that a flood delays
no other job's lines by more than a batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import islice
from uuid import UUID

from controlplane.agent_port.protocol import LogWriter
from controlplane.agent_port.support import LOG_LINES, pause
from controlplane.agent_port.vocabulary import (
    UNAVAILABLE,
    InvariantBroken,
    JobLimits,
    LogLine,
    Series,
)

log = logging.getLogger(__name__)

LINE_OVERHEAD = 200
"""Roughly what a buffered line costs beyond its text (the object and its fields), in bytes."""

JOB_BUFFER_CHARS = 16 << 20
"""What one job's lines may hold of the agent's memory while they wait to be stored."""


@dataclass
class _Gap:
    """Consecutive lines of one series dropped for want of room (or past the job's limit)."""

    first: LogLine
    last_seq: int
    count: int

    def add(self, line: LogLine) -> None:
        self.last_seq, self.count = line.seq, self.count + 1

    def seqs(self) -> str:
        if self.count == 1:
            return f"seq {self.first.seq}"
        return f"seqs {self.first.seq}-{self.last_seq}"

    def marker(self, why: str) -> LogLine:
        lines = "line" if self.count == 1 else "lines"
        text = f"[trainyard] {self.count} {lines} dropped ({self.seqs()}): {why}"
        return replace(self.first, seq=self.last_seq, text=text)


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


@dataclass
class _JobLog:
    """One job's lines waiting to be stored, and what it has logged towards its limits."""

    buffer: deque[LogLine] = field(default_factory=deque)
    chars: int = 0
    added: int = 0
    """Lines put in the buffer so far (markers included); `stored` counts those stored."""
    stored: int = 0
    gaps: dict[Series, _Gap] = field(default_factory=dict)
    """Lines dropped for want of room, not yet marked."""
    limits: JobLimits | None = None
    """None until the job is opened (and for lines that come without a job's limits)."""
    lines: int = 0
    bytes: int = 0
    limited: bool = False
    """The job reached a limit: every later line is dropped."""
    noted: bool = False
    """The limit's marker is buffered; later dropped lines are counted in `over`."""
    over: dict[Series, _Gap] = field(default_factory=dict)
    """Lines dropped past the limit since the limit's marker, not yet counted in a marker."""
    attempts: set[int] = field(default_factory=set)
    """The job's attempts that run here (opened, not yet closed): two at once when a restart
    claims the next one here while the last one's learners still end. Once none does, the job
    is forgotten as soon as its buffer is stored."""

    def push(self, line: LogLine) -> None:
        self.buffer.append(line)
        self.chars += len(line.text) + LINE_OVERHEAD
        self.added += 1

    def within_limits(self, line: LogLine) -> bool:
        """Whether `line` may be stored under the job's limits; counts it when it may."""
        if self.limits is None:
            return True
        size = _utf8_size(line.text)
        if not self.limited:
            fits = self.lines < self.limits.log_lines and self.bytes + size <= self.limits.log_bytes
            if fits:
                self.lines += 1
                self.bytes += size
                return True
            self.limited = True
        return False

    @property
    def idle(self) -> bool:
        return not self.attempts and not self.buffer and not self.gaps and not self.over


class LogShipper:
    def __init__(
        self,
        port: LogWriter,
        *,
        batch_lines: int = 5000,
        flush_interval_s: float = 0.2,
        job_buffer_chars: int = JOB_BUFFER_CHARS,
        retry_s: float = 1.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self._port = port
        self._batch_lines = batch_lines
        self._flush_interval_s = flush_interval_s
        self._capacity = job_buffer_chars
        self._retry_s = retry_s
        self._stop_timeout_s = stop_timeout_s
        self._jobs: dict[UUID, _JobLog] = {}
        self._dropped = 0
        self._writing = asyncio.Lock()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    @property
    def pending(self) -> int:
        """Lines buffered and not yet stored, of all jobs."""
        return sum(len(job.buffer) for job in self._jobs.values())

    def pending_of(self, job_id: UUID) -> int:
        """The job's lines buffered and not yet stored."""
        job = self._jobs.get(job_id)
        return 0 if job is None else len(job.buffer)

    @property
    def dropped(self) -> int:
        """Lines dropped for want of room or past a limit so far (each one in a marker)."""
        return self._dropped

    async def open(self, job_id: UUID, attempt: int, limits: JobLimits) -> None:
        """The job's `attempt` starts (or is adopted) here: enforce `limits`, counting from
        what the job's log holds already. The database's error when it cannot read that."""
        lines, size = await self._port.log_usage(job_id)
        job = self._job(job_id)
        job.limits, job.lines, job.bytes = limits, lines, size
        job.limited = job.noted = False
        job.attempts.add(attempt)

    def close(self, job_id: UUID, attempt: int) -> None:
        """The job's `attempt` here has ended (or never opened): once no other attempt of the
        job runs here, forget the job as soon as its lines are stored. Not before: a restart
        may have claimed the next attempt here already, whose lines the limits still hold."""
        job = self._jobs.get(job_id)
        if job is not None:
            job.attempts.discard(attempt)
            if job.idle:
                del self._jobs[job_id]

    def _job(self, job_id: UUID) -> _JobLog:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _JobLog()
        return job

    def add(self, line: LogLine) -> None:
        """Buffer a line for storing; never blocks (see the module's note on backpressure)."""
        job = self._job(line.job_id)
        if not job.within_limits(line):
            self._over_limit(job, line)
            return
        if job.chars + len(line.text) + LINE_OVERHEAD > self._capacity:
            self._drop(job, line)
            return
        gap = job.gaps.pop(line.series, None)
        if gap is not None:
            # Before the line: a series' seqs must reach the database in order.
            job.push(gap.marker("log storage fell behind"))
        job.push(line)
        if len(job.buffer) >= self._batch_lines:
            self._wake.set()

    def _drop(self, job: _JobLog, line: LogLine) -> None:
        self._dropped += 1
        gap = job.gaps.get(line.series)
        if gap is None:
            job.gaps[line.series] = _Gap(first=line, last_seq=line.seq, count=1)
        else:
            gap.add(line)

    def _over_limit(self, job: _JobLog, line: LogLine) -> None:
        self._dropped += 1
        if not job.noted:
            # The first line past the limit (since the job was opened here): its place says
            # so at once, so that a follower learns why the log stops. Room or not: one line.
            job.noted = True
            gap = job.gaps.pop(line.series, None)
            if gap is not None:
                job.push(gap.marker("log storage fell behind"))
            if job.limits is None:  # `noted` only once the limits were read
                raise InvariantBroken(f"job {line.job_id}: past its log limit without limits")
            text = (
                f"[trainyard] the job's log limit is reached ({job.limits.log_lines} lines or "
                f"{job.limits.log_bytes} bytes over all attempts): this line and the later ones "
                "are dropped, and counted when the attempt ends"
            )
            job.push(replace(line, text=text))
            return
        gap = job.over.get(line.series)
        if gap is None:
            job.over[line.series] = _Gap(first=line, last_seq=line.seq, count=1)
        else:
            gap.add(line)

    async def flush(self) -> None:
        """Store every line added before the call (and a marker for every gap so far), of
        every job; raises the database's error when it cannot, keeping the lines for the next
        try."""
        async with self._writing:
            await self._store(list(self._jobs), final=False)

    def hurry(self) -> None:
        """Make `run` store what is buffered now rather than at its next interval."""
        self._wake.set()

    async def seal(self, job_id: UUID) -> None:
        """The job's attempt has ended: store its lines added before the call, with a marker
        per series saying how many lines were dropped past its limit; the database's error when
        it cannot (the lines are kept, the markers too)."""
        async with self._writing:
            await self._store([job_id], final=True)

    async def _store(self, job_ids: list[UUID], *, final: bool) -> None:
        # One writer at a time (the caller holds `_writing`), `run` or a caller: two batches
        # of one series in flight at once could commit out of order, and the earlier one
        # would then count as stored.
        targets: list[tuple[_JobLog, int]] = []
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is None:
                continue
            # Markers of series that have fallen silent since their gap: they may exceed the
            # bound by one short line per series, so that no gap goes unreported.
            for gap in job.gaps.values():
                job.push(gap.marker("log storage fell behind"))
            job.gaps.clear()
            if final:
                for gap in job.over.values():
                    job.push(gap.marker("the job's log limit was reached"))
                job.over.clear()
            targets.append((job, job.added))
        # Jobs take turns, a batch each: a flood of one job delays the others by one batch.
        while targets:
            for job, target in targets:
                batch = list(islice(job.buffer, min(self._batch_lines, target - job.stored)))
                LOG_LINES.add(await self._port.write_lines(batch))
                for _ in batch:
                    job.chars -= len(job.buffer.popleft().text) + LINE_OVERHEAD
                job.stored += len(batch)
            targets = [(job, target) for job, target in targets if job.stored < target]
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None and job.idle:
                del self._jobs[job_id]

    async def run(self) -> None:
        """Ship lines until `stop()`, retrying while the database is away; then ship what is
        left, for up to `stop_timeout_s`."""
        while not self._stopping.is_set():
            await pause(self._wake, self._flush_interval_s)
            self._wake.clear()  # before flushing: a batch filled meanwhile wakes the next round
            try:
                await self.flush()
            except UNAVAILABLE as exc:
                log.warning(
                    "log shipper: %s; %d lines wait, retrying in %.1fs",
                    exc,
                    self.pending,
                    self._retry_s,
                )
                await pause(self._stopping, self._retry_s)
        await self._last_flush()

    async def _last_flush(self) -> None:
        try:
            async with asyncio.timeout(self._stop_timeout_s):
                while True:
                    try:
                        await self.flush()
                        return
                    except UNAVAILABLE as exc:
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

"""The control plane's shared tooling that an agent runs with: its metrics instruments, its
tracer, rate limiting and interruptible waits. Re-exported, so that the agent depends on the
port package alone."""

from __future__ import annotations

from controlplane.instruments import GPU_UTILIZATION, LOG_LINES, Reading
from controlplane.jobs.tracing import tracer
from controlplane.rates import TokenBucket
from controlplane.workers import pause

__all__ = ["GPU_UTILIZATION", "LOG_LINES", "Reading", "TokenBucket", "pause", "tracer"]

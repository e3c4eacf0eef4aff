"""One trace per job: the span that submitted it (an API request's, usually) is the root, its
context travels in the metadata of the job's first event, and every later step of the job (a
claim, an attempt and its learners' start, phases, checkpoints, the end, restarts, a cancel)
is a span in that trace, in whichever process takes the step."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span
from opentelemetry.util.types import Attributes

from controlplane.events.records import RecordedEvent

tracer = trace.get_tracer("trainyard")

_WORD = re.compile(r"(?<!^)(?=[A-Z])")


def job_root(history: Sequence[RecordedEvent]) -> Context | None:
    """The job's trace, from its first event; None for a job without one."""
    if not history or not history[0].metadata.trace:
        return None
    return history[0].metadata.trace_context()


def command_span_name(command: object) -> str:
    """`job.cancel`, `job.enter_phase`, ... for a lifecycle command."""
    return "job." + _WORD.sub("_", type(command).__name__).lower()


@contextmanager
def job_span(
    name: str,
    root: Context | None,
    attributes: Attributes,
    *,
    start_time: int | None = None,
) -> Iterator[Span]:
    """A current span in the job's trace: a child of the current span if that is in the trace
    already (an attempt's steps), else a child of the job's root, linked to the current span
    (a cancel request's, say) so that both traces lead to each other."""
    current = trace.get_current_span().get_span_context()
    parent: Context | None = None
    links: list[Link] = []
    if root is not None:
        job_trace = trace.get_current_span(root).get_span_context().trace_id
        if current.trace_id != job_trace:
            parent = root
            links = [Link(current)] if current.is_valid else []
    with tracer.start_as_current_span(
        name, context=parent, links=links, attributes=attributes, start_time=start_time
    ) as span:
        yield span

"""What every event carries besides its data: who, for which tenant, why, and its trace."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from pydantic import BaseModel, ConfigDict, Field


class Metadata(BaseModel):
    """Event metadata: actor, tenant, correlation and causation ids, W3C trace context."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    actor: str = Field(min_length=1, description="who caused the event: 'user:alice', 'agent:n1'")
    tenant: str | None = None
    correlation_id: str | None = Field(
        default=None, description="groups every event of one request or job lifecycle step"
    )
    causation_id: str | None = Field(
        default=None, description="the request or event (global position) that caused this one"
    )
    trace: dict[str, str] = Field(
        default_factory=dict, description="W3C trace context carrier (traceparent, tracestate)"
    )

    @classmethod
    def capture(
        cls,
        actor: str,
        *,
        tenant: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
    ) -> Metadata:
        """Metadata with the trace context of the current OpenTelemetry span, if any."""
        return cls(
            actor=actor,
            tenant=tenant,
            correlation_id=correlation_id,
            causation_id=causation_id,
            trace=_current_trace(),
        )

    def traced(self) -> Metadata:
        """The same metadata in the current span's trace context (a job's step, say)."""
        return self.model_copy(update={"trace": _current_trace()})

    def trace_context(self) -> otel_context.Context:
        """The OpenTelemetry context to continue this event's trace in."""
        return propagate.extract(self.trace)


def _current_trace() -> dict[str, str]:
    # Outside a valid span (tracing off, or no span) there is nothing to carry: skip the
    # propagators, which a claim would otherwise run for every job it takes.
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier

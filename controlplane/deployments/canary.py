"""A canary's two rules, pure so that they are tested by counting: which version a request goes
to (by the canary's weight and a draw), and when the canary's errors roll it back. No I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WEIGHT_SCALE = 100
"""A weight is the percentage of requests the canary gets: 0 to 100."""


def to_canary(weight: int, draw: float) -> bool:
    """Whether a request goes to the canary: `draw` is uniform in [0, 1) (the caller's random
    source; a fixed sequence in tests), so a weight of w sends w% of requests, 0 none, 100
    all."""
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"a draw is in [0, 1), not {draw}")
    return draw * WEIGHT_SCALE < weight


@dataclass(frozen=True, slots=True)
class Rollback:
    """When the canary rolls back by itself (spec.CanaryRollback)."""

    max_error_rate: float
    min_requests: int
    window_s: float

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Rollback:
        return cls(
            max_error_rate=float(spec["max_error_rate"]),
            min_requests=int(spec["min_requests"]),
            window_s=float(spec["window_s"]),
        )


@dataclass(frozen=True, slots=True)
class Errors:
    """The canary version's requests that ended within the rule's window."""

    finished: int
    failed: int

    @property
    def rate(self) -> float:
        return self.failed / self.finished if self.finished else 0.0


def rollback_reason(rule: Rollback, errors: Errors) -> str | None:
    """Why the canary must roll back now (None: it may stay). Too few requests say nothing yet:
    one failure of the first request is no rate."""
    if errors.finished < rule.min_requests or errors.rate <= rule.max_error_rate:
        return None
    return (
        f"error rate {errors.rate:.3f} ({errors.failed} of {errors.finished} requests in the "
        f"last {rule.window_s:g}s) passed its limit {rule.max_error_rate:g}"
    )

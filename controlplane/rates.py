"""Token buckets: a rate with a burst, pure over the instants they are given (no clock here),
so that the submission limiter and the agent's report limiter are tested without waiting."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """Holds up to `burst` tokens, refilled at `rate` per second; each action takes one."""

    rate: float
    burst: float
    tokens: float
    last: float
    """The instant (seconds, any monotonic clock) `tokens` was counted at."""

    @classmethod
    def full(cls, rate: float, burst: float, at: float) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=burst, last=at)

    def take(self, at: float) -> float:
        """Take a token at `at`: 0.0 when one was there, else the seconds until one will be
        (nothing is taken then, so that refused actions do not push the next one back)."""
        self.tokens = min(self.burst, self.tokens + max(0.0, at - self.last) * self.rate)
        self.last = max(self.last, at)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

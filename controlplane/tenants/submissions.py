"""The submission rate limit: a token bucket per tenant, in this control plane's memory.

Each replica keeps its own buckets, so behind N replicas a tenant may submit up to N times its
rate; the limit protects each replica and the database from a flood, it is not an exact quota
(the queued-jobs limit, counted in the database, bounds what a tenant can pile up).
"""

from __future__ import annotations

from controlplane.rates import TokenBucket
from controlplane.tenants.limits import TenantLimits


class SubmissionRates:
    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, tenant: str, limits: TenantLimits, at: float) -> float:
        """Take one submission of `tenant` at `at` (monotonic seconds): 0.0 if allowed, else
        the seconds until the next one would be. A change of the tenant's limits applies at
        once, keeping the tokens it has (up to the new burst)."""
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = TokenBucket.full(limits.submissions_per_s, limits.submission_burst, at)
            self._buckets[tenant] = bucket
        bucket.rate = limits.submissions_per_s
        bucket.burst = limits.submission_burst
        return bucket.take(at)

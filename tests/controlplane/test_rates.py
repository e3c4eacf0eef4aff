"""Token buckets over given instants: a burst at once, then the rate; a refusal says how long
to wait and takes nothing; a change of limits keeps the tokens held."""

from __future__ import annotations

import pytest

from controlplane.rates import TokenBucket
from controlplane.tenants.limits import TenantLimits
from controlplane.tenants.submissions import SubmissionRates


def test_a_burst_at_once_then_one_per_interval() -> None:
    bucket = TokenBucket.full(rate=2.0, burst=3, at=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == pytest.approx(0.5)
    assert bucket.take(100.25) == pytest.approx(0.25)  # refused tries take nothing
    assert bucket.take(100.5) == 0.0
    # Idle time refills no more than the burst.
    assert [bucket.take(1000.0) for _ in range(4)][-1] == pytest.approx(0.5)


def test_a_clock_that_steps_back_adds_nothing() -> None:
    bucket = TokenBucket.full(rate=1.0, burst=1, at=10.0)
    assert bucket.take(10.0) == 0.0
    assert bucket.take(5.0) == pytest.approx(1.0)


def test_each_tenant_has_its_bucket_and_a_change_of_limits_keeps_its_tokens() -> None:
    rates = SubmissionRates()
    slow = TenantLimits(submissions_per_s=1, submission_burst=1)
    assert rates.take("acme", slow, 0.0) == 0.0
    assert rates.take("acme", slow, 0.0) == pytest.approx(1.0)
    assert rates.take("globex", slow, 0.0) == 0.0
    faster = TenantLimits(submissions_per_s=10, submission_burst=5)
    assert rates.take("acme", faster, 0.0) == pytest.approx(0.1)  # no new burst for free
    assert rates.take("acme", faster, 0.1) == 0.0

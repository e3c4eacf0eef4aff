"""Estimated starts: the running attempts' room comes back at their expected ends, and the
queue takes it in the policy's order; where an end it waits for is unknown, no estimate."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from controlplane.pending.estimates import Holding, estimated_in_order
from controlplane.pending.reasons import queue_order
from controlplane.scheduling.claim_order import TenantShare
from controlplane.scheduling.policy import Order
from tests.controlplane.pending.test_reasons import NOW, job, node

MINUTE = timedelta(minutes=1)


def running(tenant: str, gpu: str, ends_in: timedelta | None) -> Holding:
    return Holding(tenant, "n0", (gpu,), 1.0, 1024, None if ends_in is None else NOW + ends_in)


def test_jobs_start_as_the_room_they_need_comes_back() -> None:
    tenants = [TenantShare("acme", 1.0, None, 2)]
    nodes = [node("n0", 0, gpus=2)]
    holdings = [running("acme", "n0-g0", 10 * MINUTE), running("acme", "n0-g1", None)]
    queue = [job(1, "acme"), job(2, "acme"), job(3, "acme")]
    expected = {UUID(int=1): 5 * MINUTE}
    ordered = queue_order(tenants, queue, Order.FAIR_SHARE)
    starts = estimated_in_order(nodes, tenants, ordered, holdings, expected, now=NOW)
    # The one GPU whose end is known serves the queue in turn; the third waits for the
    # second, whose run time nobody knows: no estimate.
    assert starts == {UUID(int=1): NOW + 10 * MINUTE, UUID(int=2): NOW + 15 * MINUTE}


def test_a_backoff_and_a_quota_hold_a_job_until_they_end() -> None:
    tenants = [TenantShare("acme", 1.0, 1, 1), TenantShare("globex", 1.0, None, 0)]
    nodes = [node("n0", 2, gpus=3)]
    holdings = [running("acme", "n0-g2", 7 * MINUTE)]
    queue = [job(1, "acme"), job(2, "globex", not_before=NOW + 3 * MINUTE), job(3, "globex")]
    ordered = queue_order(tenants, queue, Order.FAIR_SHARE)
    starts = estimated_in_order(nodes, tenants, ordered, holdings, {}, now=NOW)
    assert starts == {
        UUID(int=3): NOW,  # a free GPU now
        UUID(int=2): NOW + 3 * MINUTE,  # the other free GPU, once its backoff ends
        UUID(int=1): NOW + 7 * MINUTE,  # acme's quota of 1, held until then
    }

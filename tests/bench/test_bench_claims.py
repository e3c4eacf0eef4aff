"""`trainyard bench claims`, its queue parts briefly: eight agents claim concurrently from a deep
queue with the queue's projections in their own process, and no job or GPU is claimed twice;
and both queues of the comparison take and finish every job (its figures are for `bench/`,
not for this test)."""

from __future__ import annotations

from bench.claims import _claims, _versus_peer


async def test_agents_claim_a_deep_queue_and_never_twice(db_url: str) -> None:
    result = await _claims(db_url, 1.0, print)
    assert result["claims"] > 0 and result["claims_per_s"] > 0
    assert result["double_claims"] == 0


async def test_the_comparison_takes_and_finishes_every_job_on_both_sides(db_url: str) -> None:
    # Each side checks that every job it enqueued was taken and finished.
    result = await _versus_peer(db_url, print)
    assert result["jobs_per_s"] > 0 and result["peer_jobs_per_s"] > 0
    ratio = result["jobs_per_s"] / result["peer_jobs_per_s"]
    assert abs(result["ratio_vs_peer"] - ratio) < 0.01

"""What each wake makes a node agent do (pure; the agents themselves: test_agent_wakes.py)."""

from __future__ import annotations

from node_agent.wakes import Heard, Round, gpu_free, round_after

START = Heard(wakes=5, claimable=2, requests=3)
NOTHING = Round(requests=False, claim=False, changed=False)
EVERYTHING = Round(requests=True, claim=True, changed=False)


def test_a_claimable_job_wakes_the_claim_alone() -> None:
    after = Heard(wakes=7, claimable=4, requests=3)
    assert round_after(START, after, changed=False, polled=False) == Round(
        requests=False, claim=True, changed=False
    )


def test_a_request_wakes_the_requests_alone() -> None:
    after = Heard(wakes=6, claimable=2, requests=4)
    assert round_after(START, after, changed=False, polled=False) == Round(
        requests=True, claim=False, changed=False
    )


def test_the_agent_s_own_change_claims_whatever_the_listener_heard() -> None:
    assert round_after(START, START, changed=True, polled=False) == Round(
        requests=False, claim=False, changed=True
    )


def test_the_listener_s_own_poll_does_nothing_before_the_agent_s_poll_is_due() -> None:
    assert round_after(START, START, changed=False, polled=False) == NOTHING


def test_the_poll_does_everything() -> None:
    assert round_after(START, START, changed=False, polled=True) == EVERYTHING
    both = round_after(START, START, changed=True, polled=True)
    assert both == Round(requests=True, claim=True, changed=True)


def test_a_wake_no_channel_counts_does_everything() -> None:
    # The listener reconnected (notifications may have been lost meanwhile), alone or among
    # notifications.
    alone = Heard(wakes=6, claimable=2, requests=3)
    assert round_after(START, alone, changed=False, polled=False) == EVERYTHING
    among = Heard(wakes=8, claimable=3, requests=4)
    assert round_after(START, among, changed=False, polled=False) == EVERYTHING


GPUS = ["GPU-a", "GPU-b"]


def test_a_node_with_a_gpu_no_learner_holds_has_one_free() -> None:
    assert gpu_free(GPUS, unhealthy=set(), held=set())
    assert gpu_free(GPUS, unhealthy=set(), held={"GPU-a"})


def test_a_node_whose_gpus_are_all_held_has_none_free() -> None:
    assert not gpu_free(GPUS, unhealthy=set(), held={"GPU-a", "GPU-b"})


def test_an_unhealthy_gpu_is_never_free() -> None:
    assert not gpu_free(GPUS, unhealthy={"GPU-b"}, held={"GPU-a"})


def test_a_node_without_a_healthy_gpu_claims_as_a_cpu_node_does() -> None:
    assert gpu_free([], unhealthy=set(), held=set())
    assert gpu_free(GPUS, unhealthy=set(GPUS), held=set())

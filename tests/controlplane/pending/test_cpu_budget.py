"""The recorder's CPU budget (`pending.cpu_budget`): rounds back to back keep to the share over
time, whatever each costs; a round after a quiet spell may spend the burst at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pytest import approx

from controlplane.pending.cpu_budget import CpuBudget

INTERVAL_S = 0.25
"""The recorder's own least pause between rounds (`recorder.ROUND_S`)."""


def test_a_first_round_within_the_burst_goes_on_at_once() -> None:
    budget = CpuBudget(share=0.1, burst_s=0.1)
    assert budget.pause_after(0.05, now=10.0) == 0.0


def test_a_round_beyond_the_burst_pauses_until_its_excess_is_earned() -> None:
    budget = CpuBudget(share=0.1, burst_s=0.1)
    # 0.3 s of CPU, 0.1 of it the burst: 0.2 s more, earned at a tenth of a second a second.
    assert budget.pause_after(0.3, now=10.0) == approx(2.0)


def test_a_quiet_spell_earns_the_burst_back_and_no_more() -> None:
    budget = CpuBudget(share=0.1, burst_s=0.1)
    assert budget.pause_after(0.3, now=0.0) == approx(2.0)
    # An hour idle earns far more than the burst, but only the burst is kept.
    assert budget.pause_after(0.1, now=3600.0) == 0.0
    assert budget.pause_after(0.05, now=3600.0) == approx(0.5)


@given(
    rounds=st.lists(
        st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.3)),  # CPU spent, wall time beyond it
        min_size=1,
        max_size=200,
    ),
    fraction=st.sampled_from([0.05, 0.1, 0.2]),
    burst_s=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_rounds_that_pause_as_told_keep_to_the_share(
    rounds: list[tuple[float, float]], fraction: float, burst_s: float
) -> None:
    budget = CpuBudget(share=fraction, burst_s=burst_s)
    now = 0.0
    spent = 0.0
    for cpu_s, waited_s in rounds:
        now += cpu_s + waited_s  # a round takes at least its CPU time
        spent += cpu_s
        now += max(INTERVAL_S, budget.pause_after(cpu_s, now=now))
    # Over the whole run, no more than the share of the time it took, and the burst.
    assert spent <= fraction * now + burst_s + 1e-9

"""How soon a reader of the log looks again at news an older transaction holds back."""

from __future__ import annotations

from controlplane.events.subscription import HELD_BACK_S, HeldBack


def test_it_looks_again_soon_then_twice_as_late_up_to_the_most_and_anew_once_nothing_is_held() -> (
    None
):
    held = HeldBack()
    assert held.within(False) is None
    waits = [held.within(True) for _ in range(12)]
    first, most = HELD_BACK_S
    assert waits == [min(first * 2**k, most) for k in range(12)]
    assert waits[-1] == most
    assert held.within(False) is None
    assert held.within(True) == HELD_BACK_S[0]

"""The pending-reasons recorder's CPU budget, a share of a core: how long to pause after each
round.

The recorder judges the whole queue, tens of milliseconds of CPU a round with thousands queued,
and on a saturated machine every millisecond of it is taken from claims (`bench simulate`'s
`claim_slowdown`). Paced on each round alone (a pause of four times its CPU time, at least the
recorder's interval), rounds under claims took 0.13 to 0.17 of a core. A budget instead: the
rounds earn CPU time at `share` of a core while time passes, keep at most `burst_s` of it
unspent, and pause until what they spent beyond it is earned back. Rounds back to back under
claims keep to the share, however long each is; a short round after a quiet spell goes on at
once.

Pure, with the instants given, so that tests need no clock."""

from __future__ import annotations

from dataclasses import dataclass

SHARE = 0.1
"""The part of one core that the rounds take on average while the queue keeps changing."""
BURST_S = 0.1
"""CPU seconds the rounds may spend ahead of the share after a quiet spell. Not more: the
credit a quiet spell leaves is spent as soon as claims start, on top of the share, just when
the claims want the CPU (0.5 s of it gave 0.14 of a core over a 4-second claim round)."""


@dataclass(slots=True)
class CpuBudget:
    """The rounds' CPU budget: one per recorder, counted as its rounds end."""

    share: float = SHARE
    burst_s: float = BURST_S
    _credit: float | None = None
    """CPU seconds earned and not spent (negative: spent ahead); None before the first round."""
    _at: float = 0.0
    """When the credit was last counted (monotonic seconds)."""

    def pause_after(self, spent_s: float, now: float) -> float:
        """Count a round that took `spent_s` of CPU and ended at `now`; the seconds to pause
        before the next one may start, so that the rounds keep to the share."""
        if self._credit is None:
            credit = self.burst_s
        else:
            credit = min(self.burst_s, self._credit + (now - self._at) * self.share)
        self._credit = credit - spent_s
        self._at = now
        return max(0.0, -self._credit / self.share)

"""Training metrics, reported as protocol lines: `metrics.log(step=100, loss=0.25, acc=0.9)`."""

from __future__ import annotations

from typing import SupportsFloat

from runners.channel import STDOUT, now
from runners.protocol import Metric


def log(*, step: int, **values: SupportsFloat) -> None:
    """Report the metric values observed at `step` (at least one).

    Values are converted with float(), so a 0-dimensional tensor or a numpy scalar can be passed
    as it is.
    """
    STDOUT.emit(Metric(step=step, values={name: float(v) for name, v in values.items()}, at=now()))

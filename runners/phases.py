"""The phases a learner goes through, each reported as started and then ended with its outcome."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from runners.channel import Channel, now
from runners.protocol import Outcome, Phase, PhaseEnded, PhaseStarted


class PhaseError(Exception):
    """Raised by a phase's action to fail the phase; its message is what the user reads."""


class Interrupted(BaseException):
    """Raised in the launcher when a terminating signal arrives during an interruptible action.

    A BaseException, like KeyboardInterrupt, so that the `except Exception` clauses of the code it
    interrupts (urllib, shutil) do not mistake it for an error of their own.
    """

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"interrupted by {signal_name}")


@dataclass(frozen=True)
class PhaseResult:
    outcome: Outcome
    error: str | None = None
    exit_code: int | None = None
    signal: str | None = None


SUCCEEDED = PhaseResult("succeeded")


def run_phase(channel: Channel, phase: Phase, action: Callable[[], PhaseResult]) -> PhaseEnded:
    """Report `phase` as started, run `action`, report how it ended, and return that report."""
    channel.emit(PhaseStarted(phase=phase, at=now()))
    started = time.monotonic()
    try:
        result = action()
    except PhaseError as error:
        result = PhaseResult("failed", error=str(error))
    except Interrupted as interruption:
        result = PhaseResult("interrupted", error=str(interruption))
    ended = PhaseEnded(
        phase=phase,
        outcome=result.outcome,
        error=result.error,
        duration_s=time.monotonic() - started,
        exit_code=result.exit_code,
        signal=result.signal,
        at=now(),
    )
    channel.emit(ended)
    return ended

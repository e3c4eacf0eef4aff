"""What the code raises when something it relies on does not hold."""

from __future__ import annotations


class InvariantBroken(RuntimeError):
    """A condition the code relies on did not hold (a job's stream holds only job events, an
    aggregate query returns its one row, ...): a bug, or data written by other means than this
    code. Unlike an `assert`, never skipped (python -O); the message says what did not hold."""

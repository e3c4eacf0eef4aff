"""SIGTERM and SIGUSR1 as requests a training loop honours at its next save point.

A handler only sets a flag: it runs between two arbitrary bytecodes of the training loop,
possibly halfway through optimizer.step() with some parameters updated and others not, or
inside a torch call that is not reentrant. The state saved there would match no step; the
loop's next save point is where model, optimizer and step agree. Standard library only: the
checkpointers of one learner (`runners.checkpoint`) and of a process group
(`runners.distributed`) both use it.
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType
from typing import Any, Self


class SignalRequests:
    """While entered (main thread only), SIGTERM sets `_stop_requested` and SIGUSR1
    `_save_requested`; the handlers before are restored on exit."""

    def __init__(self) -> None:
        self._save_requested = False
        self._stop_requested = False
        self._previous_handlers: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for signum in (signal.SIGTERM, signal.SIGUSR1):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous_handlers.items():
            # None means the previous handler was not installed from Python; the default
            # action is the closest one Python can restore.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous_handlers.clear()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self._stop_requested = True
        else:
            self._save_requested = True

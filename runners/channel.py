"""Where a learner writes its protocol lines: its standard output, one whole line at a time."""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime
from typing import TextIO

from runners.protocol import Message, encode


def now() -> datetime:
    """The current time as reports carry it (aware, UTC)."""
    return datetime.now(UTC)


class Channel:
    """Writes protocol lines to a text stream, by default whatever `sys.stdout` is at the time.

    `sys.stdout` is looked up on every write, not bound once, so the lines go through the same
    buffer as the user's own `print` output: a report then never lands inside a line the user
    has written in full, even when the buffer is flushed in arbitrary chunks.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        # Training code may report from several threads (a metrics thread, a checkpoint thread);
        # the lock keeps each line whole instead of interleaving two writes.
        self._lock = threading.Lock()

    def emit(self, message: Message) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        line = encode(message) + "\n"
        with self._lock:
            stream.write(line)
            # Flushed at once: the agent may need the line (a saved checkpoint) even if the
            # process is killed a moment later.
            stream.flush()


STDOUT = Channel()

"""A container's log stream (the engine's `logs` endpoint, with timestamps) as learner lines.

The engine multiplexes stdout and stderr into frames: an 8-byte header (the stream, then the
payload's length) and the payload. With timestamps, each payload is one log message prefixed
by its RFC 3339 time and a space. A line longer than the log driver's buffer (16 KiB) arrives
as several messages, each with its own prefix, the last one ending in the newline; so prefixes
are removed per frame, and a line is complete at its newline.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from datetime import datetime

import aiohttp

from node_agent.runtime import LearnerLine, Stream

HEADER = struct.Struct(">BxxxL")
STREAMS: dict[int, Stream] = {1: "stdout", 2: "stderr"}
LINE_LIMIT = 1 << 20
"""Longest line held back for its newline; longer output arrives in pieces (as from a process
learner's pipes), so a learner that never writes a newline cannot exhaust the agent's memory."""


def _take_lines(buffer: bytearray) -> list[str]:
    """Remove the complete lines from the start of `buffer` (and pieces of LINE_LIMIT bytes
    of a longer line); return them, decoded, without their newlines."""
    lines: list[str] = []
    while True:
        end = buffer.find(b"\n", 0, LINE_LIMIT)
        if end >= 0:
            taken, newline = end, 1
        elif len(buffer) >= LINE_LIMIT:
            taken, newline = LINE_LIMIT, 0
        else:
            return lines
        lines.append(buffer[:taken].decode("utf-8", "replace"))
        del buffer[: taken + newline]


async def log_lines(content: aiohttp.StreamReader) -> AsyncIterator[LearnerLine]:
    """The lines of a `logs` response body, in the order the engine sends them, until it ends
    (the container stopped, or the connection closed). A line's time is when its first piece
    was written."""
    pending: dict[Stream, bytearray] = {stream: bytearray() for stream in STREAMS.values()}
    started: dict[Stream, datetime] = {}
    while True:
        try:
            kind, size = HEADER.unpack(await content.readexactly(HEADER.size))
            payload = await content.readexactly(size)
        except asyncio.IncompleteReadError:
            break
        stream = STREAMS.get(kind)
        if stream is None:
            continue  # stdin (0) is never logged; nothing else is defined
        stamp, _, text = payload.partition(b" ")
        at = datetime.fromisoformat(stamp.decode())
        buffer = pending[stream]
        started.setdefault(stream, at)
        buffer += text
        for line in _take_lines(buffer):
            yield LearnerLine(stream, line, started[stream])
            started[stream] = at  # whatever remains was written in this message
        if not buffer:
            del started[stream]
    # The last line of a stream that ended without a newline.
    for stream, buffer in pending.items():
        if buffer:
            yield LearnerLine(stream, buffer.decode("utf-8", "replace"), started[stream])

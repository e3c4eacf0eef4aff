"""Frames: how the node agent and a serving replica take turns on one Unix socket.

A frame is a 4-byte big-endian unsigned length followed by that many bytes of payload. A message
is a frame whose payload is one JSON object in UTF-8; the artifact of a model travels as frames of
raw bytes between messages. Lengths, not delimiters, mark the ends, so binary payloads need no
escaping and a reader always knows how much is still to come.

This module is imported by the node agent and by the replica, so it depends on the standard
library only. The encoding and decoding are pure; the readers and writers below are thin: one
for asyncio streams (the agent) and one for a blocking file (the replica, which runs the user's
code in its main thread).
"""

from __future__ import annotations

import asyncio
import io
import json
import struct
from typing import Any, Protocol

MAX_FRAME = 64 * 1024 * 1024
"""The longest payload accepted. A larger announced length is refused before anything is read,
so a corrupt or hostile header cannot make the reader allocate gigabytes."""

_HEADER = struct.Struct(">I")
HEADER_SIZE = _HEADER.size


class FrameError(Exception):
    """A frame or message that breaks the rules: too long, cut short, or not a JSON object."""


def encode_frame(payload: bytes) -> bytes:
    """The frame that carries `payload`."""
    if len(payload) > MAX_FRAME:
        raise FrameError(f"a frame of {len(payload)} bytes is longer than {MAX_FRAME}")
    return _HEADER.pack(len(payload)) + payload


def decode_length(header: bytes) -> int:
    """The payload length a frame's header announces; FrameError if it exceeds MAX_FRAME."""
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise FrameError(f"a frame announces {length} bytes, more than the limit of {MAX_FRAME}")
    return int(length)


def encode_message(message: dict[str, Any]) -> bytes:
    """The payload of a JSON message: compact, standard JSON (no NaN or infinities).

    Non-ASCII characters are escaped rather than written as UTF-8: a string decoded from JSON may
    hold a lone surrogate, which has no UTF-8 encoding but does have an escape.
    """
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("ascii")


def decode_message(payload: bytes) -> dict[str, Any]:
    """The JSON object a payload holds; FrameError if it holds anything else."""
    try:
        message = json.loads(payload.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as error:
        raise FrameError(f"a message is not JSON: {error}") from error
    except RecursionError as error:  # arrays nested past the interpreter's stack
        raise FrameError("a message is nested too deeply to be read") from error
    if not isinstance(message, dict):
        raise FrameError(f"a message is a JSON {type(message).__name__}, not an object")
    return message


def storable_text(text: str) -> str:
    """`text` as Postgres's text columns and jsonb can hold it: a NUL written as \\x00 and an
    unpaired surrogate as \\udxxx. A peer's error text may hold either (a tenant's exception
    message is the tenant's to make), and a row that holds one is refused whole."""
    return text.replace("\0", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def message_frame(message: dict[str, Any]) -> bytes:
    """The whole frame that carries `message`."""
    return encode_frame(encode_message(message))


def _refuse_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity by default; standard JSON has neither.
    raise ValueError(f"{name} is not standard JSON")


# asyncio streams (the node agent; the control plane reading a stream from it) ----------------


class Readable(Protocol):
    """What frames are read from: an asyncio StreamReader, or aiohttp's (a response's body)."""

    async def readexactly(self, n: int) -> bytes: ...


async def read_frame(reader: Readable) -> bytes | None:
    """The next frame's payload; None at a clean end of the stream (between two frames)."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise FrameError("the stream ended within a frame's header") from error
    length = decode_length(header)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as error:
        raise _truncated(len(error.partial), length) from error


async def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    """Send one frame, waiting while the peer is slow to read (flow control)."""
    writer.write(encode_frame(payload))
    await writer.drain()


THREAD_DECODE_BYTES = 256 * 1024
"""A payload past this many bytes is decoded in a worker thread: parsing a peer's frame of up
to MAX_FRAME (a replica's answer is the tenant's to make that large) takes long enough to stall
the agent's event loop, and with it its heartbeats."""


async def read_message(reader: Readable) -> dict[str, Any] | None:
    """The next message (at most MAX_FRAME bytes); None at a clean end of the stream."""
    sized = await read_sized_message(reader)
    return None if sized is None else sized[0]


async def read_sized_message(reader: Readable) -> tuple[dict[str, Any], int] | None:
    """As `read_message`, with its payload's length: whoever handles the message next knows
    whether its work on it, too, belongs in a thread."""
    payload = await read_frame(reader)
    if payload is None:
        return None
    if len(payload) > THREAD_DECODE_BYTES:
        return await asyncio.to_thread(decode_message, payload), len(payload)
    return decode_message(payload), len(payload)


async def write_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    await write_frame(writer, encode_message(message))


# Blocking files (the replica) ----------------------------------------------------------------


def read_frame_blocking(stream: io.BufferedIOBase) -> bytes | None:
    """As `read_frame`, from a buffered file (such as `socket.makefile("rb")`), whose read(n)
    returns fewer than n bytes only at the end of the stream."""
    header = stream.read(HEADER_SIZE)
    if not header:
        return None
    if len(header) < HEADER_SIZE:
        raise FrameError("the stream ended within a frame's header")
    length = decode_length(header)
    payload = stream.read(length)
    if len(payload) < length:
        raise _truncated(len(payload), length)
    return payload


def _truncated(received: int, length: int) -> FrameError:
    return FrameError(f"the stream ended after {received} of a frame's {length} bytes")

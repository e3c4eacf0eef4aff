"""The agent's side of a serving replica's socket (see `runners.serve` for the protocol).

One request is in flight at a time (a stream, from its request to its end): concurrent callers
wait their turn. A request that does not finish (cancelled, or the connection broke) leaves the
stream out of step, so the client then closes the connection, and every later call raises
`ReplicaGone`; the caller reconnects with `connect`, and `hello` tells it whether the model is
still loaded (and whether it streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import math
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.frames import (
    FrameError,
    encode_frame,
    message_frame,
    read_message,
    read_sized_message,
    storable_text,
    write_frame,
)
from runners.serve import SOCKET_NAME

CHUNK_BYTES = 1024 * 1024
"""The size of the frames an artifact is sent in."""

STOP_S = 10.0
"""How long a replica told to stop a stream has to end it (its generator's close runs the
tenant's `finally`)."""
_RETRY_S = 0.05
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class ReplicaGone(Exception):
    """The replica's connection ended (it died, or closed)."""


class ReplicaRefused(Exception):
    """The replica's socket is not one the agent connects to: a symlink on the way, or not a
    socket of the replica's user (it planted a link to another one)."""


class ReplicaError(Exception):
    """The replica answered with an error (text is the traceback)."""

    def __init__(self, text: str) -> None:
        # The text goes on to the task's row: a tenant's exception message may hold a NUL or
        # an unpaired surrogate, either of which would make Postgres refuse the row.
        super().__init__(storable_text(text))


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How a stream ended: the outputs sent, whether it was stopped before its generator
    ended, and the entry point's own time."""

    chunks: int
    stopped: bool
    inference_ms: float


class ReplicaClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._turn = asyncio.Lock()
        self._freed: list[Callable[[], None]] = []
        """Called each time a call (or a stream) lets go of the replica."""
        self._broken = False
        self._batch_ids = itertools.count(1)
        self.streams = False
        """Whether the loaded model's entry point streams (a generator function), as the
        replica said when it loaded it or answered `hello`."""

    @property
    def busy(self) -> bool:
        """Whether a call (or a stream) holds the replica now."""
        return self._turn.locked()

    def when_freed(self, callback: Callable[[], None]) -> None:
        """Have `callback` called each time a call (or a stream) lets go of the replica: a
        feed waiting for the replica to be free looks again then."""
        self._freed.append(callback)

    @classmethod
    async def connect(cls, below: Path, serve_dir: Path, *, timeout_s: float) -> ReplicaClient:
        """Connect to the replica serving in `serve_dir`, retrying until it listens.

        `below` is the agent's folder that holds the replica's job folder (the first level of
        `serve_dir` below it), which the replica cannot write. The way down from it is walked
        without following symlinks, and the socket is connected to only if it is a socket owned
        by the job folder's owner (the replica's user, for whom the agent made it): a replica
        that planted a symlink or a link to another socket of the node in its place gets
        ReplicaRefused, never a connection. The socket is reached through a descriptor of its
        own, so its path stays short whatever the folder's (a socket's path is limited to 108
        bytes) and what was checked is what is connected to.

        TimeoutError when it has not accepted within `timeout_s`.
        """
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    return cls(*await _open(below, serve_dir))
                except (FileNotFoundError, ConnectionRefusedError):
                    # Not started yet, or not yet listening (or a stale socket of a dead one).
                    await asyncio.sleep(_RETRY_S)

    async def hello(self) -> bool:
        """Whether the replica has a model loaded."""
        answer = await self._request("ready", message_frame({"op": "hello"}))
        loaded = answer.get("loaded")
        if not isinstance(loaded, bool):
            raise _out_of_turn(f"a ready answer without 'loaded': {answer!r}")
        # A replica older than streaming says nothing of it: it streams nothing.
        self.streams = loaded and answer.get("streams") is True
        return loaded

    async def load(
        self, artifact: Path, sha256: str, entry_point: str, packages: Path | None = None
    ) -> float:
        """Send the artifact (whose sha256 the replica checks) and load it, with the folder of
        its installed requirements (`packages`) on the path; the milliseconds the replica took
        to load it."""
        with artifact.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            request: dict[str, Any] = {
                "op": "load",
                "entry_point": entry_point,
                "sha256": sha256,
                "size": size,
            }
            if packages is not None:
                request["packages"] = str(packages)

            async def chunks() -> AsyncIterator[bytes]:
                sent = 0
                while sent < size:
                    # Disk reads in a thread: an artifact of gigabytes must not stall the loop.
                    chunk = await asyncio.to_thread(file.read, min(CHUNK_BYTES, size - sent))
                    if not chunk:
                        raise ReplicaError(f"{artifact} shrank to {sent} bytes while being sent")
                    yield chunk
                    sent += len(chunk)

            self.streams = False
            answer = await self._request("loaded", message_frame(request), chunks())
        self.streams = answer.get("streams") is True
        return _milliseconds(answer, "load_ms")

    async def predict_generated(
        self, generate: dict[str, Any], first: int, count: int
    ) -> tuple[list[Any], float]:
        """`predict` for generated items `first` to `first + count - 1` (made by the replica
        from `generate`'s shape and seed: runners/inputs.py)."""
        batch_id = next(self._batch_ids)
        spec = {**generate, "first": first, "count": count}
        request = message_frame({"op": "batch", "id": batch_id, "generate": spec})
        answer = await self._request("result", request, batch_id=batch_id)
        return _outputs(answer, count), _milliseconds(answer, "inference_ms")

    async def predict(self, items: list[Any]) -> tuple[list[Any], float]:
        """The model's outputs for `items`, and the milliseconds the replica's call took.

        ReplicaError with the traceback when the user's code failed (or broke the rules),
        ReplicaGone when the replica died before answering.
        """
        batch_id = next(self._batch_ids)
        # Encoded before anything is sent: items that are not JSON, or too many of them for one
        # frame, are the caller's error (ValueError, TypeError or FrameError), and the
        # connection stays usable.
        request = message_frame({"op": "batch", "id": batch_id, "items": items})
        answer = await self._request("result", request, batch_id=batch_id)
        return _outputs(answer, len(items)), _milliseconds(answer, "inference_ms")

    async def predict_text(self, items: str, count: int) -> tuple[list[Any], float]:
        """`predict` for `count` items whose JSON list is `items`, sent as it is: encoding
        items again costs a tenth of a millisecond per 5 KiB (ValueError for text that is not
        valid Unicode; FrameError for too much)."""
        batch_id = next(self._batch_ids)
        request = encode_frame(f'{{"op":"batch","id":{batch_id},"items":{items}}}'.encode())
        answer = await self._request("result", request, batch_id=batch_id)
        return _outputs(answer, count), _milliseconds(answer, "inference_ms")

    async def stream(self, item: Any, deliver: Callable[[Any, int], Awaitable[bool]]) -> StreamEnd:
        """Run a streaming entry point on `item`: each output it yields is handed to `deliver`
        (with the length of the frame that carried it) before the next is made; `deliver`
        answers whether to go on (False: the entry point's generator is closed at once, and the
        stream ends, stopped). Holds the replica for the whole stream.

        ReplicaError with the traceback when the user's code failed (or broke the rules) or
        the model does not stream, ReplicaGone when the replica died meanwhile, or, told to
        stop, sent another output or no end within STOP_S; `deliver`'s own exceptions end the
        connection (the stream is then out of step), as a cancellation does. ValueError,
        TypeError or FrameError for an item no frame carries.
        """
        stream_id = next(self._batch_ids)
        request = message_frame({"op": "stream", "id": stream_id, "item": item})
        async with self._taken():
            if self._broken:
                raise ReplicaGone("the connection to the replica is closed")
            try:
                self._writer.write(request)
                await self._writer.drain()
                while True:
                    answer, size = await self._stream_answer(stream_id)
                    op = answer.get("op")
                    if op != "chunk":
                        break
                    more = await deliver(answer.get("output"), size)
                    reply = {"op": "next" if more else "stop", "id": stream_id}
                    self._writer.write(message_frame(reply))
                    await self._writer.drain()
                    if not more:
                        answer, op = await self._stopped(stream_id)
                        break
            except (ConnectionError, FrameError) as error:
                self._abandon()
                raise ReplicaGone(f"the connection to the replica broke: {error}") from error
            except (ReplicaGone, ReplicaError):
                raise
            except BaseException:
                # Cancelled or failed mid-stream: what the replica sends next would be taken
                # for the next request's answer.
                self._abandon()
                raise
        if op == "error":
            raise ReplicaError(str(answer.get("error")))
        chunks, stopped = answer.get("chunks"), answer.get("stopped")
        if not isinstance(chunks, int) or isinstance(chunks, bool) or not isinstance(stopped, bool):
            raise ReplicaError(f"the replica's end of a stream is out of form: {answer!r}")
        return StreamEnd(chunks, stopped, _milliseconds(answer, "inference_ms"))

    async def _stream_answer(self, stream_id: int) -> tuple[dict[str, Any], int]:
        """The replica's next message of stream `stream_id` (a chunk, its end or its error),
        and its frame's length; ReplicaError for anything else, ReplicaGone at its end."""
        sized = await read_sized_message(self._reader)
        if sized is None:
            self._abandon()
            raise ReplicaGone("the replica closed the connection")
        answer, size = sized
        op = answer.get("op")
        if op not in ("chunk", "end", "error") or answer.get("id") != stream_id:
            self._abandon()
            raise _out_of_turn(
                f"{op!r} for stream {answer.get('id')!r} where a chunk, the end or an error of "
                f"stream {stream_id} was due"
            )
        return answer, size

    async def _stopped(self, stream_id: int) -> tuple[dict[str, Any], str]:
        """Told to stop, the replica's end (or error) and its op. A replica that goes on (one
        more output, or silence past STOP_S) ignores the protocol: kept, it would hold the
        replica and the agent's work for as long as its tenant's code likes."""
        try:
            async with asyncio.timeout(STOP_S):
                answer, _ = await self._stream_answer(stream_id)
        except TimeoutError as error:
            self._abandon()
            raise ReplicaGone(f"no end of the stream within {STOP_S:g} s of stop") from error
        op = answer.get("op")
        if op == "chunk":
            self._abandon()
            raise ReplicaGone("the replica sent an output after it was told to stop")
        return answer, str(op)

    async def close(self) -> None:
        self._abandon()
        with contextlib.suppress(ConnectionError):  # already closed by the replica's end
            await self._writer.wait_closed()

    @contextlib.asynccontextmanager
    async def _taken(self) -> AsyncIterator[None]:
        """The replica's turn, held for the block (concurrent callers wait for it)."""
        try:
            async with self._turn:
                yield
        finally:
            # Once let go (a callback that looks at `busy` sees it free).
            for callback in self._freed:
                callback()

    def _abandon(self) -> None:
        self._broken = True
        self._writer.close()

    async def _request(
        self,
        expected: str,
        request: bytes,
        more: AsyncIterator[bytes] | None = None,
        *,
        batch_id: int | None = None,
    ) -> dict[str, Any]:
        """Send a request's frame (then `more` payloads, a frame each) and read its answer, in
        turn with other callers: the answer if it is `expected` (and carries `batch_id`),
        ReplicaError with the replica's text if it is an error."""
        async with self._taken():
            if self._broken:
                raise ReplicaGone("the connection to the replica is closed")
            try:
                self._writer.write(request)
                await self._writer.drain()
                if more is not None:
                    async for payload in more:
                        await write_frame(self._writer, payload)
                answer = await read_message(self._reader)
            except (ConnectionError, FrameError) as error:
                self._abandon()
                raise ReplicaGone(f"the connection to the replica broke: {error}") from error
            except BaseException:
                # Cancelled or failed mid-request: its answer may still come, and would be
                # taken for the next request's.
                self._abandon()
                raise
            if answer is None:
                self._abandon()
                raise ReplicaGone("the replica closed the connection")
            op = answer.get("op")
            if op not in (expected, "error") or (
                batch_id is not None and answer.get("id") != batch_id
            ):
                self._abandon()
                raise _out_of_turn(
                    f"{op!r} for batch {answer.get('id')!r} where {expected!r} "
                    f"for batch {batch_id!r} was due"
                )
        if op == "error":
            raise ReplicaError(str(answer.get("error")))
        return answer


async def _open(below: Path, serve_dir: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    names = serve_dir.relative_to(below).parts
    if not names:
        raise ValueError(f"{serve_dir} is not below {below}")
    with contextlib.ExitStack() as opened:
        folders = [os.open(below, _DIRECTORY)]
        opened.callback(os.close, folders[0])
        for name in names:
            folders.append(_child(folders[-1], name, serve_dir))
            opened.callback(os.close, folders[-1])
        owner = os.fstat(folders[1]).st_uid
        # O_PATH: the socket itself, neither opened for reading nor followed if a symlink.
        sock = os.open(SOCKET_NAME, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folders[-1])
        opened.callback(os.close, sock)
        info = os.fstat(sock)
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != owner:
            raise ReplicaRefused(
                f"{serve_dir / SOCKET_NAME} is {_kind(info.st_mode)} of uid {info.st_uid}, not "
                f"a socket of the replica's user (uid {owner}): the agent does not connect to it"
            )
        # The descriptor's own link: the inode just checked, whatever the name is now.
        return await asyncio.open_unix_connection(f"/proc/self/fd/{sock}")


def _child(folder: int, name: str, serve_dir: Path) -> int:
    """The directory `name` in `folder`, refused if it is a symlink (or no directory)."""
    try:
        return os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise ReplicaRefused(
            f"{name!r} on the way to {serve_dir} is not a directory ({exc.strerror}): the "
            "agent follows no symlink a replica plants"
        ) from None


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return kind
    return "a special file"


def _out_of_turn(what: str) -> ReplicaError:
    return ReplicaError(f"the replica answered out of turn: {what}")


def _outputs(answer: dict[str, Any], items: int) -> list[Any]:
    """The answer's outputs: one per item."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != items:
        count = len(outputs) if isinstance(outputs, list) else "no list of"
        raise ReplicaError(f"the replica answered {count} outputs for {items} items")
    return outputs


def _milliseconds(answer: dict[str, Any], field: str) -> float:
    # The replica runs the tenant's code, which may answer anything: a time it reports is
    # recorded (jsonb and the figures hold no infinity or NaN), so it must be a real one.
    value = answer.get(field)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ReplicaError(f"the replica's answer has no number {field!r}: {answer!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise ReplicaError(f"the replica's answer has no time {field!r}: {str(value)[:40]}")
    return number

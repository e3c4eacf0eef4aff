"""`python -m runners.serve`: a serving replica, the process that runs a deployment's model.

It runs inside a learner (no network), in the folder `TRAINYARD_SERVE_DIR` names, and listens on
the Unix socket `serve.sock` there. The node agent connects, hands over the model's artifact and
then sends batches; each message is a frame (see `runners.frames`):

    agent: {"op":"hello"}
    replica: {"op":"ready","loaded":bool,"entry_point":str or null,"streams":bool}

    agent: {"op":"load","entry_point":"m:f","sha256":hex,"size":N[,"packages":path]}, then raw
    frames, N bytes in all ("packages": a folder of the model's requirements, installed by the
    agent, put on the path after the artifact's code)
    replica: {"op":"loaded","load_ms":float,"streams":bool}

("streams": the entry point is a generator function, `runners.servable`.)

    agent: {"op":"batch","id":int,"items":[...]}
    replica: {"op":"result","id":int,"outputs":[...],"inference_ms":float}

    agent: {"op":"batch","id":int,"generate":{"shape":[...],"seed":int,"first":int,"count":int}}
    replica: the same result, for the generated items `first` to `first + count - 1` (an
    inference job's query: each item a numpy array from the seed and its number, made here,
    so that an image crosses neither the database nor the socket; runners/inputs.py)

    agent: {"op":"stream","id":int,"item":...}   (a streaming entry point, one item)
    replica: {"op":"chunk","id":int,"output":...}, then it waits for
    agent: {"op":"next","id":int} (the next output is made) or {"op":"stop","id":int} (the
    entry point's generator is closed: its `finally` runs), and so on, until
    replica: {"op":"end","id":int,"chunks":int,"stopped":bool,"inference_ms":float}

The agent takes each output before the next is made: a stream goes at the pace its reader
reads, and one the reader left is stopped at the entry point's next `yield` (its code between
two yields is never interrupted). "inference_ms" is the time spent in the entry point, not
the waits for the agent. An error during a stream (the user's exception, an output that is
not JSON, a frame too large) is answered `error` in place of the next chunk or the end.

Any request may instead be answered `{"op":"error","error":text}` (with the batch's `id` for a
batch): the traceback of the user's exception, or what was wrong. A failed load leaves no model
loaded; a failed batch changes nothing.

One connection is served at a time, one request (a stream: all of it) at a time, in the main
thread (user code may rely on being there). When a connection ends, the next is accepted and the
model stays loaded: an agent that restarts reconnects and asks `hello` instead of loading again.
SIGTERM (or SIGINT) ends the replica promptly with status 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from runners.config import SERVE_DIR
from runners.frames import FrameError, decode_message, message_frame, read_frame_blocking
from runners.servable import Servable, ServableError

SOCKET_NAME = "serve.sock"
MODEL_DIR = "model"
ARTIFACT_NAME = "artifact"
EXIT_USAGE = 2
LOADED_NICE = 10
"""The niceness of a replica once its model is loaded (`_yield_cpu`)."""

_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


class _Stopped(BaseException):
    """Raised by the SIGTERM handler. A BaseException of its own, so that neither the handlers
    for user code's exceptions nor a user's own `sys.exit` can be mistaken for it."""


class _ProtocolViolation(Exception):
    """A request after which the stream cannot be trusted to be in step (a load whose size is
    unknown, or whose frames overrun it): answered, then the connection is dropped."""


def _error(text: str, **fields: Any) -> dict[str, Any]:
    return {"op": "error", "error": text, **fields}


class Replica:
    """The model (once loaded) and the answers to the agent's requests."""

    def __init__(self, directory: Path) -> None:
        self._model_dir = directory / MODEL_DIR
        self._servable: Servable | None = None

    def serve(self, listener: socket.socket) -> NoReturn:
        while True:
            connection, _ = listener.accept()
            with connection:
                try:
                    self._converse(connection)
                except (OSError, FrameError) as error:
                    # The agent died or restarted mid-request; it will reconnect.
                    print(f"replica: connection ended: {error}", flush=True)

    def _converse(self, connection: socket.socket) -> None:
        with connection.makefile("rb") as stream:
            while (payload := read_frame_blocking(stream)) is not None:
                try:
                    answer = self._answer(decode_message(payload), stream, connection)
                except FrameError as error:
                    # The frame was whole, so the stream is still in step.
                    answer = _error(str(error))
                except _ProtocolViolation as error:
                    connection.sendall(message_frame(_error(str(error))))
                    return
                connection.sendall(message_frame(answer))

    def _answer(
        self, message: dict[str, Any], stream: io.BufferedIOBase, connection: socket.socket
    ) -> dict[str, Any]:
        op = message.get("op")
        if op == "hello":
            point = self._servable.entry_point if self._servable else None
            return {
                "op": "ready",
                "loaded": self._servable is not None,
                "entry_point": None if point is None else str(point),
                "streams": self._servable is not None and self._servable.streams,
            }
        if op == "load":
            return self._load(message, stream)
        if op == "batch":
            return self._batch(message)
        if op == "stream":
            return self._stream(message, stream, connection)
        return _error(f"unknown op {op!r}")

    def _load(self, message: dict[str, Any], stream: io.BufferedIOBase) -> dict[str, Any]:
        entry_point, sha256, size = (message.get(key) for key in ("entry_point", "sha256", "size"))
        packages = message.get("packages")
        if not (
            (packages is None or isinstance(packages, str))
            and isinstance(entry_point, str)
            and isinstance(sha256, str)
            and _SHA256_HEX.fullmatch(sha256)
            and isinstance(size, int)
            and not isinstance(size, bool)
            and size >= 0
        ):
            raise _ProtocolViolation(
                "a load needs entry_point (text), sha256 (64 hexadecimal digits) and size "
                "(a number of bytes)"
            )
        self._servable = None
        artifact = self._model_dir / ARTIFACT_NAME
        received = self._receive(stream, artifact, size)
        if received != sha256.lower():
            return _error(f"the artifact's sha256 is {received}, not {sha256.lower()}")
        started = time.perf_counter()
        try:
            site = None if packages is None else Path(packages)
            servable = Servable.load(self._model_dir, artifact, entry_point, site)
        except ServableError as error:
            return self._load_failed(entry_point, str(error))
        except Exception:
            return self._load_failed(entry_point, traceback.format_exc())
        load_ms = (time.perf_counter() - started) * 1000
        self._servable = servable
        print(f"replica: loaded {servable.entry_point} in {load_ms:.0f} ms", flush=True)
        _yield_cpu()
        return {"op": "loaded", "load_ms": load_ms, "streams": servable.streams}

    def _load_failed(self, entry_point: str, text: str) -> dict[str, Any]:
        print(f"replica: cannot load {entry_point}: {text}", flush=True)
        return _error(text)

    def _receive(self, stream: io.BufferedIOBase, artifact: Path, size: int) -> str:
        """Write the artifact's frames to `artifact`; return its sha256."""
        self._model_dir.mkdir(mode=0o700, exist_ok=True)
        digest = hashlib.sha256()
        received = 0
        with artifact.open("wb") as file:
            while received < size:
                chunk = read_frame_blocking(stream)
                if chunk is None:
                    raise ConnectionError("the connection ended during a load")
                received += len(chunk)
                if received > size:
                    raise _ProtocolViolation(f"the artifact's frames exceed its size of {size}")
                digest.update(chunk)
                file.write(chunk)
        return digest.hexdigest()

    def _batch(self, message: dict[str, Any]) -> dict[str, Any]:
        batch_id, items = message.get("id"), message.get("items")
        if not isinstance(batch_id, int) or isinstance(batch_id, bool):
            return _error("a batch needs an integer id")
        if "generate" in message:
            try:
                items = _generated(message["generate"])
            # ImportError: an image without numpy (the learner image has it).
            except (TypeError, ValueError, ImportError) as error:
                return _error(f"cannot generate the batch's items: {error}", id=batch_id)
        if not isinstance(items, list):
            return _error("a batch's items must be a list", id=batch_id)
        if self._servable is None:
            return _error("no model loaded", id=batch_id)
        try:
            outputs, inference_ms = self._servable.predict(items)
        except ServableError as error:
            return _error(str(error), id=batch_id)
        except Exception:
            return _error(traceback.format_exc(), id=batch_id)
        return {"op": "result", "id": batch_id, "outputs": outputs, "inference_ms": inference_ms}

    def _stream(
        self, message: dict[str, Any], stream: io.BufferedIOBase, connection: socket.socket
    ) -> dict[str, Any]:
        """Send the item's outputs as the entry point yields them, each once the agent asked
        for it (see the module's docstring); the end, or the error that ended the stream."""
        stream_id = message.get("id")
        if not isinstance(stream_id, int) or isinstance(stream_id, bool):
            return _error("a stream needs an integer id")
        if "item" not in message:
            return _error("a stream needs an item", id=stream_id)
        if self._servable is None:
            return _error("no model loaded", id=stream_id)
        chunks, stopped, spent = 0, False, 0.0
        outputs = self._servable.stream(message["item"])
        try:
            while True:
                started = time.perf_counter()
                try:
                    output = next(outputs)
                    frame = message_frame({"op": "chunk", "id": stream_id, "output": output})
                except StopIteration:
                    break
                except ServableError as error:
                    return _error(str(error), id=stream_id)
                except FrameError as error:
                    return _error(f"output {chunks} cannot be sent: {error}", id=stream_id)
                except Exception:
                    return _error(traceback.format_exc(), id=stream_id)
                finally:
                    spent += time.perf_counter() - started
                connection.sendall(frame)
                chunks += 1
                if self._stopped(stream, stream_id):
                    stopped = True
                    break
            started = time.perf_counter()
            try:
                outputs.close()  # the entry point's `finally` runs now, not when collected
            except Exception:
                return _error(traceback.format_exc(), id=stream_id)
            spent += time.perf_counter() - started
        finally:
            # Also when the agent went away (OSError) or the replica is stopped: at once.
            with contextlib.suppress(Exception):
                outputs.close()
        return {
            "op": "end",
            "id": stream_id,
            "chunks": chunks,
            "stopped": stopped,
            "inference_ms": spent * 1000,
        }

    @staticmethod
    def _stopped(stream: io.BufferedIOBase, stream_id: int) -> bool:
        """The agent's word after a chunk: False for `next`, True for `stop`."""
        payload = read_frame_blocking(stream)
        if payload is None:
            raise ConnectionError("the connection ended during a stream")
        try:
            reply = decode_message(payload)
        except FrameError as error:
            raise _ProtocolViolation(f"within stream {stream_id}: {error}") from error
        op = reply.get("op")
        if op not in ("next", "stop") or reply.get("id") != stream_id:
            raise _ProtocolViolation(f"{op!r} where next or stop for stream {stream_id} was due")
        return bool(op == "stop")


def _yield_cpu() -> None:
    """Once its model is loaded, a replica runs at a lower CPU priority (niceness LOADED_NICE
    at least), all its threads: a busy node's CPUs go first to the replicas still loading their
    model (a new job starts sooner, a replica that died is replaced sooner) and to the node's
    own services (its agent answering, Postgres, a control plane), then to model compute. Any
    process may lower its own priority; none may raise it back, so it is done once. Threads
    are weighed within their cgroup only: a root agent also lowers the replica's group's
    weight (`node_agent.runtime.CpuShare`)."""
    # Linux keeps a niceness per thread, and a thread starts with its creator's: the model's
    # threads (a thread pool its library started while loading) are each set.
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            thread = int(task.name)
            if os.getpriority(os.PRIO_PROCESS, thread) < LOADED_NICE:
                os.setpriority(os.PRIO_PROCESS, thread, LOADED_NICE)


def _generated(spec: Any) -> list[Any]:
    if not isinstance(spec, dict):
        raise TypeError("generate must be an object")
    # numpy only where a job generates its items: a replica serving JSON items needs none.
    from runners.inputs import generated_batch

    shape, seed, first, count = (spec.get(key) for key in ("shape", "seed", "first", "count"))
    if not (
        isinstance(shape, list)
        and isinstance(seed, int)
        and isinstance(first, int)
        and isinstance(count, int)
    ):
        raise TypeError("generate needs a shape (a list) and whole numbers seed, first and count")
    return list(generated_batch(shape, seed, first, count))


def _stop(_signum: int, _frame: FrameType | None) -> None:
    # Raising, not setting a flag: a blocking accept or read is interrupted at once (Python
    # retries an interrupted system call only when the handler returns).
    raise _Stopped


def main() -> int:
    directory = os.environ.get(SERVE_DIR, "").strip()
    if not directory:
        print(f"{SERVE_DIR} must name the replica's folder", file=sys.stderr)
        return EXIT_USAGE
    # Bound by a relative name: a socket's path is limited to 108 bytes, the folder's is not.
    os.chdir(directory)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    with contextlib.suppress(FileNotFoundError):  # a socket left by a replica that was killed
        os.unlink(SOCKET_NAME)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(SOCKET_NAME)
            listener.listen()
            print(f"replica: listening on {Path.cwd() / SOCKET_NAME}", flush=True)
            Replica(Path.cwd()).serve(listener)
    except _Stopped:
        return 0
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET_NAME)


if __name__ == "__main__":
    sys.exit(main())

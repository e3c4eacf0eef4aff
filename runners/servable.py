"""A servable: a model's artifact unpacked and imported, and its entry point called on batches.

An entry point that is a generator function (`def` with `yield` in its own body, or a class's
method so written) *streams*: it is called with ONE item, not a batch, and yields that item's
outputs one by one, each a JSON value (an array or tensor as its `tolist()`), as it makes them.
A streaming request sends its outputs on as they come (`Servable.stream`); a plain request, a
batch of items, gets for each item the list of all it yielded (`Servable.predict`), so a
streaming model serves every kind of request: synchronous, asynchronous, pipelines, inference
jobs. Whether it streams is known when it is loaded (`Servable.streams`); an `async def`
entry point is refused then, since the replica calls its model in one thread, without a loop.

The artifact is the tenant's: a ZIP archive of Python code and weights, or the source of a
single module. It is hostile until proven otherwise, so a ZIP is unpacked by hand, member by
member, with every name and size checked (no `extractall`). Once imported, though, the code runs
with the replica's own rights; the walls around it are the learner's (its own user, no network).

No sockets here: `runners.serve` speaks the protocol, this module only loads and calls.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import stat
import sys
import time
import zipfile
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

ZIP_MAGIC = b"PK\x03\x04"
MAX_MEMBERS = 10_000
MAX_UNPACKED_BYTES = 8 * 1024**3
_COPY_CHUNK = 1024 * 1024

_JSON_TYPES = (dict, list, str, int, float, bool, type(None))


class ServableError(Exception):
    """An artifact, entry point or output that breaks the rules; the message says which rule."""


@dataclass(frozen=True)
class EntryPoint:
    """`module:function` (method None), or `module:Class.method`."""

    module: str
    name: str
    method: str | None

    def __str__(self) -> str:
        attribute = self.name if self.method is None else f"{self.name}.{self.method}"
        return f"{self.module}:{attribute}"


def parse_entry_point(text: str) -> EntryPoint:
    module, colon, attribute = text.partition(":")
    names = attribute.split(".")
    if (
        not colon
        or not all(part.isidentifier() for part in module.split("."))
        or len(names) > 2
        or not all(name.isidentifier() for name in names)
    ):
        raise ServableError(
            f"entry point {text!r} is not 'module:function' or 'module:Class.method'"
        )
    return EntryPoint(module, names[0], names[1] if len(names) == 2 else None)


class Servable:
    """A loaded model: its entry point, ready to be called on batches (or, streaming, on
    items)."""

    def __init__(self, entry_point: EntryPoint, function: Callable[..., Any]) -> None:
        self.entry_point = entry_point
        self._function = function
        self.streams = inspect.isgeneratorfunction(function)
        """Whether the entry point is a generator function: called per item, it yields."""

    @classmethod
    def load(
        cls, directory: Path, artifact: Path, entry_point: str, packages: Path | None = None
    ) -> Servable:
        """Unpack `artifact` into a fresh `code/` folder under `directory`, import the entry
        point's module from there (with the folder `packages`, where the model's requirements
        are installed, next on the path), and resolve the entry point.

        The artifact's checksum is the caller's to check. ServableError for a bad artifact or
        entry point; whatever the user's module raises on import (or its class on
        instantiation) propagates.
        """
        point = parse_entry_point(entry_point)
        code = directory.absolute() / "code"
        _forget_code(code)
        with artifact.open("rb") as file:
            is_zip = file.read(len(ZIP_MAGIC)) == ZIP_MAGIC
        if is_zip:
            unpack_zip(artifact, code)
        else:
            _save_module_source(artifact, code, point.module)
        if packages is not None and str(packages) not in sys.path:
            sys.path.insert(0, str(packages))
        sys.path.insert(0, str(code))
        # The import system caches directory listings; `code` may hold new files under an old
        # modification time.
        importlib.invalidate_caches()
        module = importlib.import_module(point.module)
        if _shadowed(module, code):
            raise ServableError(
                f"module {point.module!r} is not the artifact's: the replica had already "
                f"imported one of that name (the standard library's, or its own); rename it"
            )
        return cls(point, _resolve(module, point))

    def predict(self, items: list[Any]) -> tuple[list[Any], float]:
        """The entry point's outputs for `items`, as JSON-ready values, and the milliseconds
        the call took (a streaming entry point: called on each item in turn, each item's
        output the list of all it yielded). ServableError when the outputs break the rules;
        whatever the user's code raises propagates."""
        started = time.perf_counter()
        if self.streams:
            outputs: Any = [list(self._chunks(item)) for item in items]
        else:
            outputs = _plain(self._function(items))
            if isinstance(outputs, list):
                outputs = [_plain(output) for output in outputs]
        # Timed up to here: converting a tensor is where a GPU's queued work is waited for.
        inference_ms = (time.perf_counter() - started) * 1000
        _check_outputs(outputs, len(items))
        return outputs, inference_ms

    def stream(self, item: Any) -> Generator[Any, None, None]:
        """A streaming entry point's outputs for one `item`, each checked (JSON, arrays as
        lists) as it is yielded; closed, it closes the entry point's generator (its `finally`
        runs). ServableError for an entry point that does not stream, or an output that is not
        JSON; whatever the user's code raises propagates."""
        if not self.streams:
            raise ServableError(
                f"entry point {self.entry_point} does not stream: it is not a generator "
                "function (one with `yield` in its body)"
            )
        for index, output in enumerate(self._chunks(item)):
            _check_json(index, output)
            yield output

    def _chunks(self, item: Any) -> Generator[Any, None, None]:
        chunks = self._function(item)
        try:
            for output in chunks:
                yield _plain(output)
        finally:
            chunks.close()


def _check_outputs(outputs: Any, expected: int) -> None:
    """ServableError unless `outputs` is a list of `expected` JSON values."""
    if not isinstance(outputs, list):
        kind = type(outputs).__name__
        if inspect.isgenerator(outputs) or inspect.isasyncgen(outputs):
            raise ServableError(
                f"predict returned a {kind}, not a list: a streaming entry point yields in its "
                "own body (a generator function), and is called with one item"
            )
        raise ServableError(f"predict returned a {kind}, not a list")
    if len(outputs) != expected:
        raise ServableError(f"predict returned {len(outputs)} outputs for {expected} items")
    try:
        json.dumps(outputs, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        # The whole list at once is the quick check; only a failure is worth a closer look.
        for index, output in enumerate(outputs):
            _check_json(index, output)
        raise ServableError(f"the outputs are not JSON: {error}") from error


def _check_json(index: int, output: Any) -> None:
    if not isinstance(output, _JSON_TYPES):
        raise ServableError(f"output {index} is a {type(output).__name__}, not JSON")
    try:
        json.dumps(output, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise ServableError(f"output {index} is not JSON: {error}") from error


def _plain(value: Any) -> Any:
    """Arrays and tensors (anything with `tolist()`) as nested lists; anything else as it is."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


def _resolve(module: ModuleType, point: EntryPoint) -> Callable[..., Any]:
    target = getattr(module, point.name, None)
    if target is None:
        raise ServableError(f"module {point.module!r} has no {point.name!r}")
    if point.method is not None:
        if not isinstance(target, type):
            raise ServableError(f"{point.module}:{point.name} is not a class")
        target = getattr(target(), point.method, None)
        if target is None:
            raise ServableError(f"class {point.name!r} has no method {point.method!r}")
    if not callable(target):
        raise ServableError(f"entry point {point} is not callable")
    if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
        raise ServableError(
            f"entry point {point} is an async function: the replica calls its model without "
            "an event loop; write it with `def` (a generator function, with `yield`, to stream)"
        )
    function: Callable[..., Any] = target
    return function


def _forget_code(code: Path) -> None:
    """Remove what an earlier load left: its folder, its sys.path entry, and its modules (which
    would otherwise be found in sys.modules instead of being imported afresh)."""
    for name, module in list(sys.modules.items()):
        if _comes_from(module, code):
            del sys.modules[name]
    while str(code) in sys.path:
        sys.path.remove(str(code))
    if code.is_symlink():
        code.unlink()
    elif code.exists():
        shutil.rmtree(code)


def _comes_from(module: ModuleType, code: Path) -> bool:
    """Whether `module` (or package) was imported from the folder `code`."""
    prefix = str(code) + os.sep
    # A package's __path__ is a list of folders, but some libraries' modules put another
    # object there (torch.classes answers any attribute): only a list or tuple is read.
    path = getattr(module, "__path__", None)
    locations = [
        getattr(module, "__file__", None),
        *(path if isinstance(path, list | tuple) else ()),
    ]
    return any(isinstance(where, str) and where.startswith(prefix) for where in locations)


def _shadowed(module: ModuleType, code: Path) -> bool:
    """Whether the artifact has a module of that name but the import found another: one that
    was in sys.modules already, such as the standard library's `json`."""
    top = module.__name__.partition(".")[0]
    ours = (code / f"{top}.py").exists() or (code / top).is_dir()
    return ours and not _comes_from(module, code)


def _save_module_source(artifact: Path, code: Path, module: str) -> None:
    if "." in module:
        raise ServableError(
            f"the artifact is a single module's source, so the entry point's module must be a "
            f"plain name, not {module!r} (a package needs a ZIP archive)"
        )
    source = artifact.read_bytes()
    try:
        source.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ServableError(
            f"the artifact is neither a ZIP archive nor UTF-8 Python source: {error}"
        ) from error
    code.mkdir(parents=True)
    (code / f"{module}.py").write_bytes(source)


def unpack_zip(
    archive: Path,
    destination: Path,
    *,
    max_members: int = MAX_MEMBERS,
    max_bytes: int = MAX_UNPACKED_BYTES,
) -> None:
    """Unpack `archive` into `destination`, a folder this creates (it must not exist).

    Refused (ServableError), before anything is written: more than `max_members` members, more
    than `max_bytes` declared in all, a name that is absolute or climbs out (`..`), a symlink or
    any other special file. While writing, the bytes actually produced are counted too, since a
    header's sizes are only the archive's word. A refused or failed archive may leave a partial
    `destination`, which the next load removes.
    """
    destination.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as bundle:
            members = bundle.infolist()
            _check_members(members, max_members, max_bytes)
            written = 0
            for member in members:
                target = destination.joinpath(*_parts(member.filename))
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                # Exclusive: a name that occurs twice in the archive is refused, not overwritten.
                with bundle.open(member) as source, open(target, "xb") as sink:
                    while chunk := source.read(_COPY_CHUNK):
                        written += len(chunk)
                        if written > max_bytes:
                            raise ServableError(
                                f"the archive unpacks to more than {max_bytes} bytes"
                            )
                        sink.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as error:
        # RuntimeError: an encrypted member; NotImplementedError: an unknown compression.
        raise ServableError(f"the artifact is not a usable ZIP archive: {error}") from error
    except OSError as error:
        raise ServableError(f"cannot unpack the artifact: {error}") from error


def _check_members(members: list[zipfile.ZipInfo], max_members: int, max_bytes: int) -> None:
    if len(members) > max_members:
        raise ServableError(f"the archive has {len(members)} members, more than {max_members}")
    declared = sum(member.file_size for member in members)
    if declared > max_bytes:
        raise ServableError(f"the archive declares {declared} bytes, more than {max_bytes}")
    for member in members:
        _parts(member.filename)
        kind = stat.S_IFMT(member.external_attr >> 16)
        # 0: the archiver recorded no Unix mode (a DOS or Windows archive); a plain file then.
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            what = "a symlink" if kind == stat.S_IFLNK else "a special file"
            raise ServableError(f"archive member {member.filename!r} is {what}")


def _parts(name: str) -> list[str]:
    """The folders and file name a member's name stands for; ServableError for a name that could
    land anywhere but below the destination."""
    if "\\" in name or "\x00" in name:
        # Not separators on Linux, but they are elsewhere; such a name is trouble, not code.
        raise ServableError(f"archive member {name!r} has a backslash or NUL in its name")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise ServableError(f"archive member {name!r} has an absolute name")
    if ".." in path.parts:
        raise ServableError(f"archive member {name!r} climbs out of its folder ('..')")
    parts = [part for part in path.parts if part != "."]
    if not parts:
        raise ServableError(f"archive member {name!r} has an empty name")
    return parts

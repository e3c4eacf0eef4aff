"""Reading a job manifest file for `trainyard submit` (or a search spec for `trainyard search
submit`): JSON (`.json`) or YAML (anything else,
standard input too; YAML reads JSON as well), checked against the manifest's schema before it
is sent, so that every mistake is one line naming the file, and the line, column or field."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from controlplane.jobs.manifest import JobSubmission
from controlplane.searches.spec import SearchSpec
from trainyard.api import UsageError


def read_manifest(file: str) -> dict[str, Any]:
    """The manifest as JSON to send (only the fields the file gives); UsageError otherwise."""
    return _validated(file, JobSubmission, "manifest")


def read_search(file: str) -> dict[str, Any]:
    """A search spec (`trainyard search submit`) as JSON to send, as `read_manifest` reads a
    manifest."""
    return _validated(file, SearchSpec, "search")


def _validated(file: str, model: type[BaseModel], what: str) -> dict[str, Any]:
    name, text, value = read_mapping(file, f"a {what}")
    try:
        document = model.model_validate(value)
    except ValidationError as exc:
        yaml_text = None if file.endswith(".json") else text
        problems = [
            located(".".join(map(str, e["loc"])) or f"({what})", e["loc"], e["msg"], yaml_text)
            for e in exc.errors()
        ]
        raise UsageError(f"{name}: invalid {what}: {'; '.join(problems)}") from exc
    return document.model_dump(mode="json", exclude_unset=True)


def read_mapping(file: str, what: str) -> tuple[str, str, dict[str, Any]]:
    """The file's name as messages show it, its text, and the mapping it holds (`what` names
    the document in the error when it holds something else); UsageError when it cannot be
    read or parsed, naming the line and column."""
    name = "standard input" if file == "-" else file
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {name}: {exc}") from exc
    value = _json(text, name) if file.endswith(".json") else _yaml(text, name)
    if not isinstance(value, dict):
        raise UsageError(f"{name}: {what} is a mapping of fields, not {_kind(value)}")
    return name, text, value


def located(field: str, loc: Sequence[Any], message: str, yaml_text: str | None) -> str:
    """`field: message`, with the field's line in a YAML file (a missing field's: its parent's)."""
    line = _yaml_line(yaml_text, tuple(loc)) if yaml_text is not None else None
    where = f" (line {line})" if line is not None else ""
    return f"{field}{where}: {message}"


def _json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name}: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc


def _yaml(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise UsageError(f"{name}: {where}{exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{name}: {exc}") from exc


def _kind(value: object) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"


def _yaml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """The line of the node at `loc` in a YAML document, or of the deepest node found on it."""
    node: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
    line = None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        node = _child(node, part)
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _child(node: yaml.Node, part: Any) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value  # type: ignore[no-any-return]
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]  # type: ignore[no-any-return]
    return None

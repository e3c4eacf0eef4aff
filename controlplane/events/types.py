"""Event types: frozen pydantic models named with a stable type name and a schema version.

A stored event is (type name, schema version, JSON data). Renaming a class never changes its
stored name, and a change to an event's fields raises its schema version and gives the class
an upcaster that turns the old data into the new shape, so old events stay readable forever.

Naming a class registers it nowhere: each feature lists its event types in a tuple, and a
registry is built from those tuples in one place (`controlplane.composition`), so what a
process can read never depends on which modules it happened to import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from controlplane.events.errors import MalformedEvent, UnknownEventType

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns an event's data of one schema version into that of the next."""


class Event(BaseModel):
    """Base of every event; subclasses are named with `@event_type(name, version)`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type_name: ClassVar[str] = ""
    schema_version: ClassVar[int] = 0
    upcasters: ClassVar[Mapping[int, Upcaster]] = {}
    """By schema version: the function that turns data of that version into the next's."""


E = TypeVar("E", bound=type[Event])


def event_type(
    name: str, version: int = 1, *, upcasters: Mapping[int, Upcaster] | None = None
) -> Callable[[E], E]:
    """Name an event class `name` at schema `version`, with an upcaster from each older one."""
    if version < 1:
        raise ValueError(f"event type {name!r}: schema version must be >= 1")
    steps = dict(upcasters or {})
    if not set(steps) <= set(range(1, version)):
        raise ValueError(f"event type {name!r}: upcasters only from versions 1 to {version - 1}")

    def name_it(cls: E) -> E:
        cls.type_name = name
        cls.schema_version = version
        cls.upcasters = steps
        return cls

    return name_it


class EventRegistry:
    """Maps stable type names to the event classes it was given."""

    def __init__(self, types: Iterable[type[Event]]) -> None:
        self._types: dict[str, type[Event]] = {}
        for cls in types:
            name = cls.type_name
            if not name or "type_name" not in vars(cls):
                raise ValueError(f"{cls.__name__} is not named: decorate it with @event_type")
            if self._types.setdefault(name, cls) is not cls:
                raise ValueError(f"event type {name!r} is given twice")

    def is_registered(self, event: Event) -> bool:
        return self._types.get(type(event).type_name) is type(event)

    def decode(self, name: str, version: int, data: str | Mapping[str, Any]) -> Event:
        """The event of a stored type, version and data (a JSON object or its text)."""
        cls = self._types.get(name)
        if cls is None:
            raise UnknownEventType(f"unknown event type {name!r}")
        if version > cls.schema_version:
            raise MalformedEvent(
                f"{name} has schema version {version}, newer than this code's {cls.schema_version}"
            )
        try:
            if version == cls.schema_version and isinstance(data, str):
                return cls.model_validate_json(data)
            current = json.loads(data) if isinstance(data, str) else dict(data)
            for old in range(version, cls.schema_version):
                step = cls.upcasters.get(old)
                if step is None:
                    raise MalformedEvent(f"{name}: no upcaster from schema version {old}")
                current = step(current)
            return cls.model_validate(current)
        except ValidationError as exc:
            raise MalformedEvent(f"{name} v{version}: {_summary(exc)}") from exc


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(data)'}: {err['msg']}" for err in exc.errors()
    )

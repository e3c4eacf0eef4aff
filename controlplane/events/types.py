"""Event types: frozen pydantic models registered under stable names with a schema version.

A stored event is (type name, schema version, JSON data). Renaming a class never changes its
stored name, and a change to an event's fields raises its schema version and registers an
upcaster that turns the old data into the new shape, so old events stay readable forever.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from controlplane.events.errors import MalformedEvent, UnknownEventType


class Event(BaseModel):
    """Base of every event; subclasses are registered with `@registry.register(name, version)`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type_name: ClassVar[str] = ""
    schema_version: ClassVar[int] = 0


E = TypeVar("E", bound=type[Event])
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class EventRegistry:
    """Maps stable type names to event classes and old schema versions to upcasters."""

    def __init__(self) -> None:
        self._types: dict[str, type[Event]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}

    def register(self, name: str, version: int = 1) -> Callable[[E], E]:
        def decorate(cls: E) -> E:
            if name in self._types and self._types[name] is not cls:
                raise ValueError(f"event type {name!r} is already registered")
            if version < 1:
                raise ValueError(f"event type {name!r}: schema version must be >= 1")
            cls.type_name = name
            cls.schema_version = version
            self._types[name] = cls
            return cls

        return decorate

    def upcaster(self, name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register a function that turns `name` data of `from_version` into `from_version + 1`."""

        def decorate(fn: Upcaster) -> Upcaster:
            self._upcasters[(name, from_version)] = fn
            return fn

        return decorate

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
                step = self._upcasters.get((name, old))
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


registry = EventRegistry()
"""The registry of every event type Trainyard writes."""

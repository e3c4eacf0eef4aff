"""Event types used only by the tests."""

from __future__ import annotations

from typing import Any

from controlplane.events.types import Event, registry


@registry.register("test.Pinged")
class Pinged(Event):
    n: int
    note: str = ""


@registry.register("test.Renamed", version=2)
class Renamed(Event):
    """Version 1 had `name`; version 2 split it into `first` and `last`."""

    first: str
    last: str


@registry.upcaster("test.Renamed", from_version=1)
def _split_name(data: dict[str, Any]) -> dict[str, Any]:
    first, _, last = data.pop("name").partition(" ")
    return {**data, "first": first, "last": last}


class Unregistered(Event):
    n: int

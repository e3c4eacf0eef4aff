"""Event types are registered explicitly: a registry reads the types it is given, and only
named ones, each name once."""

from __future__ import annotations

import pytest

from controlplane.event_registry import EVENT_REGISTRY
from controlplane.events.errors import UnknownEventType
from controlplane.events.types import Event, EventRegistry, event_type
from controlplane.jobs.events import JobSubmitted
from tests.events import Pinged, Renamed, Unregistered


def test_a_registry_reads_only_the_types_it_was_given() -> None:
    pings = EventRegistry((Pinged,))
    assert pings.decode("test.Pinged", 1, '{"n": 1}') == Pinged(n=1)
    assert pings.is_registered(Pinged(n=1))
    assert not pings.is_registered(Renamed(first="a", last="b"))
    with pytest.raises(UnknownEventType, match=r"unknown event type 'test\.Renamed'"):
        pings.decode("test.Renamed", 2, '{"first": "a", "last": "b"}')


def test_a_registry_refuses_unnamed_classes_and_a_name_given_twice() -> None:
    with pytest.raises(ValueError, match="Unregistered is not named"):
        EventRegistry((Pinged, Unregistered))

    @event_type("test.Pinged")
    class Impostor(Event):
        n: int

    with pytest.raises(ValueError, match=r"'test\.Pinged' is given twice"):
        EventRegistry((Pinged, Impostor))


def test_trainyards_registry_reads_every_feature_and_not_the_tests_types() -> None:
    assert EVENT_REGISTRY.is_registered(JobSubmitted.model_construct())
    with pytest.raises(UnknownEventType, match=r"unknown event type 'test\.Pinged'"):
        EVENT_REGISTRY.decode("test.Pinged", 1, '{"n": 1}')

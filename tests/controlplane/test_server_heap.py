"""A serving control plane takes what is alive once it has started out of the cyclic garbage
collector's walk (`freeze_startup_heap`): every full collection traversed those objects (some
130,000: the imports, the app, the pool) and held the event loop, and so the submits, 70 to 120 ms
on a 2-core machine (issue 36, `bench api`'s submit p99). Frozen, no generation holds them any
more; what the process makes later is collected as before, and the start-up's own garbage is
collected, not frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.heap import freeze_startup_heap
from controlplane.server import allowed_images, listening
from controlplane.settings import LOG_RETENTION_S
from harness.served import free_port


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def collected(obj: object) -> bool:
    """Whether a collection walks `obj`: whether one of the generations holds it (the
    permanent generation, where `gc.freeze` puts objects, is none of them)."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test's process as the other tests expect it: nothing frozen, afterwards."""
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_what_is_alive_at_start_is_out_of_every_collections_walk(unfrozen: None) -> None:
    alive = [Node()]
    assert collected(alive)
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() > 0
    assert gc.is_tracked(alive) and not collected(alive)
    made_later = [Node()]
    assert collected(made_later)


def test_the_start_ups_garbage_is_collected_not_frozen(unfrozen: None) -> None:
    one, two = Node(), Node()
    one.other, two.other = two, one  # a cycle: only the collector frees it
    gone = weakref.ref(one)
    del one, two
    freeze_startup_heap()
    assert gone() is None


async def test_a_served_control_plane_has_frozen_its_start_up(
    db_url: str, tmp_path: Path, unfrozen: None
) -> None:
    port = free_port()
    async with listening(
        db_url, "127.0.0.1", port, tmp_path, allowed_images(), LOG_RETENTION_S
    ) as app:
        # The app and its parts were made while it started: out of every collection's walk.
        assert gc.get_freeze_count() > 0
        assert not collected(app)
        assert not collected(app.router)

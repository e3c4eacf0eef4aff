"""A process's long-lived heap (its start-up's, a command's input), taken out of the cyclic
garbage collector's walk."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect the start-up's garbage, then move every object still tracked by the cyclic
    garbage collector into its permanent generation (`gc.freeze`), which no collection
    traverses again; returns how many objects that is.

    A long-running process (`trainyard serve`, the pending-reasons recorder's process) calls it
    once started: its modules, classes, functions, routes, pool and compiled statements (some
    130,000 tracked objects in the API's process) live as long as it does, yet every full
    (generation 2) collection walked them all. In the API's process, with submits at 200/s, one
    ran every 2 to 3 s and held the event loop 70 to 120 ms on a 2-core machine, so about 1 % of
    submits waited 100 ms or more (`bench api`'s submit p99, issue 36). In the recorder's, with
    2,000 jobs queued, one ran every few rounds and made that round cost 80 to 100 ms of CPU
    instead of 20 to 40: bursts that took a core from the API and the database. A command that
    has read what it works on calls it too: `trainyard simulate`, whose recorded past, read into
    memory, a full collection would walk during the replay (one such collection doubled a
    replay's time, 56 to 107 ms for 2,000 jobs).

    Frozen, they are out of every collection's walk, and a full collection walks only what the
    process has made since. What is alive now and later dies in a reference cycle is never
    freed: a bounded, one-off cost, since nothing made after this call is frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

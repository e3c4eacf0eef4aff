"""The events of a search's stream (`search-<id>`): every decision its searcher made, with its
reason, and what became of each trial. The searcher's state is these events folded
(`lifecycle.evolve`); nothing else is kept."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import Field

from controlplane.events.types import Event, event_type
from controlplane.searches.spec import SearchSpec, stored_spec


class SearchEvent(Event):
    at: datetime


def _within_bounds(data: dict[str, Any]) -> dict[str, Any]:
    # Version 1 accepted any trial `cpus`, deploy timeout and log-uniform bound above 0.
    spec = data.get("spec")
    return {**data, "spec": stored_spec(spec)} if isinstance(spec, dict) else data


# Version 3: the trial's `env` holds no torch rendezvous names (reserved since, see
# `jobs.manifest.RESERVED_ENV`); version 4: nor gloo's and NCCL's socket interface names.
# stored_spec leaves them out.
@event_type(
    "SearchSubmitted",
    version=4,
    upcasters={1: _within_bounds, 2: _within_bounds, 3: _within_bounds},
)
class SearchSubmitted(SearchEvent):
    search_id: UUID
    tenant: str
    spec: SearchSpec


@event_type("TrialCreated")
class TrialCreated(SearchEvent):
    number: int
    point: dict[str, Any]
    budget: int
    job_id: UUID
    """The job that runs its first rung."""
    reason: str
    parent: int | None = None


@event_type("TrialPromoted")
class TrialPromoted(SearchEvent):
    """The trial goes on to `rung` with a larger budget, in a new job that resumes from the
    checkpoint of the one before."""

    number: int
    rung: int
    budget: int
    job_id: UUID
    reason: str


@event_type("TrialRungFinished")
class TrialRungFinished(SearchEvent):
    """The trial's job trained to its budget and reported the metric."""

    number: int
    rung: int
    metric: float = Field(allow_inf_nan=False)


@event_type("TrialFailed")
class TrialFailed(SearchEvent):
    number: int
    reason: str


@event_type("TrialPruned")
class TrialPruned(SearchEvent):
    number: int
    reason: str


@event_type("BestUpdated")
class BestUpdated(SearchEvent):
    number: int
    rung: int
    metric: float = Field(allow_inf_nan=False)


@event_type("SearchEnded")
class SearchEnded(SearchEvent):
    state: Literal["completed", "failed", "cancelled"]
    reason: str


EVENT_TYPES: tuple[type[Event], ...] = (
    SearchSubmitted,
    TrialCreated,
    TrialPromoted,
    TrialRungFinished,
    TrialFailed,
    TrialPruned,
    BestUpdated,
    SearchEnded,
)
"""This feature's event types, for the registry (see `controlplane.event_registry`)."""

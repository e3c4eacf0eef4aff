"""Naming a search's stream: `search-<id>`."""

from __future__ import annotations

from uuid import UUID

CATEGORY = "search"


def search_stream(search_id: UUID) -> str:
    return f"{CATEGORY}-{search_id}"


def search_id_of(stream_id: str) -> UUID:
    return UUID(stream_id.removeprefix(f"{CATEGORY}-"))

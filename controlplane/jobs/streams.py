"""Naming a job's stream."""

from __future__ import annotations

from uuid import UUID

CATEGORY = "job"


def job_stream(job_id: UUID) -> str:
    return f"{CATEGORY}-{job_id}"


def job_id_of(stream_id: str) -> UUID:
    return UUID(stream_id.removeprefix(f"{CATEGORY}-"))

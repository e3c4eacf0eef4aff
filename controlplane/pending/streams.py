"""Naming a job's pending stream: the changes of its reasons, apart from the job's own stream,
whose version its claims check (a reason recorded must never make a claim retry)."""

from __future__ import annotations

from uuid import UUID

CATEGORY = "pending"


def pending_stream(job_id: UUID) -> str:
    return f"{CATEGORY}-{job_id}"


def job_id_of(stream_id: str) -> UUID:
    return UUID(stream_id.removeprefix(f"{CATEGORY}-"))

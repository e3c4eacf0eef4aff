"""The admission policy, pure: a command is admitted exactly when every quantity it asks for
fits beside what its tenant holds; refused 422 when the ask alone passes the limit, else 429."""

from __future__ import annotations

from dataclasses import fields

from hypothesis import given
from hypothesis import strategies as st

from controlplane.admission.policy import Room, job_room, refusal
from controlplane.jobs.manifest import JobManifest
from controlplane.refusals import Refused
from controlplane.tenants.limits import TenantLimits

NAMES = [f.name for f in fields(Room)]
amounts = st.integers(min_value=0, max_value=20)


@st.composite
def rooms(draw: st.DrawFn) -> Room:
    return Room(**{name: draw(amounts) for name in NAMES})


@st.composite
def limits(draw: st.DrawFn) -> TenantLimits:
    # queued_jobs is at least 1: a tenant that may queue nothing could not run anything.
    drawn = {name: draw(amounts) for name in NAMES}
    return TenantLimits(**{**drawn, "queued_jobs": max(1, drawn["queued_jobs"])})


@given(limits(), rooms(), rooms())
def test_a_command_is_admitted_exactly_when_all_it_asks_for_fits(
    limit: TenantLimits, held: Room, asked: Room
) -> None:
    passing = [
        name
        for name in NAMES
        if getattr(asked, name) > 0
        and getattr(held, name) + getattr(asked, name) > getattr(limit, name)
    ]
    refused = refusal("acme", limit, held, asked)
    if not passing:
        assert refused is None
        return
    assert refused is not None and refused.field == passing[0]
    never = getattr(asked, passing[0]) > getattr(limit, passing[0])
    assert refused.kind is (Refused.FORBIDDEN if never else Refused.LIMITED)
    assert "acme" in refused.message and passing[0] in refused.message


def test_nothing_asked_is_never_refused_even_over_a_lowered_limit() -> None:
    over = Room(deployments=5, artifact_bytes=10**9)
    assert refusal("acme", TenantLimits(deployments=1, artifact_bytes=0), over, Room()) is None


def test_a_job_asks_for_its_learners_room_and_an_inference_job_for_a_place_only() -> None:
    manifest = JobManifest.model_validate(
        {"name": "j", "image": "i", "command": ["x"], "learners": 3, "cpus": 2, "memory_mb": 100}
    )
    assert job_room(manifest) == Room(queued_jobs=1, cpus=6, memory_mb=300)
    assert job_room(manifest) + Room(searches=1) == Room(
        queued_jobs=1, cpus=6, memory_mb=300, searches=1
    )

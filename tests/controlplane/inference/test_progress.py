"""An inference job moved on by its queries, pure: the commands `progress.steps` decides, and
what the job lifecycle makes of them (StartQueries only for an inference job, from QUEUED)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.inference.progress import Progress, steps
from controlplane.jobs.events import JobEvent
from controlplane.jobs.lifecycle import (
    Complete,
    Fail,
    Job,
    JobStatus,
    Refused,
    StartQueries,
    Submit,
    decide,
    replay,
)
from controlplane.jobs.manifest import InferenceSpec, JobManifest

AT = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
SPEC = InferenceSpec(
    model="m",
    model_tenant="acme",
    model_name="m",
    version=1,
    deployment="inference-0123456789abcdef",
    input={"generate": {"shape": [4], "seed": 0}},
    batch_size=2,
    queries=3,
    weight=1.0,
    replicas=1,
    query_timeout_s=60,
)


def submitted(*, inference: bool = True) -> list[JobEvent]:
    manifest = JobManifest(
        name="j",
        image="trainyard-learner",
        command=["python", "-m", "runners.serve"],
        inference=SPEC if inference else None,
    )
    return decide(Submit(uuid.uuid4(), "acme", manifest, AT), None)


def folded(events: list[JobEvent]) -> Job:
    job = replay(events)
    assert job is not None
    return job


def progress(state: JobStatus, started: int, unfinished: int, **more: object) -> Progress:
    fields: dict[str, object] = {
        "state": state,
        "queries": 3,
        "started": started,
        "unfinished": unfinished,
        "load_error": None,
        **more,
    }
    return Progress(**fields)  # type: ignore[arg-type]


def test_a_job_moves_on_as_its_queries_do() -> None:
    assert steps(progress(JobStatus.QUEUED, 0, 0), AT) == []
    assert steps(progress(JobStatus.QUEUED, 1, 1), AT) == [StartQueries(AT)]
    assert steps(progress(JobStatus.PROCESSING, 3, 1), AT) == []
    assert steps(progress(JobStatus.PROCESSING, 3, 0), AT) == [Complete([0], AT)]
    # All of it within one sweep: started, run and finished in between.
    assert steps(progress(JobStatus.QUEUED, 3, 0), AT) == [StartQueries(AT), Complete([0], AT)]
    # An endless job never completes by itself.
    assert steps(progress(JobStatus.PROCESSING, 10**6, 0, queries=None), AT) == []


def test_a_model_that_cannot_load_fails_the_job_saying_why() -> None:
    [step] = steps(progress(JobStatus.QUEUED, 0, 0, load_error="ImportError: x"), AT)
    assert isinstance(step, Fail)
    assert step.reason == "its model could not be loaded: ImportError: x"


@given(
    st.sampled_from([JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED]),
    st.integers(0, 5),
    st.integers(0, 5),
    st.none() | st.text(max_size=5),
)
def test_an_ended_job_is_left_alone(
    state: JobStatus, started: int, unfinished: int, error: str | None
) -> None:
    assert steps(progress(state, started, unfinished, load_error=error), AT) == []


def test_the_lifecycle_carries_the_steps_out_in_order() -> None:
    events = submitted()
    for step in steps(progress(JobStatus.QUEUED, 3, 0), AT):
        events += decide(step, folded(events))
    finished = folded(events)
    assert [t.state for t in finished.transitions] == [
        JobStatus.QUEUED,
        JobStatus.PROCESSING,
        JobStatus.COMPLETED,
    ]


def test_only_a_queued_inference_job_starts_queries() -> None:
    with pytest.raises(Refused, match="not an inference job"):
        decide(StartQueries(AT), folded(submitted(inference=False)))
    events = submitted()
    events += decide(StartQueries(AT), folded(events))
    with pytest.raises(Refused, match="only a job in QUEUED can start its queries"):
        decide(StartQueries(AT), folded(events))

"""Reconciling against the real store: a replica recorded as started whose job was never
submitted (a crash between the two) gets its job, and nothing else is appended."""

from __future__ import annotations

from pathlib import Path

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.deployments.lifecycle import DEPLOYMENT, ChangeReplicas, Create
from controlplane.deployments.service import Deployments, replica_job_id
from controlplane.deployments.streams import deployment_stream
from controlplane.events.metadata import Metadata
from controlplane.events.store import EventStore
from controlplane.jobs.lifecycle import JobStatus
from controlplane.jobs.locations import Roots
from controlplane.jobs.service import Jobs
from controlplane.models.service import Models
from tests.controlplane.deployments.test_lifecycle import AT, created

SYSTEM = Metadata(actor="test", tenant="acme")


async def test_a_replica_recorded_but_never_submitted_gets_its_job(
    store: EventStore, tmp_path: Path
) -> None:
    jobs = Jobs(store)
    models = Models(store, FileArtifactStore(tmp_path), jobs, roots=Roots())
    deployments = Deployments(store, jobs, models)
    stream = deployment_stream("acme", "dbl")
    job_id = replica_job_id("acme", "dbl", 1)
    await DEPLOYMENT.execute(store, stream, Create(created(replicas=1)), SYSTEM)
    # The crash: the event was appended, the job's submission never happened.
    await DEPLOYMENT.execute(store, stream, ChangeReplicas(AT, start=(job_id,)), SYSTEM)
    before = len(await store.read_stream(stream))
    state = await deployments.reconcile("acme", "dbl")
    assert state.active == (job_id,)
    assert len(await store.read_stream(stream)) == before  # nothing to record
    job, _ = await jobs.current(job_id)
    assert job is not None and job.state is JobStatus.QUEUED
    assert job.manifest.servable is not None and job.manifest.servable.deployment == "dbl"

"""From training to the repository in one step: the PyTorch example trains as a real job, and
its stored results and one of its checkpoints are published as model versions without an
upload, their provenance (job, attempt, checkpoint step, data sha256) taken from the job's
events; what is published is the very file the job wrote, a state dict PyTorch loads."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from pathlib import Path
from uuid import uuid4

import asyncpg
import pytest
import torch

from controlplane.artifacts.filesystem import FileArtifactStore
from controlplane.events.metadata import Metadata
from controlplane.jobs.events import CheckpointSaved
from controlplane.jobs.lifecycle import JobStatus
from controlplane.models.errors import InvalidModel, SourceNotFound, SourceUnavailable
from controlplane.models.service import Models
from tests.cluster import Plane, RunningAgent, agent_config, learner_space
from tests.controlplane.models.samples import metadata

TRAIN = [sys.executable, "-m", "runners.examples.classifier", "--seed", "5", "--steps", "3000"]
ACME = Metadata(actor="tenant:acme")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.processes
async def test_a_model_is_published_from_its_jobs_results_and_checkpoint(
    plane: Plane, tmp_path: Path, owner: asyncpg.Connection
) -> None:
    # The operator's data and results root, where the learner (a uid of its job's) may read
    # the data and store its results.
    space = learner_space() / "shared"
    space.mkdir(mode=0o777)
    space.chmod(0o777)  # whatever the umask
    data = space / "data.bin"
    data.write_bytes(b"the training data, pinned by its checksum")
    data.chmod(0o644)
    results = space / "results" / "run-1"
    agent = await RunningAgent(plane.url, agent_config(space), fake_gpus=0).started()
    try:
        await _publish_from(plane, agent, data, results, tmp_path, owner)
    finally:
        await agent.finish()


async def _publish_from(
    plane: Plane,
    agent: RunningAgent,
    data: Path,
    results: Path,
    tmp_path: Path,
    owner: asyncpg.Connection,
) -> None:
    job_id = await plane.submit(
        TRAIN,
        gpus_per_learner=0,
        checkpoint={"interval_seconds": 1, "keep": 3},
        data={"source": data.as_uri(), "sha256": sha256_of(data)},
        results={"location": results.as_uri()},
    )
    job = await plane.until(job_id, lambda job: job.state.terminal, seconds=120)
    assert job.state is JobStatus.COMPLETED, job.failure_reason
    models = Models(
        plane.store,
        FileArtifactStore(tmp_path / "artifacts"),
        plane.jobs,
        # The control plane reads checkpoints where the agent keeps them.
        roots=dataclasses.replace(
            agent.config.roots, checkpoints=(str(agent.config.checkpoint_root),)
        ),
    )
    document = metadata(provenance=None)

    published = await models.publish_from_job("acme", "classifier", job_id, document, ACME)
    version = published.version
    assert version.artifact_sha256 == sha256_of(results / "model.pt")
    assert version.metadata["provenance"] == {
        "job_id": str(job_id),
        "attempt": job.attempt,
        "checkpoint_step": None,
        "data_sha256": sha256_of(data),
    }
    blob = models.artifacts.blob_path(version.artifact_sha256)  # type: ignore[attr-defined]
    weights = torch.load(blob, weights_only=True)
    assert weights["0.weight"].shape == (64, 16)

    saved = [
        e.event for e in await plane.jobs.history(job_id) if isinstance(e.event, CheckpointSaved)
    ]
    last = saved[-1]
    from_checkpoint = await models.publish_from_job(
        "acme", "classifier", job_id, document, ACME, checkpoint_step=last.step
    )
    assert from_checkpoint.version.number == 2
    assert from_checkpoint.version.artifact_sha256 == sha256_of(Path(last.path))
    assert from_checkpoint.version.metadata["provenance"]["checkpoint_step"] == last.step
    assert from_checkpoint.version.metadata["provenance"]["attempt"] == last.attempt

    # The audit view tells where each version came from, from the events alone.
    rows = await owner.fetch(
        "SELECT version, job_id, attempt, checkpoint_step, data_sha256 FROM audit.model_versions"
        " ORDER BY version"
    )
    assert [tuple(r) for r in rows] == [
        (1, job_id, job.attempt, None, sha256_of(data)),
        (2, job_id, last.attempt, last.step, sha256_of(data)),
    ]

    # What cannot be published says why, and publishes nothing.
    with pytest.raises(SourceNotFound):
        await models.publish_from_job("acme", "classifier", uuid4(), document, ACME)
    with pytest.raises(SourceNotFound):
        await models.publish_from_job("globex", "classifier", job_id, document, ACME)
    with pytest.raises(SourceNotFound):
        await models.publish_from_job(
            "acme", "classifier", job_id, document, ACME, checkpoint_step=10**9
        )
    with pytest.raises(InvalidModel):
        await models.publish_from_job(
            "acme", "classifier", job_id, document, ACME, results_file="../run-1/model.pt"
        )
    os.symlink("/etc/passwd", results / "passwd")
    with pytest.raises(SourceUnavailable):
        await models.publish_from_job(
            "acme", "classifier", job_id, document, ACME, results_file="passwd"
        )
    model = await models.load("acme", "classifier")
    assert model is not None and len(model.versions) == 2

"""What each learner of a claimed attempt runs: a pure function of the claim and the node."""

from __future__ import annotations

from collections.abc import Mapping, Set
from pathlib import Path
from urllib.parse import urlsplit
from uuid import UUID

from controlplane.agents.claims import Claim
from node_agent.runtime import LearnerSpec, Mount
from runners import config as runner_env
from runners.uri import file_path


def learner_dir(work_dir: Path, job_id: UUID, attempt: int, learner: int) -> Path:
    """A learner's working directory, where its output files are."""
    return work_dir / str(job_id) / f"attempt-{attempt}" / f"learner-{learner}"


def checkpoint_dir(root: Path, claim: Claim, learner: int) -> Path:
    """Shared by every attempt of the job that runs where `root` is mounted (this node, or every
    node when it is a shared volume), so a restart resumes from it."""
    return root / str(claim.job.job_id) / "checkpoints" / f"learner-{learner}"


def _results_mount(location: Path) -> Path:
    """The launcher stages its copy of the results beside their location, so the location's
    parent is written too; never the root, though (a container would then see all of the
    node's file system): results at the top level cannot be staged in a container, and its
    STORING phase says so."""
    return location if location.parent == Path("/") else location.parent


def learner_specs(
    claim: Claim,
    *,
    node: str,
    work_dir: Path,
    checkpoint_root: Path,
    launcher: list[str],
    network_tenants: Set[str] = frozenset(),
    secret_env: Mapping[str, str] | None = None,
) -> list[LearnerSpec]:
    """One spec per learner: the user's command wrapped by the learner launcher (which reports
    phases and checkpoints), with the manifest's environment and the job's `secret_env`, its
    data, results and checkpoint settings, and the network only for the tenants in
    `network_tenants`."""
    job = claim.job
    manifest = job.manifest
    specs = []
    # This node's learners only: a job placed on several nodes runs the others there.
    for allocation in claim.on(node):
        workdir = learner_dir(work_dir, job.job_id, claim.attempt, allocation.index)
        checkpoints = checkpoint_dir(checkpoint_root, claim, allocation.index)
        mounts = [Mount(checkpoints, writable=True)]
        env = {
            **manifest.env,
            **(secret_env or {}),
            runner_env.RESULTS_DIR: str(workdir / "results"),
            runner_env.CHECKPOINT_DIR: str(checkpoints),
            runner_env.CHECKPOINT_INTERVAL: str(manifest.checkpoint.interval_seconds),
            runner_env.CHECKPOINT_KEEP: str(manifest.checkpoint.keep),
        }
        if manifest.data is not None:
            env[runner_env.DATA_URI] = manifest.data.source
            env[runner_env.DATA_DIR] = manifest.data.mount_path or str(workdir / "data")
            if manifest.data.sha256:
                env[runner_env.DATA_SHA256] = manifest.data.sha256
            if urlsplit(manifest.data.source).scheme == "file":
                mounts.append(Mount(file_path(manifest.data.source), writable=False))
            if manifest.data.mount_path is not None:
                mounts.append(Mount(Path(manifest.data.mount_path), writable=True))
        if manifest.results is not None:
            location = manifest.results.location.rstrip("/")
            # Several learners must not overwrite each other's results.
            if manifest.learners > 1:
                location = f"{location}/learner-{allocation.index}"
            env[runner_env.RESULTS_URI] = location
            mounts.append(Mount(_results_mount(file_path(location)), writable=True))
        resume = job.last_checkpoint.path if job.last_checkpoint else None
        if resume is not None and Path(resume).is_relative_to(checkpoints):
            env[runner_env.RESUME_FROM] = resume
        specs.append(
            LearnerSpec(
                job_id=job.job_id,
                attempt=claim.attempt,
                learner=allocation.index,
                epoch=claim.epoch,
                node=node,
                image=manifest.image,
                command=[*launcher, "--", *manifest.command],
                env=env,
                workdir=workdir,
                gpus=allocation.gpus,
                cpus=manifest.cpus,
                memory_mb=manifest.memory_mb,
                mounts=mounts,
                network=job.tenant in network_tenants,
            )
        )
    return specs

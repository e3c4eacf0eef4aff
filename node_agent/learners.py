"""What each learner of a claimed attempt runs: a pure function of the claim and the node.

Its folders are the agent's (made by `node_agent.folders`, owned by the job's user); the
tenant names no node path: `data.mount_path` is where a container sees its data folder, and
`file://` locations are used only under the operator's roots, which a container sees instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Set
from pathlib import Path
from urllib.parse import urlsplit
from uuid import UUID

from controlplane.agent_port.vocabulary import DATA_ROOTS_ENV, RESULTS_ROOTS_ENV, Claim, Roots
from node_agent.job_links import JobLink
from node_agent.rendezvous import places
from node_agent.runtime import Folder, LearnerSpec, Mount, Shared
from runners import config as runner_env
from runners.uri import file_path


def job_dir(work_dir: Path, job_id: UUID) -> Path:
    """The job's folder on this node, owned by its user: every learner's folders are in it."""
    return work_dir / str(job_id)


def learner_dir(work_dir: Path, job_id: UUID, attempt: int, learner: int) -> Path:
    """A learner's working directory, where its output files are."""
    return job_dir(work_dir, job_id) / f"attempt-{attempt}" / f"learner-{learner}"


def checkpoints_of(claim: Claim) -> UUID:
    """The job whose checkpoint folder the claimed job uses: its own, or the first of its
    search trial's, whose later rungs resume from it."""
    trial = claim.job.manifest.trial
    return claim.job.job_id if trial is None else trial.checkpoints_of


def checkpoint_dir(root: Path, claim: Claim, learner: int) -> Path:
    """Shared by every attempt of the job that runs where `root` is mounted (this node, or every
    node when it is a shared volume), so a restart resumes from it; and by every rung's job of a
    search's trial (one after the other, never two at once), so a promotion resumes too."""
    return root / str(checkpoints_of(claim)) / "checkpoints" / f"learner-{learner}"


def learner_specs(
    claim: Claim,
    *,
    node: str,
    work_dir: Path,
    checkpoint_root: Path,
    launcher: list[str],
    network_tenants: Set[str] = frozenset(),
    roots: Roots | None = None,
    user: tuple[int, int] | None = None,
    container: bool = False,
    secret_env: Mapping[str, str] | None = None,
    link: JobLink | None = None,
) -> list[LearnerSpec]:
    """One spec per learner: the user's command wrapped by the learner launcher (which reports
    phases and checkpoints), with the manifest's environment and the job's `secret_env`, its
    data, results and checkpoint settings, and the network only for the tenants in
    `network_tenants`; `file://` locations allowed under `roots` (none: refused when the
    learner is prepared), run as `user`; `container`: whether it runs in one (where
    `data.mount_path` applies); `link`: this node's part of the job's network across nodes."""
    roots = roots or Roots()
    job = claim.job
    manifest = job.manifest
    specs = []
    place = places(claim, node, container=container, link=link)
    # Rank 0 saves the checkpoints of a job whose learners train together, and every rank
    # restores the one rank 0 chose (`runners.distributed.ChiefCheckpointer`): the others read
    # its folder (on this node; across nodes, a shared checkpoint root).
    chief = checkpoint_dir(checkpoint_root, claim, 0)
    # This node's learners only: a job placed on several nodes runs the others there.
    for allocation in claim.on(node):
        workdir = learner_dir(work_dir, job.job_id, claim.attempt, allocation.index)
        checkpoints = checkpoint_dir(checkpoint_root, claim, allocation.index)
        data = workdir / "data"
        trial = manifest.trial
        # A later rung's job takes over the files its trial's earlier rungs left there.
        adopt = trial is not None and trial.checkpoints_of != job.job_id
        folders = [Folder(work_dir, data), Folder(checkpoint_root, checkpoints, adopt=adopt)]
        mounts = [Mount.same(checkpoints, writable=True)]
        if allocation.index != 0:
            folders.append(Folder(checkpoint_root, chief))
            mounts.append(Mount.same(chief, writable=False))
        shared = []
        env = {
            **manifest.env,
            **(secret_env or {}),
            runner_env.RESULTS_DIR: str(workdir / "results"),
            runner_env.CHECKPOINT_DIR: str(checkpoints),
            runner_env.CHECKPOINT_INTERVAL: str(manifest.checkpoint.interval_seconds),
            runner_env.CHECKPOINT_KEEP: str(manifest.checkpoint.keep),
        }
        if manifest.hparams is not None:
            env[runner_env.HPARAMS] = json.dumps(manifest.hparams.values, separators=(",", ":"))
            env[runner_env.BUDGET] = str(manifest.hparams.budget)
            env[runner_env.BUDGET_UNIT] = manifest.hparams.unit
        if trial is not None:
            env[runner_env.TRIAL] = str(trial.number)
        if manifest.data is not None:
            data_dir = data
            if container and manifest.data.mount_path is not None:
                # A place inside the container only: the agent's data folder is seen there.
                data_dir = Path(manifest.data.mount_path)
                mounts.append(Mount(data, data_dir, writable=True))
            env[runner_env.DATA_URI] = manifest.data.source
            env[runner_env.DATA_DIR] = str(data_dir)
            if manifest.data.sha256:
                env[runner_env.DATA_SHA256] = manifest.data.sha256
            if urlsplit(manifest.data.source).scheme == "file":
                source = file_path(manifest.data.source)
                shared.append(
                    Shared(source, roots.data, job.tenant, False, "data.source", DATA_ROOTS_ENV)
                )
        if manifest.results is not None:
            location = manifest.results.location.rstrip("/")
            # Several learners must not overwrite each other's results.
            if manifest.learners > 1:
                location = f"{location}/learner-{allocation.index}"
            env[runner_env.RESULTS_URI] = location
            shared.append(
                Shared(
                    file_path(location),
                    roots.results,
                    job.tenant,
                    True,
                    "results.location",
                    RESULTS_ROOTS_ENV,
                )
            )
        command = [*launcher, "--", *manifest.command]
        packages: tuple[str, ...] = ()
        if manifest.servable is not None:
            # A deployment's replica: it listens in a folder of its own, where the agent
            # delivers the model; run by the launcher's interpreter, which has `runners`.
            serve = workdir / "serve"
            folders.append(Folder(work_dir, serve))
            env[runner_env.SERVE_DIR] = str(serve)
            command = [*launcher, "--", launcher[0], "-m", "runners.serve"]
            packages = tuple(manifest.servable.requirements)
        resume = job.last_checkpoint.path if job.last_checkpoint else None
        # As the learner reported it: normalized, so that `..` cannot lead out of its folder.
        if resume is not None and Path(os.path.normpath(resume)).is_relative_to(checkpoints):
            env[runner_env.RESUME_FROM] = resume
        specs.append(
            LearnerSpec(
                job_id=job.job_id,
                attempt=claim.attempt,
                learner=allocation.index,
                epoch=claim.epoch,
                node=node,
                image=manifest.image,
                command=command,
                env=env,
                workdir=workdir,
                gpus=allocation.gpus,
                cpus=manifest.cpus,
                memory_mb=manifest.memory_mb,
                mounts=mounts,
                network=job.tenant in network_tenants,
                user=user,
                folders=folders,
                shared=shared,
                packages=packages,
                place=None if manifest.servable is not None else place[allocation.index],
                link=link,
            )
        )
    return specs

"""What a learner's container is: its labels and the engine's configuration for it, a pure
function of the learner's spec (so every setting is tested without an engine)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from node_agent.rendezvous import rank_alias
from node_agent.runtime import LearnerSpec, Mount, learner_env

PIDS_LIMIT = 4096
"""Ample for a training script with data loader workers and their threads; a fork bomb stops
here instead of exhausting the node's process table."""
LOG_CONFIG = {"Type": "json-file", "Config": {"max-size": "100m", "max-file": "5"}}
"""A driver the agent can read back (`docker logs`), whatever the engine's default: the agent
follows it while the learner runs and re-reads it after a restart. Bounded: a chatty learner
cannot fill the node's disk while its agent is away."""
GPU_DRIVER = "nvidia"


@dataclass(frozen=True, slots=True)
class LearnerLabels:
    """The labels on a learner's container, by which the agent finds its learners again."""

    job_id: UUID
    attempt: int
    learner: int
    node: str
    epoch: int

    JOB = "trainyard.job"
    ATTEMPT = "trainyard.attempt"
    LEARNER = "trainyard.learner"
    NODE = "trainyard.node"
    EPOCH = "trainyard.epoch"

    @classmethod
    def of(cls, spec: LearnerSpec) -> LearnerLabels:
        return cls(spec.job_id, spec.attempt, spec.learner, spec.node, spec.epoch)

    def to_labels(self) -> dict[str, str]:
        return {
            self.JOB: str(self.job_id),
            self.ATTEMPT: str(self.attempt),
            self.LEARNER: str(self.learner),
            self.NODE: self.node,
            self.EPOCH: str(self.epoch),
        }

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> LearnerLabels:
        """ValueError unless the labels name a learner (a container someone else labelled)."""
        try:
            return cls(
                job_id=UUID(labels[cls.JOB]),
                attempt=int(labels[cls.ATTEMPT]),
                learner=int(labels[cls.LEARNER]),
                node=labels[cls.NODE],
                epoch=int(labels[cls.EPOCH]),
            )
        except KeyError as exc:
            raise ValueError(f"no {exc.args[0]} label") from None


def learner_user(spec: LearnerSpec) -> tuple[int, int]:
    """The user and group the container runs as: the job's (see `node_agent.users`), or, under
    an agent that is not root, the agent's own, so that both can use the learner's folders.
    Never root: ValueError for a spec without a user under an agent that is root."""
    if spec.user is not None:
        return spec.user
    if os.geteuid() == 0:
        raise ValueError("no user to run it as: tenants' code never runs as root")
    return os.geteuid(), os.getegid()


def container_name(spec: LearnerSpec) -> str:
    """Unique per claim (the epoch), readable in `docker ps`."""
    return f"trainyard-{spec.job_id}-{spec.attempt}-{spec.learner}-e{spec.epoch}"


def _bind(mount: Mount) -> dict[str, Any]:
    return {
        "Type": "bind",
        "Source": str(mount.source),
        "Target": str(mount.target),
        "ReadOnly": not mount.writable,
    }


def container_config(
    spec: LearnerSpec, *, request_gpus: bool, network: str = "none"
) -> dict[str, Any]:
    """The body of the engine's create call for this learner; its GPUs are requested from the
    engine's NVIDIA driver by UUID when `request_gpus` (not for fake GPUs). `network`: the
    Docker network it joins, its job's own (see `networks`) when its tenant may use one or it
    has peers to meet, where it goes by its rank's alias; or `container:HOLDER`, its job's
    network across nodes (see `container_links`), where its peers know it by its address."""
    memory = spec.memory_mb << 20
    # Its working directory at the same path inside, as the other folders of the agent's: the
    # paths in its environment and in its checkpoint reports are the node's paths.
    mounts = [_bind(Mount.same(spec.workdir, writable=True))]
    mounts += [_bind(mount) for mount in spec.mounts]
    user = learner_user(spec)
    host: dict[str, Any] = {
        # Isolation by default: no network, no privileges, nothing writable but what the
        # learner needs (its scratch, working, checkpoint and results directories).
        "NetworkMode": network,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "ReadonlyRootfs": True,
        # Scratch in memory: its pages count against the memory limit, so it needs no size.
        "Tmpfs": {"/tmp": "rw,nosuid,nodev"},
        "Mounts": mounts,
        "NanoCpus": round(spec.cpus * 1e9),
        "Memory": memory,
        "MemorySwap": memory,  # the same: no swap beyond the limit
        "PidsLimit": PIDS_LIMIT,
        # PyTorch's data loader workers hand batches over in /dev/shm, and Docker's default
        # 64 MiB makes multi-worker loaders die with a bus error; it counts against the memory
        # limit too.
        "ShmSize": memory // 2,
        # No init process: the launcher is PID 1, so that a command missing from the image
        # fails the start itself with the engine's error (an init would start, then exit 127).
        # The launcher handles the signals the agent sends (SIGTERM, SIGUSR1; SIGKILL needs
        # no handler), which is what PID 1 needs to receive them.
        "Init": False,
        "LogConfig": LOG_CONFIG,
    }
    if spec.gpus and request_gpus:
        host["DeviceRequests"] = [
            {"Driver": GPU_DRIVER, "DeviceIDs": list(spec.gpus), "Capabilities": [["gpu"]]}
        ]
    config: dict[str, Any] = {
        "Image": spec.image,
        # The command as given: an ENTRYPOINT of the image must not wrap the launcher.
        "Entrypoint": spec.command[:1],
        "Cmd": spec.command[1:],
        # The image's PATH: its programs are where the image put them.
        "Env": [f"{name}={value}" for name, value in learner_env(spec, path=None).items()],
        "WorkingDir": str(spec.workdir),
        "User": f"{user[0]}:{user[1]}",
        "Labels": {**spec.labels, **LearnerLabels.of(spec).to_labels()},
        "HostConfig": host,
    }
    if network != "none" and not network.startswith("container:") and spec.place is not None:
        # Its peers find it by this name on their job's network (rank 0's is MASTER_ADDR).
        alias = rank_alias(spec.attempt, spec.learner)
        config["NetworkingConfig"] = {"EndpointsConfig": {network: {"Aliases": [alias]}}}
    return config

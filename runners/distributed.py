"""A learner's place in its job's process group (torch.distributed), and checkpoints by rank 0.

The node agent gives every learner of a job torch's `env://` contract, as torchrun and Ray Train
set it: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, and
their TRAINYARD_* twins (`runners.config`; the torch name wins, and the two must agree when both
are set). With none of them set, a learner is a world of one: a script runs unchanged alone.

    with distributed.process_group() as group:
        model = build().to(group.device)
        optimizer = ...
        checkpointer = distributed.ChiefCheckpointer.from_env(
            group, {"model": model, "optimizer": optimizer}, every=100
        )
        start = checkpointer.resume()  # every rank restores the checkpoint rank 0 chose
        ddp = DistributedDataParallel(model, device_ids=group.device_ids)
        with checkpointer:  # SIGTERM and SIGUSR1 become checkpoints, on every rank at once
            for step in range(start, total):
                ...
                checkpointer.maybe_save(step + 1)  # a collective: every rank calls it

The rendezvous is torch's own (`env://`, a TCP store at MASTER_ADDR:MASTER_PORT kept by rank 0).
It and every collective after it wait at most TRAINYARD_RENDEZVOUS_TIMEOUT_S seconds: a peer that
never comes, or one that died, fails the learner with a reason instead of hanging it.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from runners import config
from runners.channel import STDOUT, Channel
from runners.config import ConfigError
from runners.signals import SignalRequests

if TYPE_CHECKING:
    # Imported where a checkpointer is made: runners.checkpoint needs pydantic (its manifests),
    # and a learner that forms a group without checkpoints runs without it.
    from runners.checkpoint import Checkpointer, CheckpointInfo, Stateful

TORCH_NAMES = {
    "MASTER_ADDR": config.MASTER_ADDR,
    "MASTER_PORT": config.MASTER_PORT,
    "RANK": config.RANK,
    "WORLD_SIZE": config.WORLD_SIZE,
    "LOCAL_RANK": config.LOCAL_RANK,
    "LOCAL_WORLD_SIZE": config.LOCAL_WORLD_SIZE,
    "NODE_RANK": config.NODE_RANK,
}
"""torch's name of each variable of the contract, and its Trainyard twin."""


READY_LINE = "[trainyard] process group ready:"
"""How the line each rank writes once its process group is formed begins."""


class RendezvousError(RuntimeError):
    """The process group could not be formed: a peer never came, or the address is wrong."""


@dataclass(frozen=True)
class Contract:
    """Where a learner stands in its job: its rank among `world_size`, and on its node."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str | None
    """None only in a world of one that was given no address: it has no peer to meet."""
    master_port: int | None
    timeout_s: float


def load_contract(environ: Mapping[str, str]) -> Contract:
    """The contract the environment holds; ConfigError naming the variable that is wrong."""
    world_size = _whole(environ, "WORLD_SIZE", least=1)
    world = 1 if world_size is None else world_size[1]
    rank_value = _whole(environ, "RANK", least=0)
    if rank_value is None:
        if world > 1:
            raise ConfigError(f"RANK (or {config.RANK}) must be set when WORLD_SIZE is {world}")
        rank_value = ("RANK", 0)
    rank_name, rank = rank_value
    if rank >= world:
        raise ConfigError(f"{rank_name}={rank} must be less than WORLD_SIZE={world}")
    # Unset, the learners share one node: torchrun's single-node defaults.
    local_world_name, local_world = _whole(environ, "LOCAL_WORLD_SIZE", least=1) or (
        "LOCAL_WORLD_SIZE",
        world,
    )
    if local_world > world:
        raise ConfigError(f"{local_world_name}={local_world} is more than WORLD_SIZE={world}")
    local_rank_name, local_rank = _whole(environ, "LOCAL_RANK", least=0) or ("LOCAL_RANK", rank)
    if local_rank >= local_world:
        raise ConfigError(
            f"{local_rank_name}={local_rank} must be less than LOCAL_WORLD_SIZE={local_world}"
        )
    _, node_rank = _whole(environ, "NODE_RANK", least=0) or ("NODE_RANK", 0)
    address = _value(environ, "MASTER_ADDR")
    port = _whole(environ, "MASTER_PORT", least=1)
    if world > 1 and address is None:
        raise ConfigError(f"MASTER_ADDR (or {config.MASTER_ADDR}) must be set when WORLD_SIZE>1")
    if (world > 1 or address is not None) and port is None:
        raise ConfigError(
            f"MASTER_PORT (or {config.MASTER_PORT}) must be set with "
            f"WORLD_SIZE={world} and MASTER_ADDR={address[1] if address else None}"
        )
    if port is not None and port[1] > 65535:
        raise ConfigError(f"{port[0]} must be a TCP port (1 to 65535), got {port[1]}")
    return Contract(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank,
        master_addr=None if address is None else address[1],
        master_port=None if port is None else port[1],
        timeout_s=_timeout(environ),
    )


def _value(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(the name it was read from, its value): torch's name first, then its twin."""
    twin = TORCH_NAMES[name]
    own = environ.get(name, "").strip() or None
    theirs = environ.get(twin, "").strip() or None
    if own is not None and theirs is not None and own != theirs:
        raise ConfigError(f"{name}={own!r} and {twin}={theirs!r} disagree")
    if own is not None:
        return name, own
    return None if theirs is None else (twin, theirs)


def _whole(environ: Mapping[str, str], name: str, *, least: int) -> tuple[str, int] | None:
    found = _value(environ, name)
    if found is None:
        return None
    source, text = found
    if not text.isascii() or not text.isdigit() or int(text) < least:
        raise ConfigError(f"{source} must be a whole number of at least {least}, got {text!r}")
    return source, int(text)


def _timeout(environ: Mapping[str, str]) -> float:
    text = environ.get(config.RENDEZVOUS_TIMEOUT_S, "").strip()
    if not text:
        return config.DEFAULT_RENDEZVOUS_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        raise ConfigError(
            f"{config.RENDEZVOUS_TIMEOUT_S} must be a positive number of seconds, got {text!r}"
        )
    return seconds


@dataclass(frozen=True)
class Group:
    """This learner's membership of the process group that `init` formed."""

    contract: Contract
    backend: str
    device: torch.device

    @property
    def rank(self) -> int:
        return self.contract.rank

    @property
    def world_size(self) -> int:
        return self.contract.world_size

    @property
    def is_chief(self) -> bool:
        return self.contract.rank == 0

    @property
    def device_ids(self) -> list[int] | None:
        """What DistributedDataParallel takes as `device_ids`: the GPU, or None on the CPU."""
        return None if self.device.index is None else [self.device.index]


def init(
    environ: Mapping[str, str] = os.environ,
    *,
    backend: str | None = None,
    cuda: bool | None = None,
) -> Group:
    """Join the process group the environment describes; return this learner's membership.

    `cuda` (default: whether this learner sees a GPU) puts the learner on the GPU LOCAL_RANK
    names; `backend` (default: NCCL on a GPU, gloo on the CPU) is torch's.
    """
    contract = load_contract(environ)
    use_cuda = torch.cuda.is_available() if cuda is None else cuda
    chosen = backend or ("nccl" if use_cuda else "gloo")
    if chosen == "nccl" and not use_cuda:
        raise ConfigError("the NCCL backend needs a GPU; this learner has none (use gloo)")
    device = torch.device("cpu")
    if use_cuda:
        # Under torchrun a learner sees all of its node's GPUs and takes LOCAL_RANK's; Trainyard's
        # agent shows each learner only its own (CUDA_VISIBLE_DEVICES), so it takes the first.
        device = torch.device("cuda", contract.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=contract.timeout_s)
    joining = time.monotonic()
    try:
        if contract.master_addr is None:
            # A world of one without an address: no peer to meet, so no port to claim. torch's
            # in-process store stands in for the TCP one. (HashStore is public, documented API,
            # imported by torch.distributed in a way its stubs do not re-export.)
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(chosen, store=store, rank=0, world_size=1, timeout=timeout)
        else:
            _export(contract, environ)
            dist.init_process_group(
                chosen,
                init_method="env://",
                rank=contract.rank,
                world_size=contract.world_size,
                timeout=timeout,
            )
    except dist.DistError as error:
        raise RendezvousError(
            f"rank {contract.rank} of {contract.world_size} did not meet its peers at "
            f"{contract.master_addr}:{contract.master_port} within {contract.timeout_s:g} s "
            f"({config.RENDEZVOUS_TIMEOUT_S}): a peer did not start, or the address is wrong "
            f"({type(error).__name__}: {error})"
        ) from error
    # On standard error, in the job's log: when each rank's group was formed, and how long it
    # waited for its peers (`trainyard bench ddp` reads it).
    print(
        f"{READY_LINE} rank {contract.rank} of {contract.world_size} ({chosen}) after "
        f"{time.monotonic() - joining:.3f} s",
        file=sys.stderr,
        flush=True,
    )
    return Group(contract, chosen, device)


def _export(contract: Contract, environ: Mapping[str, str]) -> None:
    # env:// reads MASTER_ADDR and MASTER_PORT from os.environ itself; a learner given only the
    # twins gets torch's names too, as do libraries that read RANK or LOCAL_RANK.
    if environ is not os.environ:
        return
    values = {
        "MASTER_ADDR": contract.master_addr,
        "MASTER_PORT": contract.master_port,
        "RANK": contract.rank,
        "WORLD_SIZE": contract.world_size,
        "LOCAL_RANK": contract.local_rank,
        "LOCAL_WORLD_SIZE": contract.local_world_size,
        "NODE_RANK": contract.node_rank,
    }
    os.environ.update({name: str(value) for name, value in values.items()})


def is_chief() -> bool:
    """Whether this learner is rank 0 (a learner outside any process group is)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def destroy() -> None:
    """Leave the process group, if this learner is in one."""
    if dist.is_initialized():
        # A DDP module's reducer holds the group too. Were it the last holder, the group would be
        # destroyed with the reducer, with the GIL held, joining gloo's worker threads, one of
        # which may be freeing a tensor and waiting for that GIL: a deadlock (seen on a SIGTERM).
        # DDP modules already unreachable are collected here, while the group is still
        # registered; then destroy_process_group drops the last reference, without the GIL.
        gc.collect()
        dist.destroy_process_group()


@contextmanager
def process_group(
    environ: Mapping[str, str] = os.environ,
    *,
    backend: str | None = None,
    cuda: bool | None = None,
) -> Iterator[Group]:
    """`init` for the block, `destroy` after it, however it ends."""
    group = init(environ, backend=backend, cuda=cuda)
    try:
        yield group
    except BaseException as error:
        # The frames the exception left hold the script's locals (its DDP module among them)
        # for as long as the exception lives, i.e. past `destroy`: dropped now (see `destroy`).
        # The traceback still shows every line.
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        destroy()


def barrier(group: Group) -> None:
    dist.barrier(device_ids=group.device_ids)


class ChiefCheckpointer(SignalRequests):
    """Checkpoints of a process group's training: rank 0 saves, every rank restores.

    Every rank makes one with the same objects (the module itself, not its DDP wrapper, so a
    checkpoint also loads in a learner alone) and calls each method at the same step: each is a
    collective. Decisions are taken together (a SIGTERM or SIGUSR1 that reached any rank, rank
    0's interval, `every` steps), so no rank saves or stops alone, and no rank passes a save
    before it is durable. The checkpoint directory must be one that every rank can read (one
    node's disk, or a shared volume). A checkpoint holds rank 0's RNG states: every rank gets
    them back, so randomness a script wants per rank comes from generators of its own.
    """

    def __init__(self, group: Group, checkpointer: Checkpointer, *, every: int | None) -> None:
        if every is not None and every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.group = group
        self.checkpointer = checkpointer
        self.every = every
        self._last_save = time.monotonic()
        super().__init__()

    @classmethod
    def from_env(
        cls,
        group: Group,
        state: Mapping[str, Stateful],
        *,
        every: int | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> ChiefCheckpointer:
        """Configured by TRAINYARD_CHECKPOINT_* and TRAINYARD_RESUME_FROM, as `Checkpointer`."""
        from runners.checkpoint import Checkpointer

        settings = config.load_checkpoint_config(environ)
        # Only rank 0 reports: the agent reads one learner's restore, not world_size of them.
        channel = STDOUT if group.is_chief else Channel(open(os.devnull, "w"))  # noqa: SIM115
        checkpointer = Checkpointer(
            settings.directory,
            state,
            keep=settings.keep,
            interval_seconds=settings.interval_seconds,
            resume_from=settings.resume_from,
            channel=channel,
        )
        return cls(group, checkpointer, every=every)

    def resume(self) -> int:
        """Restore on every rank the checkpoint rank 0 picks (TRAINYARD_RESUME_FROM, else the
        newest that verifies); return its step, or 0 when there is none."""
        chosen: list[str | None] = [None]
        if self.group.is_chief:
            path = self.checkpointer.resume_from
            if path is None:
                latest = self.checkpointer.latest()
                path = None if latest is None else latest.path
            chosen = [None if path is None else str(path)]
        dist.broadcast_object_list(chosen, src=0, device=self._object_device())
        if chosen[0] is None:
            return 0
        step = self.checkpointer.restore(Path(chosen[0]))
        self._last_save = time.monotonic()
        return step

    def maybe_save(self, step: int) -> CheckpointInfo | None:
        """Save if any rank was asked to (SIGUSR1), rank 0's interval has passed, or `step` is
        a multiple of `every`; after a SIGTERM to any rank, save and end every rank (143)."""
        due = (
            self._stop_requested,
            self._save_requested,
            self.group.is_chief
            and time.monotonic() - self._last_save >= self.checkpointer.interval_seconds,
            self.every is not None and step % self.every == 0,
        )
        flags = torch.tensor([int(flag) for flag in due], device=self.group.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, *save = (bool(flag) for flag in flags.tolist())
        if stop:
            self.save(step)
            raise SystemExit(128 + signal.SIGTERM)
        if any(save):
            self._save_requested = False
            return self.save(step)
        return None

    def save(self, step: int) -> CheckpointInfo | None:
        """Rank 0 saves (and reports) a checkpoint now; every rank waits until it is durable.
        The checkpoint's info on rank 0, None on the others."""
        info = self.checkpointer.save(step) if self.group.is_chief else None
        self._last_save = time.monotonic()
        barrier(self.group)
        return info

    def _object_device(self) -> torch.device:
        # NCCL moves objects through the GPU, gloo through host memory.
        return self.group.device if self.group.backend == "nccl" else torch.device("cpu")

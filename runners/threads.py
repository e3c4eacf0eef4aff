"""A learner's compute threads: as many as its CPUs (TRAINYARD_CPUS, rounded up), as a serving or
training system sizes a worker's (torchrun gives each of a node's processes one, Ray each worker
its CPUs). Its cgroup's quota holds a learner to its CPUs, and with a thread for each of the
node's cores it spends most of each period throttled: on a 16-core node, ResNet18 replicas of
half a CPU each answered 0.25 queries a second. The job's own OMP_NUM_THREADS wins, and so does
what its code sets itself.

The launcher applies it to the process that runs the learner's code, a new interpreter or a warm
learner's fork, so that the code sees the same either way: OMP_NUM_THREADS in its environment,
which torch reads as it loads, and torch's own count where a warm import loaded it already."""

from __future__ import annotations

import math
import os
import sys

from runners.config import CPUS

THREADS = "OMP_NUM_THREADS"


def fit_threads() -> None:
    """Give this process, and what it starts, the learner's CPUs as compute threads, unless the
    job chose them or the agent gave no CPUs."""
    if THREADS in os.environ:
        return
    try:
        threads = max(1, math.ceil(float(os.environ[CPUS])))
    except (KeyError, ValueError, OverflowError):
        return
    os.environ[THREADS] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        # Imported already: a warm sandbox's `--warm-import torch`, made before the job's CPUs
        # were known.
        torch.set_num_threads(threads)

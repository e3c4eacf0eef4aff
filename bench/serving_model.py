"""The model `trainyard bench serving` serves: a PyTorch MLP (784-256-10) on the CPU, the same
source in every system. Trainyard's replicas get it as their artifact (a ZIP archive holding
`mlp.py`, entry point `mlp:predict`); the peers (`bench.serving_peers`) import or exec the same
source, so that every system runs the very same `predict` on the batches it forms.

The weights are random but deterministic (`torch.manual_seed(0)`): nothing is downloaded, and
every replica of every system computes the same logits for the same input. Each replica runs the
model on one thread (`torch.set_num_threads(1)`): the benchmark compares how the systems batch
and route requests, and intra-op threads of replicas sharing the machine's cores would only fight
over them.

`noop` is the same shape of artifact with nothing to compute: the serving path's own overhead.
"""

from __future__ import annotations

import io
import random
import stat
import zipfile

MLP_ENTRY_POINT = "mlp:predict"
NOOP_ENTRY_POINT = "noop:predict"
INPUT_SIZE = 784

MLP_SOURCE = '''\
"""A 784-256-10 MLP with deterministic random weights (`trainyard bench serving`'s model)."""

import torch

# One thread per replica: replicas share the machine's cores, and it is their batching, not
# torch's intra-op threads, that the benchmark compares.
torch.set_num_threads(1)
# Random weights, but every replica of every system holds the same ones: no download, and the
# same input gives the same logits everywhere.
torch.manual_seed(0)
# The GPU a replica was given, if any (CUDA sees only its own); the weights are drawn first, on
# the CPU, so they are the same either way.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODEL = (
    torch.nn.Sequential(
        torch.nn.Linear(784, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    .eval()
    .to(DEVICE)
)


def predict(batch: list[list[float]]) -> list[list[float]]:
    """The logits (10 floats) of each 784-float item of `batch`."""
    with torch.inference_mode():
        logits = MODEL(torch.tensor(batch, dtype=torch.float32, device=DEVICE))
    outputs: list[list[float]] = logits.tolist()
    return outputs
'''

NOOP_SOURCE = '''\
"""A model that computes nothing: the serving path's own overhead."""


def predict(batch: list[object]) -> list[int]:
    return [0] * len(batch)
'''

# ZIP's earliest date: the archive's bytes depend on its content alone, not on when it was built.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def mlp_artifact() -> bytes:
    """A ZIP archive holding `mlp.py` (MLP_SOURCE); entry point MLP_ENTRY_POINT."""
    return _module_zip("mlp", MLP_SOURCE)


def noop_artifact() -> bytes:
    """A ZIP archive holding `noop.py` (NOOP_SOURCE); entry point NOOP_ENTRY_POINT."""
    return _module_zip("noop", NOOP_SOURCE)


def sample_input(seed: int = 0) -> list[float]:
    """One item for the MLP: INPUT_SIZE floats in [0, 1), to 4 decimals (a request's JSON stays
    about 5 KiB)."""
    draw = random.Random(seed)
    return [round(draw.random(), 4) for _ in range(INPUT_SIZE)]


def _module_zip(module: str, source: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        member = zipfile.ZipInfo(f"{module}.py", date_time=_EPOCH)
        member.compress_type = zipfile.ZIP_DEFLATED
        # Recorded as a regular file, rw-r--r--: zipfile's default records no Unix mode at all.
        member.external_attr = (stat.S_IFREG | 0o644) << 16
        archive.writestr(member, source)
    return buffer.getvalue()

"""Inference jobs' step of the lifecycle manager's sweep (see `Inference.sweep`)."""

from __future__ import annotations

from controlplane.inference.service import Inference
from controlplane.sweeps import Tenure


class InferenceSweep:
    """The sweep of inference jobs: each job's step is isolated inside `Inference.sweep`."""

    name = "inference"

    def __init__(self, inference: Inference) -> None:
        self._inference = inference

    async def step(self, tenure: Tenure) -> None:
        await self._inference.sweep()

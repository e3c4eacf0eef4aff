"""Every projection the control plane runs, by name."""

from __future__ import annotations

from controlplane.projections.base import Projection
from controlplane.projections.streams import StreamsProjection


def all_projections() -> list[Projection]:
    return [StreamsProjection()]

"""Who sees a model: its own tenant every version, another tenant only the public ones. A model
with none visible is, to the one asking, a model that does not exist (404, never 403), so that
a private model's name is not given away."""

from __future__ import annotations

from controlplane.models.events import Visibility
from controlplane.models.state import ModelState, ModelVersion


def visible_versions(model: ModelState, viewer: str) -> tuple[ModelVersion, ...]:
    """The versions of `model` the tenant `viewer` sees."""
    if viewer == model.tenant:
        return model.versions
    return tuple(v for v in model.versions if v.visibility is Visibility.PUBLIC)

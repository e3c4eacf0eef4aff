"""Naming a model's stream: one per model, `model-<tenant>.<name>`.

Stream ids allow no '/' (the events table checks `<category>-<id>` with a narrow alphabet), so
'.' separates the two: tenant names never hold one, model names may, and the first '.' splits.
"""

from __future__ import annotations

from controlplane.models.names import check_model_name
from controlplane.tenants.validation import check_name

CATEGORY = "model"


def model_stream(tenant: str, name: str) -> str:
    """The stream of `tenant`'s model `name`; InvalidTenant or InvalidModel for a bad name."""
    return f"{CATEGORY}-{check_name(tenant)}.{check_model_name(name)}"


def model_of(stream_id: str) -> tuple[str, str]:
    """The tenant and the model name of a model's stream."""
    tenant, _, name = stream_id.removeprefix(f"{CATEGORY}-").partition(".")
    return tenant, name

"""Naming the serving streams: `deployment-<tenant>.<name>` and `pipeline-<tenant>.<name>`
('.' separates, as for models: tenant names never hold one, serving names neither)."""

from __future__ import annotations

from controlplane.deployments.names import check_name
from controlplane.tenants.validation import check_name as check_tenant

DEPLOYMENT = "deployment"
PIPELINE = "pipeline"


def deployment_stream(tenant: str, name: str) -> str:
    return f"{DEPLOYMENT}-{check_tenant(tenant)}.{check_name(name)}"


def pipeline_stream(tenant: str, name: str) -> str:
    return f"{PIPELINE}-{check_tenant(tenant)}.{check_name(name)}"


def owner_and_name(stream_id: str) -> tuple[str, str]:
    """The tenant and the name of a deployment's or a pipeline's stream."""
    tenant, _, name = stream_id.partition("-")[2].partition(".")
    return tenant, name

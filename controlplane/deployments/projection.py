"""The `deployments` projection: the `deployments` and `pipelines` tables, rebuilt from the
deployment and pipeline streams, which stay the truth."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.deployments.events import (
    DeploymentAutoscaled,
    DeploymentAutoscalingSet,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentScaled,
    PipelineDefined,
    PipelineRemoved,
    ReplicaRetired,
    ReplicaStarted,
)
from controlplane.deployments.streams import DEPLOYMENT, PIPELINE, owner_and_name
from controlplane.events.records import RecordedEvent
from controlplane.queries import Q


class DeploymentsProjection:
    name = "deployments"
    tables: Sequence[str] = ("deployments", "pipelines")
    categories: frozenset[str] | None = frozenset({DEPLOYMENT, PIPELINE})

    async def apply(self, conn: Executor, events: Sequence[RecordedEvent]) -> None:
        for recorded in events:
            tenant, name = owner_and_name(recorded.stream_id)
            match recorded.event:
                case DeploymentCreated() as created:
                    spec = {"resources": created.resources, "serving": created.serving}
                    if created.autoscaling is not None:
                        # Only then: a fixed deployment's row reads as it always has.
                        spec["autoscaling"] = created.autoscaling
                    await conn.execute(
                        Q["upsert_deployment"],
                        tenant,
                        name,
                        created.model_tenant,
                        created.model_name,
                        created.reference,
                        created.version,
                        created.artifact_sha256,
                        created.entry_point,
                        json.dumps(spec),
                        created.replicas,
                        created.at,
                    )
                case DeploymentScaled() | DeploymentAutoscaled() as scaled:
                    await conn.execute(
                        Q["scale_deployment"], tenant, name, scaled.replicas, scaled.at
                    )
                case DeploymentAutoscalingSet() as changed:
                    autoscaling = changed.autoscaling
                    await conn.execute(
                        Q["set_deployment_autoscaling"],
                        tenant,
                        name,
                        None if autoscaling is None else json.dumps(autoscaling),
                        changed.at,
                    )
                case ReplicaStarted() as started:
                    await conn.execute(Q["add_replica"], tenant, name, started.job_id)
                case ReplicaRetired() as retired:
                    await conn.execute(Q["remove_replica"], tenant, name, retired.job_id)
                case DeploymentDeleted() as deleted:
                    await conn.execute(Q["delete_deployment"], tenant, name, deleted.at)
                case PipelineDefined() as defined:
                    await conn.execute(
                        Q["insert_pipeline"], tenant, name, defined.steps, defined.at
                    )
                case PipelineRemoved():
                    await conn.execute(Q["delete_pipeline"], tenant, name)

"""The `deployments` projection: the `deployments` and `pipelines` tables, rebuilt from the
deployment and pipeline streams, which stay the truth."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controlplane.database import Executor
from controlplane.deployments.events import (
    CanaryPromoted,
    CanaryRolledBack,
    CanaryStarted,
    CanaryWeightSet,
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
                    query = Q["add_canary_replica"] if started.canary else Q["add_replica"]
                    await conn.execute(query, tenant, name, started.job_id)
                case ReplicaRetired() as retired:
                    await conn.execute(Q["remove_replica"], tenant, name, retired.job_id)
                case CanaryStarted() as canary:
                    rollback = None if canary.rollback is None else json.dumps(canary.rollback)
                    await conn.execute(
                        Q["start_canary"],
                        tenant,
                        name,
                        canary.version,
                        canary.weight,
                        rollback,
                        canary.at,
                    )
                case CanaryWeightSet() as moved:
                    await conn.execute(Q["set_canary_weight"], tenant, name, moved.weight, moved.at)
                case CanaryPromoted() as promoted:
                    await conn.execute(
                        Q["promote_canary"],
                        tenant,
                        name,
                        promoted.reference,
                        promoted.version,
                        promoted.artifact_sha256,
                        promoted.entry_point,
                        promoted.at,
                    )
                case CanaryRolledBack() as rolled:
                    await conn.execute(Q["end_canary"], tenant, name, rolled.at)
                case DeploymentDeleted() as deleted:
                    await conn.execute(Q["delete_deployment"], tenant, name, deleted.at)
                case PipelineDefined() as defined:
                    await conn.execute(
                        Q["insert_pipeline"], tenant, name, defined.steps, defined.at
                    )
                case PipelineRemoved():
                    await conn.execute(Q["delete_pipeline"], tenant, name)

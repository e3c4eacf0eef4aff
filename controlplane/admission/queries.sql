-- Admission (controlplane/admission/): what a tenant holds now, which its next command is
-- checked against.

-- name: tenant_usage
-- What a tenant holds, in one round trip: its limits (as text; '{}': the defaults), its QUEUED
-- jobs, the CPUs and memory its live jobs ask for (learners x each; an inference job holds no
-- node, its deployment's replicas do), its deployments not deleted and the replicas they ask
-- for (an autoscaled one's `max_replicas`, the most its load may ask for: counted by what it
-- has now, deployments at zero could together grow past the limit), its searches running, its
-- prediction items not yet finished, the bytes its model versions hold; and the most memory any
-- node ever registered has (NULL: no node yet), since a job needing more could never be placed.
-- The jobs' part reads the tenant's counters (job_counts, a row per live state), never its
-- jobs: summed over their documents it cost 27 ms a submission with 3,000 queued. The others
-- read an index of the tenant's live rows only (the queued and running tasks' partial indexes),
-- never its history. No row: no tenant.
SELECT coalesce(t.limits, '{}')::text AS limits,
       j.queued_jobs, j.cpus + d.headroom_cpus AS cpus,
       j.memory_mb + d.headroom_memory_mb AS memory_mb,
       d.deployments, d.replicas,
       (SELECT count(*) FROM searches s WHERE s.tenant = t.name AND s.state = 'running')
           AS searches,
       (SELECT coalesce(sum(k.items), 0) FROM serving_tasks k
         WHERE k.tenant = t.name AND k.state IN ('queued', 'running')) AS queued_predictions,
       (SELECT coalesce(sum(v.size_bytes), 0)::bigint FROM model_versions v
         WHERE v.tenant = t.name) AS artifact_bytes,
       (SELECT max(memory_mb) FROM nodes) AS largest_memory_mb
FROM tenants t,
LATERAL (
    SELECT coalesce(sum(c.n) FILTER (WHERE c.state = 'QUEUED'), 0)::bigint AS queued_jobs,
           coalesce(sum(c.cpus), 0)::float8 AS cpus,
           coalesce(sum(c.memory_mb), 0)::bigint AS memory_mb
    FROM job_counts c
    WHERE c.labels = '{}' AND c.tenant = t.name
      AND c.state IN ('QUEUED', 'DEPLOYING', 'DOWNLOADING', 'PROCESSING', 'STORING')
) j,
LATERAL (
    SELECT count(*) AS deployments,
           coalesce(sum(greatest(replicas, (spec -> 'autoscaling' ->> 'max_replicas')::int)), 0)
               AS replicas,
           -- Autoscaled deployments' headroom, the replicas their load may still ask for, each
           -- holding its CPUs and memory (those it has are live jobs, counted above): so that
           -- jobs admitted while it is small cannot take the room it was admitted for.
           coalesce(sum(greatest(0, (spec -> 'autoscaling' ->> 'max_replicas')::int - replicas)
                        * (spec -> 'resources' ->> 'cpus')::float8), 0) AS headroom_cpus,
           coalesce(sum(greatest(0, (spec -> 'autoscaling' ->> 'max_replicas')::int - replicas)
                        * (spec -> 'resources' ->> 'memory_mb')::bigint), 0)::bigint
               AS headroom_memory_mb
    FROM deployments WHERE tenant = t.name AND NOT deleted
) d
WHERE t.name = $1;

-- name: tenant_prediction_usage
-- What a prediction is checked against, on its synchronous path: only the tenant's limits and
-- its prediction items not yet finished (the queued and running tasks' partial indexes), not
-- the whole of `tenant_usage`. No row: no tenant.
SELECT coalesce(t.limits, '{}')::text AS limits,
       (SELECT coalesce(sum(k.items), 0) FROM serving_tasks k
         WHERE k.tenant = t.name AND k.state IN ('queued', 'running')) AS queued_predictions
FROM tenants t
WHERE t.name = $1;

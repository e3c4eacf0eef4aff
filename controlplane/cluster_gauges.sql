-- The cluster's gauges, read from the database at each scrape.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: queue_depth
-- Metrics: every tenant's QUEUED jobs (those waiting out a restart backoff too); 0 included.
SELECT t.name AS tenant, count(s.job_id) AS jobs
FROM tenants t
LEFT JOIN job_status s ON s.tenant = t.name AND s.state = 'QUEUED'
GROUP BY t.name;

-- name: gpus_by_node
-- Metrics: the GPUs each READY node offers.
SELECT n.name AS node, count(g.uuid) AS gpus
FROM nodes n
LEFT JOIN node_gpus g ON g.node = n.name
WHERE n.state = 'READY'
GROUP BY n.name;

-- name: gpus_allocated
-- Metrics: the GPUs held by job attempts, per tenant and node.
SELECT tenant, node, sum(cardinality(gpus)) AS gpus
FROM allocations
WHERE released_at IS NULL
GROUP BY tenant, node;

-- name: serving_gauges
-- Metrics: each live deployment's queued tasks, and its mean batch size over the batches kept.
SELECT d.tenant, d.name AS deployment,
       (SELECT count(*) FROM serving_tasks t
        WHERE t.tenant = d.tenant AND t.deployment = d.name AND t.state = 'queued') AS queued,
       (SELECT avg(items) FROM serving_batches b
        WHERE b.tenant = d.tenant AND b.deployment = d.name) AS batch_size
FROM deployments d
WHERE NOT d.deleted;

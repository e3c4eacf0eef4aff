-- What each READY node can still give, for claims that place a job's learners on one node or
-- on several: healthy unallocated GPUs (in index order), CPUs and memory.
CREATE VIEW node_capacity AS
SELECT n.name,
       coalesce((SELECT array_agg(g.uuid ORDER BY g.index) FROM node_gpus g
                 WHERE g.node = n.name AND g.healthy
                   AND NOT EXISTS (SELECT 1 FROM allocated_gpus a WHERE a.gpu_uuid = g.uuid)),
                '{}') AS gpus,
       n.cpus - coalesce((SELECT sum(a.cpus) FROM allocations a
                          WHERE a.node = n.name AND a.released_at IS NULL), 0) AS cpus,
       n.memory_mb - coalesce((SELECT sum(a.memory_mb) FROM allocations a
                               WHERE a.node = n.name AND a.released_at IS NULL), 0)
           AS memory_mb
FROM nodes n
WHERE n.state = 'READY';

GRANT SELECT ON node_capacity TO trainyard_app;

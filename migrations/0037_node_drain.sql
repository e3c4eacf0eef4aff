-- An operator's drain (`trainyard nodes drain NODE`): a node taken out of service for
-- maintenance keeps its lease, but claims place nothing on it, and its agent, which reads the
-- flag back with each renewal of its lease, preempts what it runs there. The flag outlives the
-- node's agent (a re-registration keeps it) until the operator undrains the node. What the
-- record keeps of it are the node's NodeDrained and NodeUndrained events.
ALTER TABLE nodes ADD COLUMN draining boolean NOT NULL DEFAULT false;

-- Claims read a node's room here only (their own node's, and the others' for a job of several
-- learners), as do the pending reasons: a draining node has none to give.
CREATE OR REPLACE VIEW node_capacity AS
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
WHERE n.state = 'READY' AND NOT n.draining;

-- AGENT RIGHTS: an agent registers and renews its node's row, and must not undrain itself:
-- every column of the row but the operator's flag.
REVOKE UPDATE ON nodes FROM trainyard_agent;
GRANT UPDATE (agent_id, state, lease_until, heartbeat_at, registered_at, runtime, cpus, memory_mb)
    ON nodes TO trainyard_agent;

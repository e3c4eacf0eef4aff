-- The agents' side: nodes and their leases, claims and allocations, the lifecycle manager, agents' logins.
-- Loaded by `controlplane.queries` with every other .sql file of the package.

-- name: register_node
-- Take (or renew) a node's lease; nothing comes back while another agent holds a live lease
-- on the name: it keeps it, and the newcomer refuses to start.
INSERT INTO nodes AS n (name, agent_id, state, lease_until, heartbeat_at, registered_at,
                        runtime, cpus, memory_mb, address, job_plan)
VALUES ($1, $2, 'READY', now() + make_interval(secs => $3), now(), now(), $4, $5, $6, $7, $8)
ON CONFLICT (name) DO UPDATE
SET agent_id = excluded.agent_id, state = 'READY', lease_until = excluded.lease_until,
    heartbeat_at = excluded.heartbeat_at, registered_at = excluded.registered_at,
    runtime = excluded.runtime, cpus = excluded.cpus, memory_mb = excluded.memory_mb,
    address = excluded.address, job_plan = excluded.job_plan
WHERE n.lease_until < now() OR n.state <> 'READY' OR n.agent_id = excluded.agent_id
RETURNING lease_until;

-- name: node_addresses
-- The cluster-network addresses of the nodes $1 that have one, with how each numbers jobs'
-- address blocks (a job's network across nodes).
SELECT name, host(address) AS address, job_plan FROM nodes
WHERE name = ANY($1::text[]) AND address IS NOT NULL;

-- name: node_lease_holder
SELECT agent_id, lease_until, heartbeat_at FROM nodes WHERE name = $1;

-- name: forget_node_gpus
DELETE FROM node_gpus WHERE node = $1;

-- name: insert_node_gpu
INSERT INTO node_gpus (node, index, uuid, model, memory_mb, healthy, health_reason)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: set_gpu_health
UPDATE node_gpus SET healthy = $3, health_reason = $4 WHERE node = $1 AND uuid = $2;

-- name: renew_lease
-- Nothing comes back when the lease is no longer this agent's (it expired and was taken); else
-- the lease, and whether an operator drained the node (its agent then preempts its jobs).
UPDATE nodes SET lease_until = now() + make_interval(secs => $3), heartbeat_at = now()
WHERE name = $1 AND agent_id = $2 AND state = 'READY'
RETURNING lease_until, draining;

-- name: lock_node
-- The node's row, locked until the transaction ends: whoever appends to the node's stream
-- holds it (see `Nodes.record`). Nothing comes back for an unknown node.
SELECT draining FROM nodes WHERE name = $1 FOR UPDATE;

-- name: set_node_draining
UPDATE nodes SET draining = $2 WHERE name = $1;

-- name: deregister_node
UPDATE nodes SET state = 'GONE', lease_until = now()
WHERE name = $1 AND agent_id = $2;

-- name: list_nodes
-- Every node, or node $1 only.
SELECT n.name, n.state, n.lease_until, n.heartbeat_at, n.registered_at, n.runtime, n.cpus,
       n.memory_mb, n.draining, n.lease_until < now() AS expired,
       coalesce((SELECT json_agg(json_build_object(
                    'index', g.index, 'uuid', g.uuid, 'model', g.model,
                    'memory_mb', g.memory_mb, 'healthy', g.healthy,
                    'health_reason', g.health_reason, 'job_id', a.job_id,
                    'attempt', a.attempt, 'learner', a.learner)
                  ORDER BY g.index)
                 FROM node_gpus g LEFT JOIN allocated_gpus a ON a.gpu_uuid = g.uuid
                 WHERE g.node = n.name), '[]') AS gpus,
       coalesce((SELECT sum(a.cpus) FROM allocations a
                 WHERE a.node = n.name AND a.released_at IS NULL), 0) AS cpus_allocated,
       coalesce((SELECT sum(a.memory_mb) FROM allocations a
                 WHERE a.node = n.name AND a.released_at IS NULL), 0) AS memory_mb_allocated
FROM nodes n
WHERE $1::text IS NULL OR n.name = $1
ORDER BY n.name;

-- name: claim_candidates
-- Up to $2 queued jobs that node $1 (READY and not draining, else no rows) can take, with the
-- node's free GPUs, CPUs and memory, in the order a claim takes them under the claim policy in
-- force (the `scheduling_policy` row an operator set, else fair share within quotas):
-- - fair_share: the tenant holding the fewest GPUs for its weight first (counting the jobs
--   before it in this list as held), then priority, then submission time;
-- - priority: priority, then submission time, across tenants;
-- - fifo: submission time alone, across tenants;
-- within the tenant's GPU quota (again counting the jobs before it) unless the policy turns
-- quotas off. Each job fits the node's free room on its own; `claims.claim` takes them in order
-- while they fit together. A job fits when all of it fits here, or, with several learners, when
-- one learner fits here and the READY nodes together have room for them all, counted node by
-- node as `scheduling.placement.place` places them; a job with `learners_per_node` fits when this
-- node and the READY nodes together have room for it node by node, each taking exactly that
-- many learners or none (`placement.node_takes`). Each tenant's best fitting jobs come from
-- one scan of its queue index (by priority, or under fifo by submission: the two branches below
-- differ in nothing else, and only the policy's runs), locked with SKIP LOCKED so that
-- concurrent agents each take different jobs instead of queueing on one row (the rows locked
-- but not taken are released when the claim commits). One statement: a claim is on every
-- job's critical path. The same order, stated in Python for the simulator and the pending
-- reasons, is `scheduling.claim_order.claim_order` over the same `ClaimPolicy`;
-- tests/controlplane/scheduling/test_claim_order.py holds the two together under every
-- policy, so change them together.
WITH policy AS MATERIALIZED (
    SELECT coalesce(p.claim_order, 'fair_share') AS claim_order, coalesce(p.quotas, true) AS quotas
    FROM (VALUES (true)) AS d (one)
    LEFT JOIN scheduling_policy p ON p.one
), capacity AS MATERIALIZED (
    -- Every READY node's room, for the jobs of several learners that do not fit here whole:
    -- read once a claim, and only when one such job is a candidate.
    SELECT * FROM node_capacity
), free AS MATERIALIZED (
    SELECT * FROM node_capacity WHERE name = $1
), usage AS (
    SELECT tenant, sum(cardinality(gpus)) AS gpus
    FROM allocations WHERE released_at IS NULL
    GROUP BY tenant
), fitting AS (
    SELECT c.*, coalesce(u.gpus, 0) AS held, t.weight,
           CASE WHEN p.quotas THEN t.gpu_quota END AS gpu_quota, p.claim_order,
           sum(c.learners * c.gpus_per_learner) OVER (
               PARTITION BY c.tenant
               ORDER BY c.rank DESC, c.submitted_at, c.job_id
           ) AS taken
    FROM free f
    CROSS JOIN policy p
    CROSS JOIN tenants t
    LEFT JOIN usage u ON u.tenant = t.name
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT s.job_id, s.attempt, s.tenant, s.learners, s.gpus_per_learner,
                   s.cpus_per_learner, s.memory_mb_per_learner, s.learners_per_node,
                   s.priority, s.submitted_at,
                   s.version, s.doc, f.gpus AS free_gpus, f.cpus AS free_cpus,
                   f.memory_mb AS free_memory_mb, s.priority AS rank
            FROM job_status s
            WHERE p.claim_order <> 'fifo'
              AND s.tenant = t.name
              AND s.state = 'QUEUED'
              -- An inference job holds no node: its queries run on its deployment's replicas.
              AND NOT s.inference
              AND (s.not_before IS NULL OR s.not_before <= now())
              AND ((s.learners_per_node IS NULL
                    AND ((s.learners * s.gpus_per_learner <= cardinality(f.gpus)
                          AND s.learners * s.cpus_per_learner <= f.cpus
                          AND s.learners * s.memory_mb_per_learner <= f.memory_mb)
                         OR (s.learners > 1
                             AND s.gpus_per_learner <= cardinality(f.gpus)
                             AND s.cpus_per_learner <= f.cpus
                             AND s.memory_mb_per_learner <= f.memory_mb
                             AND s.learners <= (
                                 SELECT sum(least(
                                     CASE WHEN s.gpus_per_learner > 0
                                          THEN cardinality(n.gpus) / s.gpus_per_learner
                                          ELSE s.learners END,
                                     -- At least the manifest's floor (0.01): a row projected
                                     -- before the floor existed must not overflow the
                                     -- division for everyone.
                                     floor(n.cpus / greatest(s.cpus_per_learner, 0.01)),
                                     -- Whole learners: the view's memory is numeric, whose
                                     -- division keeps fractions, and half a learner's room on
                                     -- each of two nodes holds no learner.
                                     floor(n.memory_mb / s.memory_mb_per_learner)))
                                 FROM capacity n))))
                   -- learners_per_node: a node takes exactly that many learners or none
                   -- (torchrun's nproc_per_node; `placement.node_takes`), so this node must
                   -- have room for that many, and the READY nodes that do, enough for all.
                   OR (least(CASE WHEN s.gpus_per_learner > 0
                                  THEN cardinality(f.gpus) / s.gpus_per_learner
                                  ELSE s.learners END,
                             floor(f.cpus / greatest(s.cpus_per_learner, 0.01)),
                             floor(f.memory_mb / s.memory_mb_per_learner)) >= s.learners_per_node
                       AND s.learners <= s.learners_per_node * (
                           SELECT count(*) FROM capacity n
                           WHERE least(CASE WHEN s.gpus_per_learner > 0
                                            THEN cardinality(n.gpus) / s.gpus_per_learner
                                            ELSE s.learners END,
                                       floor(n.cpus / greatest(s.cpus_per_learner, 0.01)),
                                       floor(n.memory_mb / s.memory_mb_per_learner))
                                 >= s.learners_per_node)))
              AND (NOT p.quotas OR t.gpu_quota IS NULL
                   OR coalesce(u.gpus, 0) + s.learners * s.gpus_per_learner <= t.gpu_quota)
              -- Claimed already, but the projection has not applied the JobDeploying event
              -- yet. (OFFSET 0 keeps this a probe of the allocations' primary key for each
              -- candidate: turned into an anti-join, it scanned every allocation ever made for
              -- each, once statistics said the table had grown.)
              AND NOT EXISTS (SELECT 1 FROM allocations a
                              WHERE a.job_id = s.job_id AND a.attempt = s.attempt OFFSET 0)
            ORDER BY s.priority DESC, s.submitted_at, s.job_id
            -- No more than could fit together (GPU jobs: one a free GPU), so that jobs this
            -- claim cannot take stay free for other nodes.
            LIMIT least($2, greatest(cardinality(f.gpus), 1))
            FOR UPDATE OF s SKIP LOCKED
        ) by_priority
        UNION ALL
        SELECT * FROM (
            -- fifo: as above, by submission time alone (job_status_tenant_fifo).
            SELECT s.job_id, s.attempt, s.tenant, s.learners, s.gpus_per_learner,
                   s.cpus_per_learner, s.memory_mb_per_learner, s.learners_per_node,
                   s.priority, s.submitted_at,
                   s.version, s.doc, f.gpus AS free_gpus, f.cpus AS free_cpus,
                   f.memory_mb AS free_memory_mb, 0 AS rank
            FROM job_status s
            WHERE p.claim_order = 'fifo'
              AND s.tenant = t.name
              AND s.state = 'QUEUED'
              AND NOT s.inference
              AND (s.not_before IS NULL OR s.not_before <= now())
              AND ((s.learners_per_node IS NULL
                    AND ((s.learners * s.gpus_per_learner <= cardinality(f.gpus)
                          AND s.learners * s.cpus_per_learner <= f.cpus
                          AND s.learners * s.memory_mb_per_learner <= f.memory_mb)
                         OR (s.learners > 1
                             AND s.gpus_per_learner <= cardinality(f.gpus)
                             AND s.cpus_per_learner <= f.cpus
                             AND s.memory_mb_per_learner <= f.memory_mb
                             AND s.learners <= (
                                 SELECT sum(least(
                                     CASE WHEN s.gpus_per_learner > 0
                                          THEN cardinality(n.gpus) / s.gpus_per_learner
                                          ELSE s.learners END,
                                     floor(n.cpus / greatest(s.cpus_per_learner, 0.01)),
                                     floor(n.memory_mb / s.memory_mb_per_learner)))
                                 FROM capacity n))))
                   OR (least(CASE WHEN s.gpus_per_learner > 0
                                  THEN cardinality(f.gpus) / s.gpus_per_learner
                                  ELSE s.learners END,
                             floor(f.cpus / greatest(s.cpus_per_learner, 0.01)),
                             floor(f.memory_mb / s.memory_mb_per_learner)) >= s.learners_per_node
                       AND s.learners <= s.learners_per_node * (
                           SELECT count(*) FROM capacity n
                           WHERE least(CASE WHEN s.gpus_per_learner > 0
                                            THEN cardinality(n.gpus) / s.gpus_per_learner
                                            ELSE s.learners END,
                                       floor(n.cpus / greatest(s.cpus_per_learner, 0.01)),
                                       floor(n.memory_mb / s.memory_mb_per_learner))
                                 >= s.learners_per_node)))
              AND (NOT p.quotas OR t.gpu_quota IS NULL
                   OR coalesce(u.gpus, 0) + s.learners * s.gpus_per_learner <= t.gpu_quota)
              AND NOT EXISTS (SELECT 1 FROM allocations a
                              WHERE a.job_id = s.job_id AND a.attempt = s.attempt OFFSET 0)
            ORDER BY s.submitted_at, s.job_id
            LIMIT least($2, greatest(cardinality(f.gpus), 1))
            FOR UPDATE OF s SKIP LOCKED
        ) by_submission
    ) c
), candidates AS (
    SELECT * FROM fitting
    WHERE gpu_quota IS NULL OR held + taken <= gpu_quota
    -- Under fair share, the tenant's share just before this job (what it holds and the jobs
    -- before it here) comes first; then priority (rank: 0 under fifo), submission time, id.
    ORDER BY CASE WHEN claim_order = 'fair_share'
                  THEN (held + taken - learners * gpus_per_learner) / weight END,
             rank DESC, submitted_at, job_id
    LIMIT $2
)
-- Fencing epochs too: a sequence is not transactional, so a claim rolled back only skips
-- numbers, and epochs still only grow. And each job's trace context, from its first event.
SELECT c.*, nextval('claim_epochs') AS epoch,
       (SELECT e.metadata -> 'trace' FROM events e
        WHERE e.stream_id = 'job-' || c.job_id AND e.stream_version = 1) AS trace
FROM candidates c
ORDER BY CASE WHEN claim_order = 'fair_share'
              THEN (held + taken - learners * gpus_per_learner) / weight END,
         rank DESC, submitted_at, job_id;

-- name: other_nodes_capacity
-- What the other READY nodes (not draining) can still give, roomiest first: where a claim
-- places the learners that do not fit on the claiming node.
SELECT name, gpus, cpus, memory_mb FROM node_capacity
WHERE name <> $1
ORDER BY cardinality(gpus) DESC, name;

-- name: insert_allocations
-- Claims' learners and their GPUs in one statement: learner row k is learner $3[k] of attempt
-- $2[k] of job $1[k], for tenant $4[k] on node $5[k] with epoch $6[k], $7[k] CPUs and $8[k] MiB;
-- GPU $9[g] belongs to learner row $10[g].
WITH learners AS (
    INSERT INTO allocations (job_id, attempt, learner, tenant, node, epoch, gpus, cpus,
                             memory_mb)
    SELECT l.job_id, l.attempt, l.learner, l.tenant, l.node, l.epoch,
           coalesce((SELECT array_agg(g.gpu ORDER BY g.n)
                     FROM unnest($9::text[], $10::int[]) WITH ORDINALITY AS g(gpu, k, n)
                     WHERE g.k = l.k), '{}'),
           l.cpus, l.memory_mb
    FROM unnest($1::uuid[], $2::int[], $3::int[], $4::text[], $5::text[], $6::bigint[],
                $7::float8[], $8::bigint[])
        WITH ORDINALITY AS l(job_id, attempt, learner, tenant, node, epoch, cpus, memory_mb, k)
)
INSERT INTO allocated_gpus (gpu_uuid, job_id, attempt, learner)
SELECT g.gpu, ($1::uuid[])[g.k], ($2::int[])[g.k], ($3::int[])[g.k]
FROM unnest($9::text[], $10::int[]) AS g(gpu, k)
-- In one global order: claims racing for GPUs of several nodes wait for each other in the same
-- order, so they never deadlock (the later one fails on the GPU's key, and retries).
ORDER BY g.gpu;

-- name: node_allocations
-- A node's live allocations, learner by learner: what a restarted agent must account for.
SELECT job_id, attempt, learner, node, epoch, gpus FROM allocations
WHERE node = $1 AND released_at IS NULL
ORDER BY job_id, attempt, learner;

-- name: release_allocations
-- Give back the learners on node $3 of attempts ($1[k], $2[k]), and their GPUs.
WITH released AS (
    UPDATE allocations a SET released_at = now()
    FROM unnest($1::uuid[], $2::int[]) AS r(job_id, attempt)
    WHERE a.job_id = r.job_id AND a.attempt = r.attempt AND a.node = $3
      AND a.released_at IS NULL
    RETURNING a.job_id, a.attempt, a.learner
)
DELETE FROM allocated_gpus g USING released r
WHERE g.job_id = r.job_id AND g.attempt = r.attempt AND g.learner = r.learner;

-- name: live_nodes
-- What the biggest live node offers (each kind on its own), and the live nodes' healthy GPUs
-- together: whether a job could ever fit.
SELECT count(*) AS nodes,
       coalesce(max(g.healthy), 0) AS gpus,
       coalesce(sum(g.healthy), 0) AS total_gpus,
       coalesce(max(n.cpus), 0) AS cpus,
       coalesce(max(n.memory_mb), 0) AS memory_mb
FROM nodes n
CROSS JOIN LATERAL (SELECT count(*) AS healthy FROM node_gpus g
                    WHERE g.node = n.name AND g.healthy) g
WHERE n.state = 'READY';

-- name: manager_lock
-- Held by the active lifecycle manager's own session: it ends with that session, so a replica
-- that dies hands the role on without anyone having to notice first.
SELECT pg_try_advisory_lock(hashtextextended('trainyard.lifecycle-manager', 0));

-- name: expired_nodes
-- $1: NULL, or when this manager took over after losing its session to the database (a
-- failover: the new primary saw no heartbeat while none could reach it); each lease's TTL
-- (lease_until - heartbeat_at) then also counts from that instant.
SELECT name FROM nodes
WHERE state = 'READY' AND lease_until < now()
  AND ($1::timestamptz IS NULL OR $1::timestamptz + (lease_until - heartbeat_at) < now())
ORDER BY name;

-- name: database_now
SELECT now();

-- name: mark_node_lost
-- Nothing comes back if the agent renewed its lease meanwhile (or another manager was first).
UPDATE nodes SET state = 'LOST'
WHERE name = $1 AND state = 'READY' AND lease_until < now()
RETURNING agent_id;

-- name: node_attempts
-- The job attempts that still hold resources on a node.
SELECT DISTINCT job_id, attempt FROM allocations
WHERE node = $1 AND released_at IS NULL
ORDER BY job_id;

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1);

-- name: create_agent_login_statement
-- CREATE ROLE takes no parameters: the server quotes the name and the SCRAM verifier itself.
-- The verifier was computed by the client, so the password is never sent, and a server that
-- logs DDL logs only the verifier. The login is a member of trainyard_agent and of nothing
-- else, with none of the attributes that would give it more.
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L NOSUPERUSER NOCREATEDB NOCREATEROLE '
              'NOREPLICATION NOBYPASSRLS IN ROLE trainyard_agent', $1::text, $2::text);

-- name: agent_login_settings_statements
-- The login's own settings (ALTER ROLE takes no parameters: the server quotes them), one
-- statement for each of $2 = $3: what its sessions otherwise send at connection start (the
-- agent role, the planner settings), which pgBouncer 1.18 refuses as startup parameters. A
-- session through pgBouncer in transaction mode starts with them from the login, as every
-- session of the login does (one it sends them for just sends the same).
SELECT format('ALTER ROLE %I SET %I = %L', $1::text, s.key, s.value)
FROM unnest($2::text[], $3::text[]) AS s(key, value);

-- name: login_excess
-- What the session's login may do beyond the agent role: its attributes, the tables of this
-- database it owns (through any role it belongs to), and the roles it belongs to that the
-- agent role does not. A superuser belongs to every role: that one word says it all.
SELECT CASE WHEN r.rolsuper THEN ARRAY['superuser'] ELSE array_remove(ARRAY[
           CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
           CASE WHEN r.rolcreatedb THEN 'CREATEDB' END,
           CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END,
           CASE WHEN r.rolreplication THEN 'REPLICATION' END,
           CASE WHEN EXISTS (SELECT 1 FROM pg_class c
                             WHERE c.relnamespace = 'public'::regnamespace
                               AND pg_has_role(r.oid, c.relowner, 'MEMBER'))
                THEN 'owns the tables' END
       ], NULL) || ARRAY(
           SELECT 'member of ' || m.rolname FROM pg_roles m
           WHERE m.oid <> r.oid AND m.rolname <> 'trainyard_agent'
             AND pg_has_role(r.oid, m.oid, 'MEMBER')
             AND NOT pg_has_role('trainyard_agent', m.oid, 'MEMBER')
           ORDER BY m.rolname)
       END AS excess
FROM pg_roles r
WHERE r.rolname = session_user;

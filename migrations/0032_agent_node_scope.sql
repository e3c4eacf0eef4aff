-- Each agent login is confined to its own node. 0014 kept agents from tenants' streams, tokens
-- and webhook secrets, but any agent login still reached every tenant's work through the rows
-- agents share: every job's secrets, every deployment's tasks and memo, any job's log and
-- events, any node's lease and GPUs. So one escaped learner was every tenant. Now the database
-- knows which node a login belongs to (`agent_logins`, written by `trainyard agent-login create
-- NAME --node NODE` and read with `session_user`, which SET ROLE does not change), and the
-- policies below let it read secrets, append events, write log lines and finish tasks only for
-- work allocated to that node now; docs/agent-role.md states the whole of what a login may do.
--
-- Sessions whose login could drop the agent role anyway (RESET ROLE: the owner's own agents in
-- `trainyard up`, tests, a superuser) are not confined: confining them would protect nothing.
-- A login of the agent role bound to no node (made before this migration) may do none of it:
-- bind it with `trainyard agent-login bind NAME --node NODE`.

-- Which node each agent login works for. Only the owner writes it (agent-login create or
-- bind); agents learn their own row through agent_node(), never the others'.
CREATE TABLE agent_logins (
    login      name PRIMARY KEY,
    node       text NOT NULL CHECK (node <> ''),
    bound_at   timestamptz NOT NULL DEFAULT now()
);

-- Whether the session's login owns the schema's tables (by membership, or as a superuser): it
-- may RESET ROLE and do anything, so no policy below confines it.
CREATE FUNCTION agent_unconfined() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT pg_has_role(session_user, c.relowner, 'MEMBER')
    FROM pg_class c WHERE c.oid = 'public.events'::regclass
$$;

-- The node the session's login is bound to; NULL (which matches no node) when it is bound to
-- none. Policies call it once a statement, as `(SELECT agent_node())`.
CREATE FUNCTION agent_node() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$ SELECT node FROM agent_logins WHERE login = session_user $$;

-- The jobs with a learner allocated to the session's node now: whose secrets it may read and
-- to whose streams it may append.
CREATE FUNCTION agent_live_jobs() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT DISTINCT job_id FROM allocations
    WHERE node = agent_node() AND released_at IS NULL
$$;

-- The deployments whose replicas run on the session's node now (a replica job's manifest names
-- its deployment; only the control plane writes `servable`): whose tasks it may claim and
-- finish, and whose memo and batches it may add to.
CREATE FUNCTION agent_deployments() RETURNS TABLE (tenant text, deployment text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT DISTINCT s.tenant, s.doc -> 'manifest' -> 'servable' ->> 'deployment'
    FROM allocations a JOIN job_status s ON s.job_id = a.job_id
    WHERE a.node = agent_node() AND a.released_at IS NULL
      AND s.doc -> 'manifest' -> 'servable' ->> 'deployment' IS NOT NULL
$$;

-- The inference jobs whose queries replicas on the session's node run now (a replica job's
-- manifest names it): whose queries it may claim, see and finish.
CREATE FUNCTION agent_inference_jobs() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT DISTINCT (s.doc -> 'manifest' -> 'servable' ->> 'inference_job')::uuid
    FROM allocations a JOIN job_status s ON s.job_id = a.job_id
    WHERE a.node = agent_node() AND a.released_at IS NULL
      AND s.doc -> 'manifest' -> 'servable' ->> 'inference_job' IS NOT NULL
$$;

-- The job of a `job-<uuid>` stream; NULL for any other stream (never a cast error, which would
-- fail every statement the policy checks).
CREATE FUNCTION stream_job_id(stream_id text) RETURNS uuid
LANGUAGE sql IMMUTABLE SET search_path = public, pg_temp
AS $$
    SELECT CASE WHEN stream_id ~ '^job-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                THEN substr(stream_id, 5)::uuid END
$$;

-- A claim's DEPLOYING event (`data`) for `job`: the job waits in the queue at that attempt and
-- no claim has allocated it yet. Any agent may claim a queued job (that is what the queue is
-- for); none may claim one another node runs.
CREATE FUNCTION agent_may_deploy(job uuid, data jsonb) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT EXISTS (
        SELECT 1 FROM job_status s
        WHERE s.job_id = agent_may_deploy.job AND s.state = 'QUEUED'
          AND s.attempt::text = agent_may_deploy.data ->> 'attempt'
          AND NOT EXISTS (SELECT 1 FROM allocations a
                          WHERE a.job_id = s.job_id AND a.attempt = s.attempt))
$$;

-- A claim's learner: the claim's DEPLOYING event (appended earlier in its transaction, see
-- agent_may_deploy) places the attempt on `node` with `epoch`, and no allocation of the
-- attempt has been made before this statement (STABLE: the statement's own rows are not seen,
-- so a claim's learners all pass, and nothing can be added to an attempt once claimed).
CREATE FUNCTION agent_may_allocate(job uuid, attempt integer, node text, epoch bigint)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM events e
                   WHERE e.stream_id = 'job-' || agent_may_allocate.job
                     AND e.type = 'JobDeploying'
                     AND e.data ->> 'attempt' = agent_may_allocate.attempt::text
                     AND e.data ->> 'epoch' = agent_may_allocate.epoch::text
                     AND e.data -> 'nodes' ? agent_may_allocate.node)
       AND NOT EXISTS (SELECT 1 FROM allocations a
                       WHERE a.job_id = agent_may_allocate.job
                         AND a.attempt = agent_may_allocate.attempt)
$$;

-- A claim's GPU: the same, for a GPU its DEPLOYING event allocates.
CREATE FUNCTION agent_may_allocate_gpu(job uuid, attempt integer, gpu text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM events e
                   WHERE e.stream_id = 'job-' || agent_may_allocate_gpu.job
                     AND e.type = 'JobDeploying'
                     AND e.data ->> 'attempt' = agent_may_allocate_gpu.attempt::text
                     AND e.data -> 'gpus' ? agent_may_allocate_gpu.gpu)
       AND NOT EXISTS (SELECT 1 FROM allocations a
                       WHERE a.job_id = agent_may_allocate_gpu.job
                         AND a.attempt = agent_may_allocate_gpu.attempt)
$$;

REVOKE ALL ON FUNCTION agent_unconfined(), agent_node(), agent_live_jobs(), agent_deployments(),
    agent_inference_jobs(), agent_may_deploy(uuid, jsonb), agent_may_allocate(uuid, integer, text, bigint),
    agent_may_allocate_gpu(uuid, integer, text) FROM PUBLIC;
-- AGENT RIGHTS: the functions its policies call (they run with the agent's rights).
GRANT EXECUTE ON FUNCTION agent_unconfined(), agent_node(), agent_live_jobs(),
    agent_deployments(), agent_inference_jobs(), agent_may_deploy(uuid, jsonb),
    agent_may_allocate(uuid, integer, text, bigint), agent_may_allocate_gpu(uuid, integer, text)
    TO trainyard_agent;

-- Events: besides 0014's (its types, job and node streams), an agent appends only to its own
-- node's stream, to the streams of jobs it runs now, and a claim's DEPLOYING event. RESTRICTIVE:
-- this holds together with 0014's policy, not as an alternative to it.
CREATE POLICY events_agent_own_work ON events AS RESTRICTIVE FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR stream_id = 'node-' || (SELECT agent_node())
                OR stream_job_id(stream_id) IN (SELECT agent_live_jobs())
                OR (type = 'JobDeploying' AND agent_may_deploy(stream_job_id(stream_id), data)));

-- Every table below gets row-level security; the application keeps every row (its policy),
-- the owner is not subject to policies (no FORCE).

-- Nodes: every agent sees them all (claims place learners across nodes), and registers,
-- renews, deregisters and lists the GPUs of its own only.
ALTER TABLE nodes ENABLE ROW LEVEL SECURITY;
CREATE POLICY nodes_app ON nodes TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY nodes_agent_read ON nodes FOR SELECT TO trainyard_agent USING (true);
CREATE POLICY nodes_agent_register ON nodes FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined()) OR name = (SELECT agent_node()));
CREATE POLICY nodes_agent_lease ON nodes FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR name = (SELECT agent_node()))
    WITH CHECK ((SELECT agent_unconfined()) OR name = (SELECT agent_node()));

ALTER TABLE node_gpus ENABLE ROW LEVEL SECURITY;
CREATE POLICY node_gpus_app ON node_gpus TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY node_gpus_agent_read ON node_gpus FOR SELECT TO trainyard_agent USING (true);
CREATE POLICY node_gpus_agent_add ON node_gpus FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined()) OR node = (SELECT agent_node()));
CREATE POLICY node_gpus_agent_health ON node_gpus FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR node = (SELECT agent_node()))
    WITH CHECK ((SELECT agent_unconfined()) OR node = (SELECT agent_node()));
CREATE POLICY node_gpus_agent_forget ON node_gpus FOR DELETE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR node = (SELECT agent_node()));

-- Allocations: seen by all (claims count room and tenants' shares); made by a claim only, for
-- the nodes its DEPLOYING event names; released (and only that: the one column) by the node
-- they are on. An allocation is what gives a node a job's secrets and stream, so none can be
-- made for a job already claimed, moved to another job, or brought back once released.
REVOKE UPDATE ON allocations FROM trainyard_agent;
GRANT UPDATE (released_at) ON allocations TO trainyard_agent;
ALTER TABLE allocations ENABLE ROW LEVEL SECURITY;
CREATE POLICY allocations_app ON allocations TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY allocations_agent_read ON allocations FOR SELECT TO trainyard_agent USING (true);
CREATE POLICY allocations_agent_claim ON allocations FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined()) OR agent_may_allocate(job_id, attempt, node, epoch));
CREATE POLICY allocations_agent_release ON allocations FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined())
           OR (node = (SELECT agent_node()) AND released_at IS NULL))
    WITH CHECK ((SELECT agent_unconfined())
                OR (node = (SELECT agent_node()) AND released_at IS NOT NULL));

ALTER TABLE allocated_gpus ENABLE ROW LEVEL SECURITY;
CREATE POLICY allocated_gpus_app ON allocated_gpus TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY allocated_gpus_agent_read ON allocated_gpus FOR SELECT TO trainyard_agent
    USING (true);
CREATE POLICY allocated_gpus_agent_claim ON allocated_gpus FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR agent_may_allocate_gpu(job_id, attempt, gpu_uuid));
CREATE POLICY allocated_gpus_agent_free ON allocated_gpus FOR DELETE TO trainyard_agent
    USING ((SELECT agent_unconfined())
           OR EXISTS (SELECT 1 FROM allocations a
                      WHERE a.job_id = allocated_gpus.job_id
                        AND a.attempt = allocated_gpus.attempt
                        AND a.learner = allocated_gpus.learner
                        AND a.node = (SELECT agent_node())));

-- Secrets: only those of the jobs running on the agent's node now (read as an attempt starts).
ALTER TABLE job_secret_env ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_secret_env_app ON job_secret_env TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY job_secret_env_agent_read ON job_secret_env FOR SELECT TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR job_id IN (SELECT agent_live_jobs()));

-- Logs: an agent numbers and stores the lines of learners that ran on its node (released
-- allocations too: lines buffered when the control plane declared the node lost and released
-- them are still the attempt's, and still stored). The counters stay readable.
ALTER TABLE job_log_heads ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_log_heads_app ON job_log_heads TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY job_log_heads_agent_read ON job_log_heads FOR SELECT TO trainyard_agent
    USING (true);
CREATE POLICY job_log_heads_agent_add ON job_log_heads FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR EXISTS (SELECT 1 FROM allocations a
                           WHERE a.job_id = job_log_heads.job_id
                             AND a.node = (SELECT agent_node())));
CREATE POLICY job_log_heads_agent_take ON job_log_heads FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined())
           OR EXISTS (SELECT 1 FROM allocations a
                      WHERE a.job_id = job_log_heads.job_id AND a.node = (SELECT agent_node())))
    WITH CHECK ((SELECT agent_unconfined())
                OR EXISTS (SELECT 1 FROM allocations a
                           WHERE a.job_id = job_log_heads.job_id
                             AND a.node = (SELECT agent_node())));

ALTER TABLE job_log_series ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_log_series_app ON job_log_series TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY job_log_series_agent_read ON job_log_series FOR SELECT TO trainyard_agent
    USING (true);
CREATE POLICY job_log_series_agent_add ON job_log_series FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR EXISTS (SELECT 1 FROM allocations a
                           WHERE (a.job_id, a.attempt, a.learner)
                                 = (job_log_series.job_id, job_log_series.attempt,
                                    job_log_series.learner)
                             AND a.node = (SELECT agent_node())));
CREATE POLICY job_log_series_agent_advance ON job_log_series FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined())
           OR EXISTS (SELECT 1 FROM allocations a
                      WHERE (a.job_id, a.attempt, a.learner)
                            = (job_log_series.job_id, job_log_series.attempt,
                               job_log_series.learner)
                        AND a.node = (SELECT agent_node())))
    WITH CHECK ((SELECT agent_unconfined())
                OR EXISTS (SELECT 1 FROM allocations a
                           WHERE (a.job_id, a.attempt, a.learner)
                                 = (job_log_series.job_id, job_log_series.attempt,
                                    job_log_series.learner)
                             AND a.node = (SELECT agent_node())));

-- Lines themselves arrive by COPY, which Postgres refuses on tables with row-level security:
-- a trigger checks each statement's lines at once instead (the same rule as the series').
CREATE FUNCTION job_logs_agent_lines() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp
AS $$
BEGIN
    -- The application's sessions (and the owner's) write any job's lines.
    IF NOT pg_has_role(current_user, 'trainyard_agent', 'MEMBER') THEN
        RETURN NULL;
    END IF;
    IF agent_unconfined() THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM added l
               WHERE NOT EXISTS (SELECT 1 FROM allocations a
                                 WHERE (a.job_id, a.attempt, a.learner)
                                       = (l.job_id, l.attempt, l.learner)
                                   AND a.node = agent_node())) THEN
        RAISE EXCEPTION 'an agent stores only the lines of learners that ran on its node (%)',
            coalesce(agent_node(), 'this login is bound to no node')
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_logs_agent_lines AFTER INSERT ON job_logs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_logs_agent_lines();

-- Serving: an agent sees, claims and finishes only the tasks of deployments whose replicas run
-- on its node now, and adds only to their memo and batches. A finished step may send a
-- pipeline's task on to its next deployment, and nowhere else; its tenant, steps, input's
-- size and memo key are never the agent's to change (column grants).
REVOKE UPDATE ON serving_tasks FROM trainyard_agent;
GRANT UPDATE (state, step, deployment, input, output, error, claim, replica, claimed_at, tries,
              finished_at, step_times) ON serving_tasks TO trainyard_agent;
ALTER TABLE serving_tasks ENABLE ROW LEVEL SECURITY;
CREATE POLICY serving_tasks_app ON serving_tasks TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY serving_tasks_agent_read ON serving_tasks FOR SELECT TO trainyard_agent
    USING ((SELECT agent_unconfined())
           OR (tenant, deployment) IN (SELECT * FROM agent_deployments()));
CREATE POLICY serving_tasks_agent_run ON serving_tasks FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined())
           OR (tenant, deployment) IN (SELECT * FROM agent_deployments()))
    WITH CHECK ((SELECT agent_unconfined()) OR deployment = ANY (steps));

ALTER TABLE serving_batches ENABLE ROW LEVEL SECURITY;
CREATE POLICY serving_batches_app ON serving_batches TO trainyard_app
    USING (true) WITH CHECK (true);
CREATE POLICY serving_batches_agent_add ON serving_batches FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR (tenant, deployment) IN (SELECT * FROM agent_deployments()));

ALTER TABLE serving_memo ENABLE ROW LEVEL SECURITY;
CREATE POLICY serving_memo_app ON serving_memo TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY serving_memo_agent_add ON serving_memo FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR (tenant, deployment) IN (SELECT * FROM agent_deployments()));

-- Inference jobs: an agent claims, sees and finishes only the queries of the inference jobs its
-- node's replicas run now, and records them as its node's. The jobs' rows and who asks for
-- queries stay readable: a claim's fair time is the least of every job's taking queries now.
-- A replica restarted on another node keeps its id: its rows are found by job, not by node.
ALTER TABLE inference_jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY inference_jobs_app ON inference_jobs TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY inference_jobs_agent_read ON inference_jobs FOR SELECT TO trainyard_agent
    USING (true);
CREATE POLICY inference_jobs_agent_run ON inference_jobs FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR job_id IN (SELECT agent_inference_jobs()))
    WITH CHECK ((SELECT agent_unconfined()) OR job_id IN (SELECT agent_inference_jobs()));

ALTER TABLE inference_replicas ENABLE ROW LEVEL SECURITY;
CREATE POLICY inference_replicas_app ON inference_replicas TO trainyard_app
    USING (true) WITH CHECK (true);
CREATE POLICY inference_replicas_agent_read ON inference_replicas FOR SELECT TO trainyard_agent
    USING (true);
CREATE POLICY inference_replicas_agent_ask ON inference_replicas FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR (node = (SELECT agent_node())
                    AND job_id IN (SELECT agent_inference_jobs())));
CREATE POLICY inference_replicas_agent_seen ON inference_replicas FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR job_id IN (SELECT agent_inference_jobs()))
    WITH CHECK ((SELECT agent_unconfined())
                OR (node = (SELECT agent_node())
                    AND job_id IN (SELECT agent_inference_jobs())));

ALTER TABLE inference_queries ENABLE ROW LEVEL SECURITY;
CREATE POLICY inference_queries_app ON inference_queries TO trainyard_app
    USING (true) WITH CHECK (true);
CREATE POLICY inference_queries_agent_read ON inference_queries FOR SELECT TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR job_id IN (SELECT agent_inference_jobs()));
CREATE POLICY inference_queries_agent_claim ON inference_queries FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined())
                OR (node = (SELECT agent_node())
                    AND job_id IN (SELECT agent_inference_jobs())));
CREATE POLICY inference_queries_agent_run ON inference_queries FOR UPDATE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR job_id IN (SELECT agent_inference_jobs()))
    WITH CHECK ((SELECT agent_unconfined())
                OR (node = (SELECT agent_node())
                    AND job_id IN (SELECT agent_inference_jobs())));

-- Job folders (0031): an agent records and forgets its own node's folders only. A record is
-- what keeps a job's uid from being handed to another job while the folder exists, so another
-- node's must not be forgotten. All stay readable (a checkpoint folder on a shared volume may
-- still be another node's job's).
ALTER TABLE job_folders ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_folders_app ON job_folders TO trainyard_app USING (true) WITH CHECK (true);
CREATE POLICY job_folders_agent_read ON job_folders FOR SELECT TO trainyard_agent USING (true);
CREATE POLICY job_folders_agent_record ON job_folders FOR INSERT TO trainyard_agent
    WITH CHECK ((SELECT agent_unconfined()) OR node = (SELECT agent_node()));
CREATE POLICY job_folders_agent_forget ON job_folders FOR DELETE TO trainyard_agent
    USING ((SELECT agent_unconfined()) OR node = (SELECT agent_node()));

-- Inference jobs (controlplane/inference/): a job of its own kind (POST /v1/inference) whose
-- queries run on the replicas of a deployment it owns. Its queries are rows here, made by the
-- agents as their replicas claim them (an endless job needs nobody to feed it, so queries keep
-- flowing while no control plane runs), and shared between jobs in "fair time": a replica takes
-- its job's next query only while that job has not started more than its weight's share.

-- Which jobs are inference jobs (derived from the manifest, so a projection rebuild keeps it
-- right): they hold no node of their own, and no claim ever takes one.
ALTER TABLE job_status ADD COLUMN inference boolean GENERATED ALWAYS AS
    (coalesce(jsonb_typeof(doc -> 'manifest' -> 'inference') = 'object', false)) STORED;

CREATE TABLE inference_jobs (
    job_id      uuid PRIMARY KEY,
    tenant      text NOT NULL,
    -- The deployment whose replicas run its queries.
    deployment  text NOT NULL,
    weight      double precision NOT NULL CHECK (weight > 0),
    batch_size  integer NOT NULL CHECK (batch_size >= 1),
    -- How many queries it runs; NULL: endless, until cancelled.
    queries     bigint CHECK (queries >= 1),
    -- Where a query's items come from: {"generate": {...}} or {"items": [...]}.
    input       jsonb NOT NULL,
    -- Queries started so far: the next query's index.
    started     bigint NOT NULL DEFAULT 0,
    -- Fair time: the queries it started divided by its weight, counted from where it joined
    -- the jobs taking queries (a job that starts, or comes back, joins at the least of theirs).
    vtime       double precision NOT NULL DEFAULT 0,
    -- No more queries are claimed: it ended (completed, cancelled or failed).
    done        boolean NOT NULL DEFAULT false,
    -- Why its model could not be loaded (a replica said so): the job fails with it.
    load_error  text,
    created_at  timestamptz NOT NULL
);
CREATE INDEX inference_jobs_live ON inference_jobs (job_id) WHERE NOT done;

-- The replicas asking for a job's queries, and the node each runs on: which replicas run which
-- job (IDunno's "which VMs run which model"), and which jobs share the fair time now.
CREATE TABLE inference_replicas (
    job_id      uuid NOT NULL REFERENCES inference_jobs ON DELETE CASCADE,
    replica     uuid NOT NULL,
    node        text NOT NULL,
    seen_at     timestamptz NOT NULL,
    PRIMARY KEY (job_id, replica)
);
CREATE INDEX inference_replicas_seen ON inference_replicas (seen_at);

CREATE TABLE inference_queries (
    job_id        uuid NOT NULL REFERENCES inference_jobs ON DELETE CASCADE,
    index         bigint NOT NULL CHECK (index >= 0),
    state         text NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    -- The claim that runs it now: a fresh token each claim, so that a replica that lost it
    -- (timed out, requeued) cannot record a result (fencing).
    claim         uuid,
    replica       uuid NOT NULL,
    node          text NOT NULL,
    tries         integer NOT NULL CHECK (tries >= 1),
    -- First claimed; and claimed by the try now running, or that finished it.
    started_at    timestamptz NOT NULL,
    claimed_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    -- The model's own time in the call that finished it.
    inference_ms  double precision,
    output        jsonb,
    error         text,
    PRIMARY KEY (job_id, index)
);
-- What replicas take first: a job's queries given back by a replica that was lost.
CREATE INDEX inference_queries_queued ON inference_queries (job_id, index) WHERE state = 'queued';
-- What a replica gives back when it is gone, and what the lifecycle manager checks for hangs.
CREATE INDEX inference_queries_running ON inference_queries (replica) WHERE state = 'running';
CREATE INDEX inference_queries_claimed ON inference_queries (claimed_at) WHERE state = 'running';
-- A job's statistics over its finished queries, and its sliding window.
CREATE INDEX inference_queries_finished ON inference_queries (job_id, finished_at)
    WHERE finished_at IS NOT NULL;

GRANT SELECT, INSERT, UPDATE, DELETE ON inference_jobs, inference_replicas, inference_queries
    TO trainyard_app;
-- Agents claim queries for their replicas and record results, fenced by the claim, without
-- the control plane: a claim moves the job's count and fair time, and records who asked.
GRANT SELECT, UPDATE (started, vtime, load_error) ON inference_jobs TO trainyard_agent;
GRANT SELECT, INSERT, UPDATE ON inference_replicas TO trainyard_agent;
GRANT SELECT, INSERT, UPDATE ON inference_queries TO trainyard_agent;

-- Every figure of GET /v1/jobs/{id}/stats is computed from these rows; auditors re-derive them
-- here. Queries' outputs are left out: they are the tenant's data.
CREATE VIEW audit.inference_queries AS
SELECT q.job_id,
       j.tenant,
       q.index,
       q.state,
       q.replica,
       q.node,
       q.tries,
       q.started_at,
       q.claimed_at,
       q.finished_at,
       (extract(epoch FROM q.finished_at - q.claimed_at) * 1000)::float8 AS latency_ms,
       q.inference_ms
FROM public.inference_queries q
JOIN public.inference_jobs j USING (job_id);

COMMENT ON VIEW audit.inference_queries IS
    'Every query of every inference job, with who ran it and its times; never its output.';
COMMENT ON COLUMN audit.inference_queries.job_id IS 'The inference job.';
COMMENT ON COLUMN audit.inference_queries.tenant IS 'Whose job it is.';
COMMENT ON COLUMN audit.inference_queries.index IS 'Its place in the job (0, 1, ...): its items are index*batch_size on.';
COMMENT ON COLUMN audit.inference_queries.state IS 'queued (given back, to run again), running, succeeded or failed.';
COMMENT ON COLUMN audit.inference_queries.replica IS 'The replica job that ran it last.';
COMMENT ON COLUMN audit.inference_queries.node IS 'The node that replica runs on.';
COMMENT ON COLUMN audit.inference_queries.tries IS
    'Claims of it (more than 1: a replica was lost while it ran; its result is still recorded once).';
COMMENT ON COLUMN audit.inference_queries.started_at IS 'When a replica first took it.';
COMMENT ON COLUMN audit.inference_queries.claimed_at IS 'When the try that finished it (or runs it) took it.';
COMMENT ON COLUMN audit.inference_queries.finished_at IS 'When its result was recorded; NULL while it has not been.';
COMMENT ON COLUMN audit.inference_queries.latency_ms IS
    'From claimed_at to finished_at: the query''s time, as the job''s statistics count it.';
COMMENT ON COLUMN audit.inference_queries.inference_ms IS 'The model''s own time in that call.';

GRANT SELECT ON audit.inference_queries TO trainyard_auditor;

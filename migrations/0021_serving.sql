-- Model serving (controlplane/deployments/): deployments and pipelines are event-sourced
-- (`deployment-<tenant>.<name>`, `pipeline-<tenant>.<name>`) with these read models; tasks are
-- a queue table, claimed by node agents with FOR UPDATE SKIP LOCKED (the architecture's task
-- queue: DLHub's ZeroMQ queue), with the batches that ran them and the memoized results.

CREATE TABLE deployments (
    tenant           text NOT NULL,
    name             text NOT NULL,
    model_tenant     text NOT NULL,
    model_name       text NOT NULL,
    reference        text NOT NULL,
    version          integer NOT NULL,
    artifact_sha256  text NOT NULL,
    entry_point      text NOT NULL,
    -- The deployment's settings as created (resources, batching, memoization, timeouts).
    spec             jsonb NOT NULL,
    replicas         integer NOT NULL,
    -- The replica jobs that serve it now (started and not retired).
    replica_jobs     uuid[] NOT NULL,
    deleted          boolean NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, name)
);
-- The lifecycle manager reconciles the deployments not deleted, and those deleted that still
-- have replicas to stop.
CREATE INDEX deployments_live ON deployments (tenant, name)
    WHERE NOT deleted OR cardinality(replica_jobs) > 0;

CREATE TABLE pipelines (
    tenant      text NOT NULL,
    name        text NOT NULL,
    steps       text[] NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE serving_tasks (
    task_id       uuid PRIMARY KEY,
    tenant        text NOT NULL,
    -- The pipeline it runs, or NULL for one deployment's task.
    pipeline      text,
    -- The deployments it passes through, in order (one for a plain task), and where it is.
    steps         text[] NOT NULL CHECK (cardinality(steps) >= 1),
    step          integer NOT NULL DEFAULT 0,
    deployment    text NOT NULL,
    items         integer NOT NULL CHECK (items >= 1),
    -- The current step's input: the request's at the first step, then each step's output.
    input         jsonb NOT NULL,
    state         text NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    output        jsonb,
    error         text,
    memo          text NOT NULL CHECK (memo IN ('hit', 'miss', 'off')),
    -- sha256 of the model version and the input bytes, when the result is to be memoized.
    memo_key      bytea,
    -- The claim that runs it now: a fresh token each claim, so that a replica that lost it
    -- (timed out, requeued) cannot record a result (fencing).
    claim         uuid,
    replica       uuid,
    claimed_at    timestamptz,
    tries         integer NOT NULL DEFAULT 0,
    submitted_at  timestamptz NOT NULL,
    finished_at   timestamptz,
    -- One object per step run: deployment, replica, batch, invocation_ms, inference_ms.
    step_times    jsonb NOT NULL DEFAULT '[]'
);
-- What replicas claim: a deployment's queued tasks, oldest first.
CREATE INDEX serving_tasks_queued ON serving_tasks (tenant, deployment, submitted_at)
    WHERE state = 'queued';
-- What the lifecycle manager checks for replicas that stopped answering.
CREATE INDEX serving_tasks_running ON serving_tasks (claimed_at) WHERE state = 'running';
-- A deployment's figures over the tasks kept.
CREATE INDEX serving_tasks_deployment ON serving_tasks (tenant, deployment, submitted_at);
CREATE INDEX serving_tasks_finished ON serving_tasks (finished_at);

CREATE TABLE serving_batches (
    batch_id      uuid PRIMARY KEY,
    tenant        text NOT NULL,
    deployment    text NOT NULL,
    replica       uuid NOT NULL,
    tasks         integer NOT NULL,
    items         integer NOT NULL,
    -- Why it left: it was full (max_batch_size items), or its oldest task waited max_wait_ms.
    reason        text NOT NULL CHECK (reason IN ('full', 'timeout')),
    outcome       text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    invocation_ms double precision NOT NULL,
    inference_ms  double precision,
    at            timestamptz NOT NULL
);
CREATE INDEX serving_batches_deployment ON serving_batches (tenant, deployment, at);

CREATE TABLE serving_memo (
    tenant      text NOT NULL,
    deployment  text NOT NULL,
    key         bytea NOT NULL,
    output      jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    used_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant, deployment, key)
);
-- Eviction keeps each deployment's most recently used entries.
CREATE INDEX serving_memo_used ON serving_memo (tenant, deployment, used_at);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON deployments, pipelines TO trainyard_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON serving_tasks, serving_batches, serving_memo
    TO trainyard_app;
-- Agents claim tasks and record what their replicas answered (a replica job's manifest holds
-- all they need of its deployment): the batch, and the results to memoize.
GRANT SELECT, UPDATE ON serving_tasks TO trainyard_agent;
GRANT INSERT ON serving_batches TO trainyard_agent;
GRANT INSERT ON serving_memo TO trainyard_agent;

-- The figures a deployment shows (GET /v1/deployments/{name}/metrics) are counted from these
-- rows; auditors re-derive them here. Tasks' inputs and outputs are left out: they are the
-- tenant's data.
CREATE VIEW audit.serving_tasks AS
SELECT t.task_id,
       t.tenant,
       t.steps[1] AS deployment,
       t.pipeline,
       t.steps,
       t.state,
       t.items,
       t.memo,
       t.tries,
       t.submitted_at,
       t.finished_at,
       extract(epoch FROM t.finished_at - t.submitted_at) * 1000 AS request_ms,
       (SELECT sum((s ->> 'invocation_ms')::float8) FROM jsonb_array_elements(t.step_times) s)
           AS invocation_ms,
       (SELECT sum((s ->> 'inference_ms')::float8) FROM jsonb_array_elements(t.step_times) s)
           AS inference_ms,
       jsonb_array_length(t.step_times) AS runs
FROM public.serving_tasks t;

COMMENT ON VIEW audit.serving_tasks IS
    'Every serving task kept (24 hours after it finished): where it went, how it ended, whether '
    'the memo answered it, and its times; never its inputs or outputs.';
COMMENT ON COLUMN audit.serving_tasks.task_id IS 'The task.';
COMMENT ON COLUMN audit.serving_tasks.tenant IS 'Whose it is.';
COMMENT ON COLUMN audit.serving_tasks.deployment IS 'The deployment it was sent to (a pipeline''s first).';
COMMENT ON COLUMN audit.serving_tasks.pipeline IS 'The pipeline it runs; NULL for a deployment''s task.';
COMMENT ON COLUMN audit.serving_tasks.steps IS 'The deployments it passes through, in order.';
COMMENT ON COLUMN audit.serving_tasks.state IS 'queued, running, succeeded or failed.';
COMMENT ON COLUMN audit.serving_tasks.items IS 'Its items (a batch is counted in them).';
COMMENT ON COLUMN audit.serving_tasks.memo IS
    'hit (answered from the memo, no replica ran it), miss (run and stored) or off.';
COMMENT ON COLUMN audit.serving_tasks.tries IS
    'Claims of its current step by a replica (more than 1: a replica died or hung with it).';
COMMENT ON COLUMN audit.serving_tasks.submitted_at IS 'When it was accepted.';
COMMENT ON COLUMN audit.serving_tasks.finished_at IS 'When it finished; NULL while it has not.';
COMMENT ON COLUMN audit.serving_tasks.request_ms IS 'From its acceptance to its end (DLHub''s request time).';
COMMENT ON COLUMN audit.serving_tasks.invocation_ms IS
    'The agents'' calls of the replicas that ran it, its steps summed (DLHub''s invocation time).';
COMMENT ON COLUMN audit.serving_tasks.inference_ms IS
    'The model''s own time in those calls (DLHub''s inference time).';
COMMENT ON COLUMN audit.serving_tasks.runs IS
    'Step runs recorded: one per step of a task produced once (results are fenced by claim).';

CREATE VIEW audit.serving_batches AS
SELECT batch_id, tenant, deployment, replica, tasks, items, reason, outcome, invocation_ms,
       inference_ms, at
FROM public.serving_batches;

COMMENT ON VIEW audit.serving_batches IS
    'Every batch a replica ran whose results were recorded (kept 24 hours).';
COMMENT ON COLUMN audit.serving_batches.batch_id IS 'The batch.';
COMMENT ON COLUMN audit.serving_batches.tenant IS 'The deployment''s tenant.';
COMMENT ON COLUMN audit.serving_batches.deployment IS 'The deployment.';
COMMENT ON COLUMN audit.serving_batches.replica IS 'The replica''s job.';
COMMENT ON COLUMN audit.serving_batches.tasks IS 'Tasks whose results it recorded.';
COMMENT ON COLUMN audit.serving_batches.items IS 'Its items: never more than max_batch_size, but for one larger task.';
COMMENT ON COLUMN audit.serving_batches.reason IS
    'Why it left: full (max_batch_size items) or timeout (its oldest task waited max_wait_ms).';
COMMENT ON COLUMN audit.serving_batches.outcome IS 'succeeded, or failed (the model''s error).';
COMMENT ON COLUMN audit.serving_batches.invocation_ms IS 'The agent''s call of the replica.';
COMMENT ON COLUMN audit.serving_batches.inference_ms IS 'The model''s own time; NULL when it never ran.';
COMMENT ON COLUMN audit.serving_batches.at IS 'When its results were recorded.';

GRANT SELECT ON audit.serving_tasks, audit.serving_batches TO trainyard_auditor;
